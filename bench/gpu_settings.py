"""The settings that make the attribution job fast on a GPU, measured there, each against the job's own in one process.

    python bench/gpu_settings.py sweep    --model DIR --layer 8 --steps 24 --qqp-path F --out sweep.json
    python bench/gpu_settings.py adaptive --model DIR --layer 8 --qqp-path F --out adaptive.json
    python bench/gpu_settings.py memory   --model DIR --layer 4 --qqp-path F --out memory.json
    ... --dry-run   the same code on the CPU (a tiny model, a small grid): tests/test_gpu_job.py

sweep     precision (fp32, tf32, bf16, fp16) x factor batch x GPU chunk (elements of one jvp call's largest
          activation) over the questions of the first --pairs QQP pairs, longest first in batches as the job's actors
          get them, at a fixed N: seconds, sentences/s, torch.cuda's peak against xsbert_core.memory's prediction,
          and the error of each setting against fp32 at the job's batch and chunk (the first cell): max |A - A_fp32|
          over every cell of every pair / max |A_fp32|, the pairs' completeness errors |sum A - target|, the factor
          errors
adaptive  adaptive N as the job has it (from N = 16 to a factor error <= 1e-3, at most 512 nodes), by panels (the
          default, xsbert_core.refine) and by doubling, and the fixed N of equal worst-case error (the largest N
          doubling gave any sentence), same questions: seconds, nodes (sum of tokens x N), node passes (every N or
          panel a sentence paid for), the errors
memory    the factor batch as N grows: 64 questions of the median length at N = 128, 256 with a small chunk (so that
          the rows, which grow with N, dominate), three ways: the whole batch with no limit (its peak, against the
          model's prediction), planned within 60 % of that peak (xsbert_core.memory: the groups it cut, their peak),
          and unplanned under a real limit of that size (torch.cuda.set_per_process_memory_fraction on a GPU,
          xsbert_core.memory.TensorBudget on a CPU: the batches that ran out and were halved); seconds each, the same
          factors

Each writes --out after every cell, skips the cells already in it (a second start resumes; memory keeps an N whose
three ways are all there) and stops starting cells once --deadline (a Unix time) is near. A cell that fails (out of
memory, fp16's overflow, a CUDA error) is recorded with its error, and the others run.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jobs.config import DEFAULT_ADAPTIVE_TOLERANCE as TOL
from xsbert_core import Explainer, load_model
from xsbert_core.factors import chunk_elements
from xsbert_core.memory import TensorBudget, batch_bytes
from xsbert_core.refine import node_passes
from xsbert_core.settings import DEFAULT_MAX_STEPS, DEFAULT_STEPS

BATCH = 128  # the job's GPU batch (jobs/config.py DEFAULT_BATCH_SIZE_GPU)
CELL_S = 20.0  # a cell is not started with less time than this before --deadline


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def qqp_pairs(path: str, n: int) -> list[tuple[str, str]]:
    """The first n (question1, question2) of the QQP subset file."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        rows = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        out = []
        for r in rows:
            if r.get("question1", "").strip() and r.get("question2", "").strip():
                out.append((r["question1"], r["question2"]))
            if len(out) == n:
                break
    return out


def in_job_batches(ex: Explainer, texts: list[str], size: int) -> list[list[str]]:
    """The texts longest first in batches of `size`, as jobs.attribute hands a wave's sentences to its actors."""
    lengths = [len(i) for i in ex.split.tokenizer(texts, truncation=False)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: (-lengths[i], texts[i]))
    ordered = [texts[i] for i in order]
    return [ordered[k : k + size] for k in range(0, len(ordered), size)]


def run_factors(ex: Explainer, texts: list[str], batch: int) -> tuple[dict[str, Any], float, float | None]:
    """({text: SentenceFactors}, seconds, torch.cuda's peak above what was allocated before, GiB; None on a CPU)."""
    cuda = ex.split.device.type == "cuda"
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    got = {}
    for b in in_job_batches(ex, texts, batch):
        for sf in ex.factors(b, batch_size=batch):
            got[sf.text] = sf
    sync()
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - held) / 2**30 if cuda else None
    return got, seconds, peak


def pair_errors(ex: Explainer, pairs: list[tuple[str, str]], got: dict, ref: dict | None) -> dict[str, float]:
    """The pairs' completeness errors, and (given fp32's factors) max |A - A_ref| / max |A_ref| over all cells."""
    comp, diff, scale, rel = [], 0.0, 0.0, 0.0
    for a, b in pairs:
        pa = ex.pair(got[a], got[b])
        comp.append(abs(pa.error))
        if ref is not None:
            m = ex.pair(ref[a], ref[b]).matrix
            d = float(np.abs(pa.matrix - m).max())
            diff, scale = max(diff, d), max(scale, float(np.abs(m).max()))
            rel = max(rel, d / max(float(np.abs(m).max()), 1e-30))
    out = {"completeness_error_mean": float(np.mean(comp)), "completeness_error_max": float(np.max(comp))}
    if ref is not None:
        out.update(cells_max_diff_over_max_abs=diff / scale, pair_max_rel_diff=rel)
    errs = [sf.error for sf in got.values()]
    return out | {"factor_error_mean": float(np.mean(errs)), "factor_error_max": float(np.max(errs))}


class Result:
    """The JSON at --out: kept from a previous start, written again after each cell."""

    def __init__(self, path: str, head: dict[str, Any]) -> None:
        self.path = Path(path)
        old = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.data = {**head, "cells": old.get("cells", {}), "skipped": []}

    def done(self, key: str) -> bool:
        return key in self.data["cells"]

    def put(self, key: str, cell: dict[str, Any]) -> None:
        self.data["cells"][key] = cell
        print(json.dumps({"cell": key, **cell}), flush=True)
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def late(args) -> bool:
    return args.deadline is not None and time.time() > args.deadline - CELL_S


def setup(args) -> tuple[Any, str, list[tuple[str, str]], list[str]]:
    device = "cpu" if args.dry_run else ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(args.model, device=device)
    pairs = qqp_pairs(args.qqp_path, args.pairs)
    texts = sorted({t for p in pairs for t in p})
    return model, device, pairs, texts


def head(args, device: str, texts: list[str]) -> dict[str, Any]:
    return {"model": args.model, "layer": args.layer, "device": device, "pairs": args.pairs, "sentences": len(texts),
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "torch": torch.__version__,
            "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip


# --------------------------------------------------------------------------- sweep
def sweep(args) -> dict[str, Any]:
    model, device, pairs, texts = setup(args)
    default = chunk_elements(torch.device(device))
    precisions = ["fp32", "bf16"] if args.dry_run else ["fp32", "tf32", "bf16", "fp16"]
    batches = [16, 4] if args.dry_run else [BATCH, 64, 256]
    chunks = [default, default // 4] if args.dry_run else [default, default // 2, 2 * default]
    # by value: the job's batch and chunk in each precision, then batch and chunk at fp32
    cells = [(p, batches[0], chunks[0]) for p in precisions]
    cells += [("fp32", b, chunks[0]) for b in batches[1:]] + [("fp32", batches[0], c) for c in chunks[1:]]
    res = Result(args.out, {**head(args, device, texts), "steps": args.steps, "default_chunk": default})
    ref: dict | None = None
    warm = Explainer(model, layer=args.layer, rule="gauss-legendre", steps=args.steps)
    warm.factors(texts[:4])
    for prec, batch, chunk in cells:
        key = f"{prec}-b{batch}-c{chunk}"
        if ref is not None and res.done(key):
            continue
        if late(args):
            res.data["skipped"].append(key)
            continue
        ex = Explainer(model, layer=args.layer, rule="gauss-legendre", steps=args.steps, precision=prec,
                       jvp_chunk=chunk)  # fmt: skip
        ex.factors(texts[:2])  # its kernels and (bf16, fp16) its cast copy of the model
        try:
            got, seconds, peak = run_factors(ex, texts, batch)
        except torch.OutOfMemoryError as exc:
            res.put(key, {"precision": prec, "batch": batch, "chunk": chunk, "error": f"OOM: {str(exc)[:160]}"})
            continue
        except Exception as exc:  # noqa: BLE001 - a cell's own failure (fp16's NaN, a CUDA error): recorded, the rest run
            res.put(key, {"precision": prec, "batch": batch, "chunk": chunk,
                          "error": f"{type(exc).__name__}: {str(exc)[:160]}"})  # fmt: skip
            continue
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        if ref is None:
            ref = got
        s_max = max(len(sf.tokens) for sf in got.values())
        cell = {"precision": prec, "batch": batch, "chunk": chunk, "seconds": seconds,
                "sentences_per_s": len(texts) / seconds, "peak_gib": peak,
                "predicted_peak_gib": batch_bytes(ex.memory.shape, batch, args.steps, s_max, prec) / 2**30,
                **pair_errors(ex, pairs, got, None if got is ref else ref)}  # fmt: skip
        res.put(key, cell)
    return res.data


# --------------------------------------------------------------------------- adaptive
def adaptive(args) -> dict[str, Any]:
    model, device, pairs, texts = setup(args)
    res = Result(args.out, head(args, device, texts))
    start, tol, cap = (2, TOL, 16) if args.dry_run else (DEFAULT_STEPS, TOL, DEFAULT_MAX_STEPS)  # the job's defaults
    Explainer(model, layer=args.layer, rule="gauss-legendre", steps=start).factors(texts[:4])  # warm-up
    cells = res.data["cells"]
    # the fixed N of equal worst-case error: the largest N doubling gave a sentence (from a previous start's record)
    largest = max(map(int, cells["double"]["steps_hist"])) if "double" in cells else None
    for key in ("panels", "double", "fixed"):
        if res.done(key):  # a second start: kept
            continue
        if late(args) or (key == "fixed" and largest is None):
            res.data["skipped"].append(key)
            continue
        if key == "fixed":
            ex = Explainer(model, layer=args.layer, rule="gauss-legendre", steps=largest)
        else:  # adaptive N by panels (the job's default, xsbert_core.refine) or by doubling, the same start, tolerance
            ex = Explainer(model, layer=args.layer, rule="gauss-legendre", steps=start, tolerance=tol, max_steps=cap,
                           refine=key)  # fmt: skip
        got, seconds, peak = run_factors(ex, texts, BATCH)
        steps = [sf.n_steps for sf in got.values()]
        if key == "double":
            largest = max(steps)
        res.put(key, {"steps_start": start if key != "fixed" else steps[0], "tolerance": tol if key != "fixed"
                      else None, "seconds": seconds, "sentences_per_s": len(texts) / seconds, "peak_gib": peak,
                      "steps_hist": {str(n): steps.count(n) for n in sorted(set(steps))},
                      "nodes": int(sum(len(sf.tokens) * sf.n_steps for sf in got.values())),
                      "node_passes": int(sum(steps)) if key == "fixed"
                      else int(sum(node_passes(sf.n_steps, sf.panels, start) for sf in got.values())),
                      "above_tolerance": int(sum(sf.error > tol for sf in got.values())),
                      **pair_errors(ex, pairs, got, None)})  # fmt: skip
    c = res.data["cells"]
    for a, b in (("double", "panels"), ("fixed", "panels"), ("fixed", "double")):
        if a in c and b in c:
            res.data[f"{a}_over_{b}_seconds"] = c[a]["seconds"] / c[b]["seconds"]
    res.save()
    return res.data


# --------------------------------------------------------------------------- memory
@contextlib.contextmanager
def limited(device: str, limit: int | None):
    """Within: a real limit of `limit` bytes above what is allocated now (CUDA: the caching allocator's fraction;
    CPU: TensorBudget), none for None."""
    if limit is None:
        yield
    elif device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_allocated() + limit) / total))
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
    else:
        with TensorBudget(limit):
            yield


def memory(args) -> dict[str, Any]:
    model, device, _, texts = setup(args)
    chunk = 2**16 if args.dry_run else 2**24  # small, so that the rows (which grow with N), not the chunk, dominate
    probe = Explainer(model, layer=args.layer, rule="gauss-legendre", steps=2, jvp_chunk=chunk)
    lengths = {t: len(i) for t, i in zip(texts, probe.split.tokenizer(texts, truncation=False)["input_ids"])}
    batch = 8 if args.dry_run else 64
    ranked = sorted(texts, key=lambda t: (lengths[t], t))
    middle = max(0, len(ranked) // 2 - batch // 2)
    chosen = ranked[middle : middle + batch]
    s_max = max(lengths[t] for t in chosen)
    res = Result(args.out, {**head(args, device, chosen), "chunk": chunk, "batch": batch, "tokens_max": s_max})
    for n in ([4, 8] if args.dry_run else [128, 256]):
        # a second start keeps an N whose three ways are done; one missing: the three again (the budget and the
        # reference of the other two are the whole batch's)
        if all(res.done(f"N{n}-{way}") for way in ("whole", "planned", "limited")):
            continue
        if late(args):
            res.data["skipped"].append(f"N{n}")
            continue
        predicted = batch_bytes(probe.memory.shape, batch, n, s_max)
        ref: dict | None = None
        budget = None
        for way in ("whole", "planned", "limited"):  # the budget: 60 % of what the whole batch took
            ex = Explainer(model, layer=args.layer, rule="gauss-legendre", steps=n, jvp_chunk=chunk,
                           memory_budget=budget if way == "planned" else None)  # fmt: skip
            meter = TensorBudget(None) if device == "cpu" else contextlib.nullcontext()  # the GPU has its own
            with limited(device, budget if way == "limited" else None), meter:
                got, seconds, peak = run_factors(ex, chosen, batch)
            peak_bytes = int(peak * 2**30) if peak is not None else meter.peak
            ref = ref or got
            budget = budget or int(0.6 * peak_bytes)
            diff = max(float((got[t].factor - ref[t].factor).abs().max()) for t in chosen)
            res.put(f"N{n}-{way}", {"steps": n, "predicted_whole_gib": predicted / 2**30, "budget_gib": budget / 2**30,
                                    "groups": -(-batch // ex.memory.batch_size(n, s_max, batch)),
                                    "seconds": seconds, "peak_gib": peak_bytes / 2**30,
                                    "out_of_memory": ex.memory.out_of_memory,
                                    "max_abs_diff_vs_whole": diff})  # fmt: skip
            if device == "cuda":
                torch.cuda.empty_cache()
    return res.data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("sweep", "adaptive", "memory"))
    p.add_argument("--model", required=True, help="a model folder (the bundle's) or name")
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--steps", type=int, default=24, help="sweep: the fixed N")
    p.add_argument("--qqp-path", required=True, help="the QQP subset file (TSV, .gz ok)")
    p.add_argument("--pairs", type=int, default=64, help="the first QQP pairs whose questions are measured")
    p.add_argument("--out", required=True)
    p.add_argument("--deadline", type=float, default=None, help="Unix time: start no cell after it")
    p.add_argument("--dry-run", action="store_true", help="on the CPU with a small grid (tests)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    {"sweep": sweep, "adaptive": adaptive, "memory": memory}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
