"""bench/gpu.py's sweep: precision x jvp chunk x batch for both models at their layers and N over the same random QQP
questions, each cell's factor error against float32's; MiniLM's reduced precisions on STS-B test pairs; and the
full-QQP extrapolation per model and precision (the module docstring of bench/gpu.py says what and how)."""

from __future__ import annotations

import csv
import gzip
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gpu_models import MODELS, PACK, QQP_PAIRS, QQP_QUESTIONS, ROOT, batches_of, build, chunk, timed, tiny_model

from xsbert_core import Explainer
from xsbert_core.factors import DEFAULT_CHUNK_ELEMENTS

# The job's cost per pair besides attribution at full-QQP scale: 1.20 ms (bench/results/scale.md, 404,290 pairs in
# waves of 16,384, code 05d6b85, 2 CPU cores: process wall minus engine time per actor). `sweep --overhead-ms`.
JOB_OVERHEAD_MS_PER_PAIR = 1.20
GOAL_HOURS = 1.0  # the goal: both models over full QQP, end to end, within an hour on one H100-class GPU


def questions(device: str, dry_run: bool) -> list[str]:
    """The QQP questions of the pack; without one (or in a dry run) the bundled STS-B sentences."""
    if (PACK / "qqp-questions.json.gz").exists() and not dry_run:
        with gzip.open(PACK / "qqp-questions.json.gz", "rt", encoding="utf-8") as fh:
            return json.load(fh)
    with gzip.open(ROOT / "jobs" / "data" / "stsb.tsv.gz", "rt", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    return sorted({r[k] for r in rows for k in ("sentence1", "sentence2") if r[k].strip()})


def sweep_model(key: str, model, layer: int, steps: int, texts: list[str], args, device: str) -> dict:
    """Every precision x chunk x batch cell over the same questions: engine seconds, GPU peak, factor errors, and the
    factors' largest difference from float32's (the first batch size and chunk of float32, same questions)."""
    rng = np.random.default_rng(0)
    sample = [texts[i] for i in rng.choice(len(texts), size=min(args.sentences, len(texts)), replace=False)]
    ex0 = Explainer(model, layer=layer, rule="gauss-legendre", steps=steps)
    ex0.factors(sample[:4])  # warm-up
    tokens = sum(len(i) for i in ex0.split.tokenizer(sample, truncation=False)["input_ids"])
    res = {"model": key, "layer": ex0.layer, "n_layers": ex0.split.n_layers, "rule": "gauss-legendre",
           "steps": steps, "sentences": len(sample), "tokens": tokens, "cells": []}  # fmt: skip
    res["encode_s"] = timed(lambda: model.encode(sample, batch_size=max(args.batches), convert_to_numpy=True))[1]
    ref: dict[str, torch.Tensor] | None = None
    for prec in args.precisions:
        ex = Explainer(model, layer=layer, rule="gauss-legendre", steps=steps, precision=prec)
        ex.factors(sample[:4])  # warm-up: kernels, the cast copy of the model
        for batch in args.batches:
            for s in args.scales:
                cell = {"precision": prec, "batch": batch, "chunk": s,
                        "chunk_elements": DEFAULT_CHUNK_ELEMENTS * s}  # fmt: skip
                try:
                    with chunk(s):
                        if device == "cuda":
                            torch.cuda.reset_peak_memory_stats()
                        got: list = []

                        def go(ex=ex, batch=batch, got=got):
                            for b in batches_of(ex, sample, batch):
                                got.extend(ex.factors(b, batch_size=batch))

                        cell["engine_s"] = timed(go)[1]
                        cell["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
                    errs = np.array([sf.error for sf in got])
                    cell.update(factor_error_mean=float(errs.mean()), factor_error_max=float(errs.max()))
                    if ref is None:
                        ref = {sf.text: sf.factor for sf in got}
                    diff = max(float((sf.factor - ref[sf.text]).abs().max()) for sf in got)
                    cell["factor_max_rel_diff_vs_fp32"] = diff / max(float(f.abs().max()) for f in ref.values())
                except torch.cuda.OutOfMemoryError as exc:  # a cell too large for the card: say so, go on
                    cell["error"] = f"OOM: {str(exc)[:120]}"
                finally:
                    if device == "cuda":
                        torch.cuda.empty_cache()
                res["cells"].append(cell)
                print(json.dumps({"model": key, **cell}), flush=True)
    return res



def extrapolate(m: dict, overhead_ms: float) -> list[dict]:
    """Per precision, its fastest chunk x batch: full QQP's hours, engine + the job's overhead per pair."""
    rows = []
    fp32_err = None
    for prec in dict.fromkeys(c["precision"] for c in m["cells"]):
        ok = [c for c in m["cells"] if c["precision"] == prec and "engine_s" in c]
        if not ok:
            continue
        best = min(ok, key=lambda c: c["engine_s"])
        per_q = best["engine_s"] / m["sentences"]
        engine_h = QQP_QUESTIONS * per_q / 3600
        overhead_h = QQP_PAIRS * overhead_ms / 1e3 / 3600
        err = float(np.mean([c["factor_error_mean"] for c in ok]))
        fp32_err = fp32_err if fp32_err is not None else err
        rows.append({"model": m["model"], "precision": prec, "chunk": best["chunk"], "batch": best["batch"],
                     "ms_per_question": 1e3 * per_q, "engine_h": engine_h, "overhead_h": overhead_h,
                     "total_h": engine_h + overhead_h, "factor_error_mean": err,
                     "factor_error_vs_fp32": err / fp32_err if fp32_err else None})  # fmt: skip
    return rows


def sweep(args) -> dict:
    device = "cpu" if args.dry_run else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and not args.dry_run:
        raise SystemExit("bench/gpu.py sweep: no GPU (torch.cuda.is_available() is False); --dry-run for the CPU")
    if device == "cpu":
        args.precisions = [p for p in args.precisions if p != "tf32"]  # TF32 is CUDA's: on a CPU it is fp32 again
    texts = questions(device, args.dry_run)
    out: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else f"cpu ({platform.machine()})",
                 "dry_run": args.dry_run, "torch": torch.__version__, "python": platform.python_version(),
                 "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "overhead_ms_per_pair": args.overhead_ms,
                 "grid": {"precisions": args.precisions, "chunks": args.scales, "batches": args.batches},
                 "command": "python bench/gpu.py " + " ".join(sys.argv[1:]), "models": [], "qqp": []}  # fmt: skip
    t0 = time.perf_counter()
    stem = Path(args.out_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    if args.stsb_pairs:  # MiniLM's precisions on STS-B test pairs (bench/precision.py): the CUDA default's criterion
        from engine import stsb_test_pairs
        from precision import measure

        model = tiny_model(device) if args.dry_run else build("minilm", device)[0]
        layer, steps = (1, 2) if args.dry_run else MODELS["minilm"][1:]
        out["stsb"] = {"pairs": args.stsb_pairs, "layer": layer, "steps": steps,
                       **measure(model, stsb_test_pairs(args.stsb_pairs, 0), layer, steps, args.precisions, 16)}
    for key in args.models:
        if args.dry_run:
            model, layer, steps = tiny_model(device), 1, 2
        else:
            model, layer, steps = build(key, device)
        m = sweep_model(key, model, layer, steps, texts, args, device)
        out["models"].append(m)
        out["qqp"] += extrapolate(m, args.overhead_ms)
        stem.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")  # the tables as they are measured
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    out["wall_s"] = time.perf_counter() - t0
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    stem.with_suffix(".md").write_text(sweep_markdown(out))
    print(sweep_markdown(out))
    return out


def sweep_markdown(r: dict) -> str:
    lines = [f"## Precision x chunk x batch sweep: {r['device']} (torch {r['torch']}, {r['stamp']})", "",
             f"Command: `{r['command']}`" + (" -- a dry run (tiny random BERT on the CPU): the code path, not a "
                                             "measurement" if r["dry_run"] else ""), ""]  # fmt: skip
    if "stsb" in r:
        st = r["stsb"]
        lines += [f"all-MiniLM-L6-v2 on {st['pairs']} STS-B test pairs (layer {st['layer']}, GL N={st['steps']}; "
                  "the criterion for the CUDA default: the fastest precision whose mean completeness error stays "
                  "within 2x float32's):", "",
                  "| precision | factor error mean | / fp32's | pair \|completeness error\| mean | / fp32's | "
                  "max \|cell diff\| / max \|A\| | engine s | speed vs fp32 |", "|---|---|---|---|---|---|---|---|"]
        for x in st["runs"]:
            lines.append(f"| {x['precision']} | {x['factor_error_mean']:.2e} | {x['factor_error_mean_vs_fp32']:.2f} | "
                         f"{x['completeness_abs_mean']:.2e} | {x['completeness_mean_vs_fp32']:.2f} | "
                         f"{x['cell_max_rel_diff']:.1e} | {x['seconds']:.1f} | {x['speed_vs_fp32']:.2f}x |")
        ok = [x for x in st["runs"] if x["completeness_mean_vs_fp32"] <= 2.0]
        pick = max(ok, key=lambda x: x["speed_vs_fp32"])["precision"] if ok else "fp32"
        lines += ["", f"By that rule: **{pick}** (speed from this table; the sweep below has the rates at scale).",
                  ""]  # fmt: skip
    lines += ["| model | layer | N (GL) | precision | batch | jvp chunk (x 2**23) | engine ms/question | "
              "GPU peak GiB | factor error mean | max | max rel. diff vs fp32 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in r["models"]:
        n = m["sentences"]
        for c in m["cells"]:
            head = f"| {m['model']} | {m['layer']} | {m['steps']} | {c['precision']} | {c['batch']} | {c['chunk']}x |"
            if "error" in c:
                lines.append(f"{head} {c['error'][:40]} | | | | |")
                continue
            peak = f"{c['peak_gib']:.1f}" if c.get("peak_gib") is not None else ""
            lines.append(f"{head} {1e3 * c['engine_s'] / n:.2f} | {peak} | {c['factor_error_mean']:.2e} | "
                         f"{c['factor_error_max']:.2e} | {c['factor_max_rel_diff_vs_fp32']:.1e} |")
    lines += ["", f"Full QQP ({QQP_QUESTIONS:,} questions, {QQP_PAIRS:,} pairs), per model and precision at its "
              f"fastest chunk and batch: engine time + the job's {r['overhead_ms_per_pair']:.2f} ms per pair besides "
              "attribution (bench/results/scale.md), against the goal of both models in "
              f"{GOAL_HOURS:g} h:", "",
              "| model | precision | chunk | batch | ms/question | engine h | job overhead h | total h | "
              "factor error / fp32's |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for q in r["qqp"]:
        lines.append(f"| {q['model']} | {q['precision']} | {q['chunk']}x | {q['batch']} | {q['ms_per_question']:.2f} | "
                     f"{q['engine_h']:.2f} | {q['overhead_h']:.2f} | **{q['total_h']:.2f}** | "
                     f"{q['factor_error_vs_fp32']:.2f} |")
    by_model: dict[str, list[dict]] = {}
    for q in r["qqp"]:
        if q["factor_error_vs_fp32"] is not None and q["factor_error_vs_fp32"] <= 2.0:
            by_model.setdefault(q["model"], []).append(q)
    if by_model:
        best = {k: min(v, key=lambda q: q["total_h"]) for k, v in by_model.items()}
        total = sum(q["total_h"] for q in best.values())
        lines += ["", "Both models at their fastest precision within 2x float32's factor error: "
                  + " + ".join(f"{k} {q['precision']} {q['total_h']:.2f} h" for k, q in best.items())
                  + f" = **{total:.2f} h** against the {GOAL_HOURS:g}-hour goal"
                  + (" (met)." if total <= GOAL_HOURS else f" ({total / GOAL_HOURS:.1f}x over).")]  # fmt: skip
    if "wall_s" in r:
        lines += ["", f"Whole sweep wall {r['wall_s']:.0f} s.", ""]
    return "\n".join(lines)
