#!/usr/bin/env bash
# A virtualenv with the GPU machine image's Python packages at its versions, where the prepared GPU runs rehearse
# on a CPU before they spend device time (bench/results/gpu-job.md and paper_gpu.md, "Rehearsed"):
#
#   bench/gpu_image_venv.sh [VENV]          # default bench/.cache/gpu-image-venv; PYTHON=python3.12 by default
#   PATH=VENV/bin:$PATH python3 bench/gpu_run.py device --bundle B --work W --out O --dry-run
#   PATH=VENV/bin:$PATH python3 bench/paper_gpu.py run --check --transfer T --work W
#
# The packages are those of bench/gpu_have.txt that the runs import (with its pins, the versions the image holds),
# installed from the package index; what pip brings beside them that the image lacks (pydantic and its own) is
# removed, so the runs must take it from their wheels as they do there. torch comes in its CUDA build, as there
# (it runs on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-bench/.cache/gpu-image-venv}
PYTHON=${PYTHON:-python3.12}
NAMES="torch transformers sentence-transformers numpy tokenizers huggingface-hub safetensors accelerate pandas pyarrow
scipy grpcio msgpack protobuf aiohttp httpx xxhash pyyaml requests click filelock packaging psutil fsspec jinja2
matplotlib tqdm nvidia-ml-py"
specs=()
for name in $NAMES; do
    line=$(grep -E "^${name}(==|$)" bench/gpu_have.txt) ||
        { echo "gpu_image_venv: $name is not in bench/gpu_have.txt" >&2; exit 2; }
    specs+=("$line")
done
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "${specs[@]}"
extra=$("$VENV/bin/python" -m pip freeze | sed 's/[=@ ].*//' | tr 'A-Z_' 'a-z-' |
        grep -vxF -f <(grep -v '^#' bench/gpu_have.txt | sed 's/==.*//' | tr 'A-Z_' 'a-z-') || true)
if [ -n "$extra" ]; then
    "$VENV/bin/python" -m pip uninstall --quiet --yes $extra
fi
versions=$("$VENV/bin/python" -c 'import torch, transformers, sentence_transformers as st
print("torch", torch.__version__, "transformers", transformers.__version__, "sentence-transformers", st.__version__)')
echo "gpu_image_venv: $VENV ($versions)${extra:+; removed, not in the image: $(echo $extra)}"
