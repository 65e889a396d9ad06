"""Adaptive N against fixed N: the nodes each sentence needs for a target factor error, and what it costs.

    python bench/adaptive.py                          # 30 STS-B test pairs, all-MiniLM-L6-v2, layer -3, tol 1e-3

1. Every unique sentence at fixed Gauss-Legendre N = 4, 8, 16, 32 (64, 128 only for sentences above the target at
   the N before): its factor error ||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)|| at each N, hence the first
   N of the doubling grid that meets --tolerance (its "needed N").
2. From those, the cost in Jacobian-vector products (one per token per node: tokens x nodes, summed over the
   sentences) of: adaptive N starting at 4, 8 or 16 (each sentence pays every N it tried: 4 + 8 + ... + needed),
   and the fixed N of equal worst-case error (the largest needed N, for every sentence).
3. Timed in the same run: the engine with the job's default (adaptive, `jobs.attribute`'s start N, tolerance and
   cap) against the same engine at that fixed N, on the same sentences in the job's CPU batches.
Writes bench/results/adaptive.md and adaptive.json (--out-stem to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from engine import stsb_test_pairs
from precision import commit

from jobs.config import DEFAULT_ADAPTIVE_TOLERANCE, DEFAULT_BATCH_SIZE_CPU
from xsbert_core import Explainer, load_model
from xsbert_core.explainer import DEFAULT_MAX_STEPS, DEFAULT_STEPS

RESULTS = ROOT / "bench" / "results"
GRID = (4, 8, 16, 32, 64, 128)


def needed_n(model, texts: list[str], layer: int, tol: float, batch: int) -> tuple[dict, dict]:
    """({text: {N: error}}, {text: tokens}) over GRID, each sentence only as far as it needs."""
    errors: dict[str, dict[int, float]] = {t: {} for t in texts}
    tokens: dict[str, int] = {}
    todo = list(texts)
    for n in GRID:
        if not todo:
            break
        fs = Explainer(model, layer=layer, steps=n).factors(todo, batch_size=batch)
        for sf in fs:
            errors[sf.text][n] = sf.error
            tokens[sf.text] = len(sf.tokens)
        todo = [sf.text for sf in fs if sf.error > tol]
        print(f"N={n}: {len(fs)} sentences, {len(todo)} above {tol:g}", flush=True)
    return errors, tokens


def policy_cost(need: dict[str, int | None], tokens: dict[str, int], start: int) -> int:
    """JVPs of adaptive doubling from `start`: each sentence pays start + 2 start + ... up to its needed N."""
    total = 0
    for t, n in need.items():
        target = n if n is not None else GRID[-1]
        k = start
        while True:
            total += tokens[t] * k
            if k >= target:
                break
            k *= 2
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layer", type=int, default=-3)
    p.add_argument("--tolerance", type=float, default=DEFAULT_ADAPTIVE_TOLERANCE)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--note", default="", help="said of the machine in the results")
    p.add_argument("--out-stem", default=str(RESULTS / "adaptive"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    texts = list(dict.fromkeys(t for pair in stsb_test_pairs(args.pairs, args.seed) for t in pair))
    tol, batch = args.tolerance, DEFAULT_BATCH_SIZE_CPU
    Explainer(model, layer=args.layer, steps=2).factors(["Warm-up sentence."])
    errors, tokens = needed_n(model, texts, args.layer, tol, batch)
    need = {t: next((n for n in GRID if n in e and e[n] <= tol), None) for t, e in errors.items()}
    worst = max((n or GRID[-1]) for n in need.values())
    hist = {str(n): sum(1 for v in need.values() if v == n) for n in GRID}
    hist[f">{GRID[-1]}"] = sum(1 for v in need.values() if v is None)
    costs = {f"adaptive from {s}": policy_cost(need, tokens, s) for s in (4, 8, 16)}
    costs[f"fixed N={worst} (equal worst-case error)"] = sum(tokens[t] * worst for t in texts)
    # 3. timed: the job's default against the fixed N of equal worst-case error, same sentences, same batches
    adaptive = Explainer(model, layer=args.layer, steps=DEFAULT_STEPS, tolerance=tol, max_steps=DEFAULT_MAX_STEPS,
                         refine="double")  # fmt: skip
    t0 = time.perf_counter()
    fa = adaptive.factors(texts, batch_size=batch)
    t_adaptive = time.perf_counter() - t0
    fixed = Explainer(model, layer=args.layer, steps=worst)
    t0 = time.perf_counter()
    ff = fixed.factors(texts, batch_size=batch)
    t_fixed = time.perf_counter() - t0
    result = {
        "model": args.model, "pairs": args.pairs, "seed": args.seed, "layer": adaptive.layer, "tolerance": tol,
        "sentences": len(texts), "tokens": sum(tokens.values()), "errors": errors, "needed_n": need,
        "needed_n_histogram": hist, "worst_needed_n": worst, "jvps": costs,
        "timed": {"adaptive": {"start": DEFAULT_STEPS, "max_steps": DEFAULT_MAX_STEPS, "seconds": t_adaptive,
                               "n_steps": [sf.n_steps for sf in fa], "max_error": max(sf.error for sf in fa),
                               "not_converged": sum(not sf.converged for sf in fa)},
                  "fixed": {"steps": fixed.steps, "seconds": t_fixed, "max_error": max(sf.error for sf in ff),
                            "mean_error": float(np.mean([sf.error for sf in ff]))}},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs" + (f" ({args.note})" if args.note else ""),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "commit": commit(),
        "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python bench/adaptive.py " + " ".join(sys.argv[1:]),
    }  # fmt: skip
    Path(args.out_stem + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out_stem + ".md").write_text(markdown(result))
    print(markdown(result))


def markdown(r: dict) -> str:
    t = r["timed"]
    base = r["jvps"][next(k for k in r["jvps"] if k.startswith("fixed"))]
    lines = [
        "# Adaptive N against fixed N (bench/adaptive.py)",
        "",
        f"{r['stamp']}, code {r['commit']}, {r['machine']}, torch {r['torch']}, {r['threads']} thread(s). "
        f"Command: `{r['command']}`",
        "",
        f"{r['sentences']} unique sentences ({r['tokens']} tokens) of {r['pairs']} STS-B test pairs (seed "
        f"{r['seed']}), {r['model']} (real weights), layer {r['layer']}, Gauss-Legendre, target factor error "
        f"{r['tolerance']:g} per sentence (||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)||).",
        "",
        "Needed N (the first of the doubling grid whose error meets the target), sentences per N:",
        "",
        "| " + " | ".join(r["needed_n_histogram"]) + " |",
        "|" + "---|" * len(r["needed_n_histogram"]),
        "| " + " | ".join(str(v) for v in r["needed_n_histogram"].values()) + " |",
        "",
        "Cost in Jacobian-vector products (tokens x nodes, summed; adaptive pays every N it tried), from the errors "
        "above:",
        "",
        "| policy | JVPs | vs the fixed N |",
        "|---|---|---|",
        *[f"| {k} | {v:,} | {v / base:.2f} |" for k, v in r["jvps"].items()],
        "",
        "Timed in the same run, same sentences in batches of the job's CPU size: adaptive from "
        f"N={t['adaptive']['start']} "
        f"(cap {t['adaptive']['max_steps']}) **{t['adaptive']['seconds']:.1f} s** (largest error "
        f"{t['adaptive']['max_error']:.2e}, {t['adaptive']['not_converged']} sentences above the target) against "
        f"fixed N={t['fixed']['steps']} **{t['fixed']['seconds']:.1f} s** (largest error "
        f"{t['fixed']['max_error']:.2e}, "
        f"mean {t['fixed']['mean_error']:.2e}): {t['adaptive']['seconds'] / t['fixed']['seconds']:.2f}x the time.",
        "",
    ]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
