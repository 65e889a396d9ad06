"""The engine on one GPU, without Ray: what full QQP's attribution costs there, and the GPU path's numerics.

A GPU benchmark that needs only torch and sentence-transformers on the GPU machine (no Ray, no model packages, no
data there): `pack` gathers what `run` measures into one small folder to copy over, so it runs in three steps:

    python bench/gpu.py pack                        # here: bench/.cache/gpu/ (below)
    python bench/gpu.py run --out bench/.cache/gpu-result.json   # there, carrying bench/.cache/gpu
    python bench/gpu.py report RESULT.json          # here: bench/results/gpu.md

    python bench/gpu.py sweep --out-stem bench/.cache/gpu-sweep   # there, one command: gpu-sweep.json and gpu-sweep.md
    python bench/gpu.py sweep --dry-run --out-stem /tmp/s   # anywhere: the same code on the CPU with a tiny model

`pack` writes all-MiniLM-L6-v2 with its real weights stored as float16 (45 MB; `run` computes in float32 from
them), all-mpnet-base-v2's folder without its weights (`run` builds random weights from its config: cost does
not depend on weight values) and the unique questions of a QQP subset file ($XSBERT_QQP).

`run` measures in one process on one GPU (the models and the timing: bench/gpu_models.py):
  numerics  MiniLM (real weights): the engine's factors on the GPU against reverse mode on the GPU (one backward
            pass per embedding dimension and node: the reference algorithm) and against the engine on the same
            machine's CPU; the completeness error of the factors; TF32 matrix products against float32
  rates     per model, at the layer and the equal-error N of a full-QQP run (mpnet: layer 8, Gauss-Legendre 24;
            MiniLM: layer 4, its counterpart in 6 layers, Gauss-Legendre 10), over random QQP questions sorted
            longest first in batches of 128 as the job's factor actors get them (Explainer.factors, what an
            actor calls), with the jvp chunk (internal_batch_size) swept; baselines timed in the same run: a
            plain `SentenceTransformer.encode` of the same questions, and a no-grad forward of the same
            B*N*S rows through the layers the engine differentiates (the floor of "N*S forwards per sentence")

`sweep` (bench/gpu_sweep.py) measures precision x jvp chunk x batch for both models at those layers and N, over the
same random QQP questions for every cell, each cell's factor error against float32's of the same questions; MiniLM's
reduced precisions on STS-B test pairs (bench/precision.py's measurement: the completeness error the CUDA default is
decided by); and the full-QQP extrapolation per model and precision at its best chunk and batch: engine time per
question x 537,933 questions plus the job's measured overhead per pair besides attribution
(JOB_OVERHEAD_MS_PER_PAIR) x 404,290 pairs, against the 1-hour goal. Without a pack (`pack`) it builds MiniLM from
its installed package and mpnet from its config. `--dry-run` runs the same code on the CPU with a tiny random BERT
in place of both models, a few questions and a small grid (tests/test_gpu_bench.py).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import os
import platform
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from gpu_models import MODELS, PACK, QQP_PAIRS, QQP_QUESTIONS, ROOT, batches_of, build, chunk, timed
from gpu_sweep import JOB_OVERHEAD_MS_PER_PAIR, sweep

from xsbert_core import Explainer, load_model
from xsbert_core.factors import DEFAULT_CHUNK_ELEMENTS, endpoints, jvp_chunks
from xsbert_core.quadrature import nodes_and_weights
from xsbert_core.reverse import sentence_factor_reverse

# A QQP subset file (GLUE's TSV layout; not in the repository): $XSBERT_QQP.
QQP = os.environ.get("XSBERT_QQP")
RESULTS = ROOT / "bench" / "results" / "gpu.md"
BATCH = 128  # (--batch) the job's sentences per factor-actor call on a GPU (jobs/config.py DEFAULT_BATCH_SIZE_GPU)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "rust_model.ot")


# --------------------------------------------------------------------------- pack (here)
def pack() -> None:
    """bench/.cache/gpu: what `run` needs, small enough to copy (MiniLM in float16, mpnet without weights)."""
    from xsbert_core import resolve_model

    PACK.mkdir(parents=True, exist_ok=True)
    minilm = load_model("sentence-transformers/all-MiniLM-L6-v2")
    shutil.rmtree(PACK / "minilm-fp16", ignore_errors=True)
    minilm.half().save(str(PACK / "minilm-fp16"))
    src = Path(resolve_model("all-mpnet-base-v2"))
    dst = PACK / "mpnet-config"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*WEIGHT_FILES, "onnx", "openvino", "*.onnx"))
    if not QQP:
        raise SystemExit("bench/gpu.py: error: pack takes the questions of a QQP subset: set $XSBERT_QQP to its file")
    with gzip.open(QQP, "rt", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    questions = sorted({r[k] for r in rows for k in ("question1", "question2") if r[k].strip()})
    with gzip.open(PACK / "qqp-questions.json.gz", "wt", encoding="utf-8") as fh:
        json.dump(questions, fh)
    size = sum(p.stat().st_size for p in PACK.rglob("*") if p.is_file())
    print(f"{PACK}: {size / 2**20:.1f} MiB ({len(questions):,} unique questions of {len(rows):,} pairs)")


# --------------------------------------------------------------------------- run (on the GPU)
def job_batches(ex: Explainer, texts: list[str]) -> list[list[str]]:
    """The texts longest first in batches of BATCH, as jobs.attribute hands a wave's sentences to its actors."""
    return batches_of(ex, texts, BATCH)


def engine_seconds(ex: Explainer, batches: list[list[str]]) -> float:
    def go():
        for b in batches:
            ex.factors(b, batch_size=BATCH)

    return timed(go)[1]


@torch.no_grad()
def forward_floor_seconds(ex: Explainer, batches: list[list[str]]) -> float:
    """No-grad forward of the rows the engine pushes tangents through: each batch's B*N interpolation points,
    each once per token position (B*N*S sequences), in the engine's chunk geometry, through the same layers."""
    alphas, _ = nodes_and_weights(ex.rule, ex.steps)
    total = 0.0
    for texts in batches:
        batch = ex.split.tokenize(texts)
        ends = endpoints(ex.split, batch)
        bsz, seq_len, _ = ends.h_x.shape
        n = len(alphas)
        a = torch.as_tensor(alphas, dtype=ends.h_x.dtype, device=ends.h_x.device)
        x = ends.h_r.repeat_interleave(n, 0) + a.repeat(bsz)[:, None, None] * ends.delta.repeat_interleave(n, 0)
        feats = {k: v.repeat_interleave(n, 0) for k, v in batch.features.items()}
        tok_chunk, row_chunk = jvp_chunks(ex.split, seq_len, ex.internal_batch_size)
        longest = max(batch.lengths)

        def go(x=x, feats=feats, tok_chunk=tok_chunk, row_chunk=row_chunk, longest=longest):
            for r0 in range(0, x.shape[0], row_chunk):
                r1 = min(r0 + row_chunk, x.shape[0])
                for s0 in range(0, longest, tok_chunk):
                    j = min(tok_chunk, longest - s0)
                    xs = x[r0:r1].repeat(j, 1, 1)
                    fs = {k: v[r0:r1].repeat(j, 1) for k, v in feats.items()}
                    ex.split.tail(xs, fs, None)

        total += timed(go)[1]
    return total


def numerics(device: str, texts: list[str]) -> dict:
    """MiniLM, real weights: GPU engine vs GPU reverse mode, vs the CPU engine, completeness, TF32 vs float32."""
    out: dict = {}
    model, layer, steps = build("minilm", device)
    rng = np.random.default_rng(1)
    sample = [texts[i] for i in rng.choice(len(texts), size=64, replace=False)]
    # 1. forward mode vs reverse mode, both on the GPU (riemann N=4 keeps reverse mode's 4 x 384 backward passes short)
    ex = Explainer(model, layer=layer, rule="riemann", steps=4)
    rows = []
    for text in sample[:3]:
        fast = ex.factors([text])[0].factor.double()
        slow = sentence_factor_reverse(ex.split, text, "riemann", 4).double()
        rows.append({"tokens": fast.shape[1], "max_abs_diff": float((fast - slow).abs().max()),
                     "max_abs_factor": float(fast.abs().max())})  # fmt: skip
    out["forward_vs_reverse_gpu"] = rows
    # 2. GPU vs CPU engine, GL N at layer L, same weights
    ex_gpu = Explainer(model, layer=layer, rule="gauss-legendre", steps=steps)
    gpu = ex_gpu.factors(sample, batch_size=BATCH)
    cpu_model, _, _ = build("minilm", "cpu")
    ex_cpu = Explainer(cpu_model, layer=layer, rule="gauss-legendre", steps=steps)
    cpu = ex_cpu.factors(sample, batch_size=BATCH)
    diffs = [float((g.factor - c.factor).abs().max()) for g, c in zip(gpu, cpu)]
    scale = max(float(c.factor.abs().max()) for c in cpu)
    out["gpu_vs_cpu"] = {"sentences": len(sample), "max_abs_diff": max(diffs), "max_abs_factor": scale,
                         "embedding_max_abs_diff": max(float((g.embedding - c.embedding).abs().max())
                                                       for g, c in zip(gpu, cpu))}  # fmt: skip
    errs = np.array([g.error for g in gpu])
    out["completeness_gpu"] = {"rule": "gauss-legendre", "steps": steps, "layer": layer,
                               "median": float(np.median(errs)), "max": float(errs.max()),
                               "cpu_median": float(np.median([c.error for c in cpu]))}  # fmt: skip
    # 3. TF32 matrix products on the GPU against float32
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        tf = ex_gpu.factors(sample, batch_size=BATCH)
        torch.backends.cuda.matmul.allow_tf32 = False
        out["tf32_vs_fp32"] = {"max_abs_diff": max(float((t.factor - g.factor).abs().max()) for t, g in zip(tf, gpu)),
                               "max_abs_factor": scale,
                               "completeness_median": float(np.median([t.error for t in tf])),
                               "completeness_max": float(max(t.error for t in tf))}  # fmt: skip
    return out


def rates(key: str, device: str, texts: list[str], budget: float, scales: list[int], tf32: bool,
          sentences: int | None = None) -> dict:
    model, layer, steps = build(key, device)
    ex = Explainer(model, layer=layer, rule="gauss-legendre", steps=steps)
    rng = np.random.default_rng(0)
    # calibration: two batches of random questions give the sample size that fills `budget` seconds
    probe = [texts[i] for i in rng.choice(len(texts), size=2 * BATCH, replace=False)]
    ex.factors(probe[:8])  # warm-up (kernels, allocator)
    if sentences:  # a fixed sample instead of the calibrated one
        n = sentences
    else:
        per_sentence = engine_seconds(ex, job_batches(ex, probe)) / len(probe)
        n = int(min(len(texts), max(2 * BATCH, budget / per_sentence)) // BATCH * BATCH)
    sample = [texts[i] for i in rng.choice(len(texts), size=n, replace=False)]
    batches = job_batches(ex, sample)
    tokens = sum(len(i) for i in ex.split.tokenizer(sample, truncation=False)["input_ids"])
    res = {"model": key, "layer": ex.layer, "n_layers": ex.split.n_layers, "rule": "gauss-legendre", "steps": steps,
           "sentences": n, "tokens": tokens, "batch": BATCH, "runs": []}  # fmt: skip
    encode = timed(lambda: model.encode(sample, batch_size=BATCH, convert_to_numpy=True))[1]
    res["encode_s"] = encode
    for s in scales:
        note = f"{s} x the CPU chunk ({DEFAULT_CHUNK_ELEMENTS * s:.3g} elements)"
        try:
            with chunk(s):
                ex_s = Explainer(model, layer=layer, rule="gauss-legendre", steps=steps)
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                sec = engine_seconds(ex_s, batches)
                peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
                floor = forward_floor_seconds(ex_s, batches)
            res["runs"].append({"chunk": s, "note": note, "engine_s": sec, "forward_floor_s": floor, "peak_gib": peak})
        except torch.cuda.OutOfMemoryError as exc:  # a chunk too large for the card: say so, go on
            res["runs"].append({"chunk": s, "note": note, "error": f"OOM: {str(exc)[:120]}"})
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        print(json.dumps({**res["runs"][-1], "model": key, "sentences": n, "tokens": tokens}), flush=True)
    ok = [r for r in res["runs"] if "engine_s" in r]
    best = min(ok, key=lambda r: r["engine_s"])
    res["best_chunk"] = best["chunk"]
    if tf32 and device == "cuda":
        with chunk(best["chunk"]):
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                res["tf32_engine_s"] = engine_seconds(ex, batches)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
    return res


def run(args) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.allow_cpu:
        raise SystemExit("bench/gpu.py run: no GPU (torch.cuda.is_available() is False); --allow-cpu for a dry run")
    with gzip.open(PACK / "qqp-questions.json.gz", "rt", encoding="utf-8") as fh:
        texts = json.load(fh)
    result: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
                    "torch": torch.__version__, "python": platform.python_version(),
                    "questions_available": len(texts), "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    t0 = time.perf_counter()
    if not args.skip_numerics:
        result["numerics"] = numerics(device, texts)
        print(json.dumps(result["numerics"]), flush=True)
    result["rates"] = []
    for key in args.models:
        result["rates"].append(rates(key, device, texts, args.budget[key], args.scales, tf32=not args.no_tf32,
                                     sentences=args.sentences))
        Path(args.out).write_text(json.dumps(result, indent=1))
    result["wall_s"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))



# --------------------------------------------------------------------------- report (here)
def numerics_lines(num: dict) -> list[str]:
    lines = ["Numerics, all-MiniLM-L6-v2 (its weights, float16-rounded in transit, run in float32):", ""]
    for row in num["forward_vs_reverse_gpu"]:
        lines.append(f"- engine vs reverse mode, both on the GPU (riemann N=4, layer 4), {row['tokens']} tokens: "
                     f"max |diff| {row['max_abs_diff']:.2e} (max |P| {row['max_abs_factor']:.3f})")  # fmt: skip
    g = num["gpu_vs_cpu"]
    lines.append(f"- engine on the GPU vs on the CPU, {g['sentences']} questions: max |diff| of the factors "
                 f"{g['max_abs_diff']:.2e} (max |P| {g['max_abs_factor']:.3f}), of the embeddings "
                 f"{g['embedding_max_abs_diff']:.2e}")  # fmt: skip
    c = num["completeness_gpu"]
    lines.append(f"- completeness error (GL N={c['steps']}, layer {c['layer']}): median {c['median']:.2e}, max "
                 f"{c['max']:.2e} on the GPU; median {c['cpu_median']:.2e} on the CPU")  # fmt: skip
    if "tf32_vs_fp32" in num:
        t = num["tf32_vs_fp32"]
        lines.append(f"- TF32 matrix products vs float32: max |diff| of the factors {t['max_abs_diff']:.2e}; "
                     f"completeness error median {t['completeness_median']:.2e}, max {t['completeness_max']:.2e}")
    return lines


def report(path: str) -> str:
    r = json.loads(Path(path).read_text())
    num = r.get("numerics", {})
    lines = [f"## One GPU, no Ray: {r['device']} (torch {r['torch']}, {r['stamp']})", ""]
    if r.get("calls"):
        lines += ["Commands (on a GPU machine, carrying bench/.cache/gpu from `python bench/gpu.py pack`):", ""]
        lines += [f"    {c}" for c in r["calls"]] + [""]
    if r.get("note"):
        lines += [f"Note: {r['note']}.", ""]
    if num:
        lines += numerics_lines(num)
    lines += ["", "Rates over random QQP questions (sorted longest first, batches of 128, as the job's actors get "
              "them); every time in one process:", ""]  # fmt: skip
    lines += ["| model | layer | N (GL) | questions | tokens/question | jvp chunk (x 2**23 elements) | engine ms/question | "
              "forward floor ms/question | engine / floor | engine / encode | GPU peak GiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    proj = []
    for m in r["rates"]:
        n = m["sentences"]
        enc = m["encode_s"] / n
        for run_ in m["runs"]:
            if "error" in run_:
                lines.append(f"| {m['model']} | {m['layer']} | {m['steps']} | {n:,} | {m['tokens'] / n:.1f} | "
                             f"{run_['chunk']}x | {run_['error'][:40]} | | | | |")  # fmt: skip
                continue
            e, f = run_["engine_s"] / n, run_["forward_floor_s"] / n
            peak = f"{run_['peak_gib']:.1f}" if run_.get("peak_gib") is not None else ""
            lines.append(f"| {m['model']} | {m['layer']} | {m['steps']} | {n:,} | {m['tokens'] / n:.1f} | "
                         f"{run_['chunk']}x | {1e3 * e:.2f} | {1e3 * f:.2f} | {e / f:.2f} | {e / enc:.0f} | {peak} |")
        best = next(x for x in m["runs"] if x.get("chunk") == m["best_chunk"])
        default = next((x for x in m["runs"] if x.get("chunk") == 1 and "engine_s" in x), None)
        proj.append((m, best, default, enc))
    lines += ["", f"Full QQP ({QQP_QUESTIONS:,} unique questions, {QQP_PAIRS:,} pairs) on this one GPU, attribution "
              "alone, at these rates:", ""]  # fmt: skip
    for m, best, default, enc in proj:
        n = m["sentences"]
        hours = QQP_QUESTIONS * best["engine_s"] / n / 3600
        text = (f"- {m['model']} (layer {m['layer']}, GL N={m['steps']}): **{hours:.2f} h** at the best chunk "
                f"({m['best_chunk']}x, 2**{int(math.log2(DEFAULT_CHUNK_ELEMENTS * m['best_chunk']))} elements)")
        if default is not None and default is not best:
            text += f"; {QQP_QUESTIONS * default['engine_s'] / n / 3600:.2f} h at the CPU chunk (2**23)"
        if "tf32_engine_s" in m:
            text += f"; {QQP_QUESTIONS * m['tf32_engine_s'] / n / 3600:.2f} h with TF32"
        text += f"; a plain encode of the questions: {QQP_QUESTIONS * enc / 60:.1f} min"
        lines.append(text)
    lines += ["", "The forward floor pushes each batch's B*N points once per token position as copies (`repeat`), where "
              "the engine's vmap batches them without: at large chunks it is no lower bound (mpnet 0.80).", ""]
    if "wall_s" in r:
        lines += [f"Whole run wall {r['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def main() -> None:
    global BATCH
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pack", help="write bench/.cache/gpu (here)")
    r = sub.add_parser("run", help="measure (on the GPU machine)")
    r.add_argument("--out", required=True)
    r.add_argument("--models", nargs="+", default=["minilm", "mpnet"], choices=sorted(MODELS))
    r.add_argument("--budget-minilm", type=float, default=15.0, help="seconds of engine time per rate run")
    r.add_argument("--budget-mpnet", type=float, default=20.0, help="seconds of engine time per rate run")
    r.add_argument("--scales", type=int, nargs="+", default=[1, 16, 128], help="jvp chunk as multiples of the default")
    r.add_argument("--no-tf32", action="store_true")
    r.add_argument("--sentences", type=int, default=None, help="a fixed number of questions instead of --budget-*")
    r.add_argument("--skip-numerics", action="store_true")
    r.add_argument("--batch", type=int, default=BATCH, help="sentences per actor call (the job's GPU default)")
    r.add_argument("--allow-cpu", action="store_true", help="dry run without a GPU (tiny budgets)")
    sw = sub.add_parser("sweep", help="precision x chunk x batch for both models + the full-QQP extrapolation (GPU)")
    sw.add_argument("--out-stem", required=True, help="writes STEM.json (as it goes) and STEM.md")
    sw.add_argument("--models", nargs="+", default=["minilm", "mpnet"], choices=sorted(MODELS))
    sw.add_argument("--precisions", nargs="+", default=["fp32", "tf32", "bf16", "fp16"],
                    choices=["fp32", "tf32", "bf16", "fp16"], help="fp32 first: the others are compared with it")
    sw.add_argument("--scales", type=int, nargs="+", default=[16, 64, 128], help="jvp chunk, multiples of 2**23")
    sw.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256], help="sentences per actor call")
    sw.add_argument("--sentences", type=int, default=256, help="random QQP questions per cell (the same in every cell)")
    sw.add_argument("--stsb-pairs", type=int, default=50, help="STS-B test pairs for MiniLM's precisions (0: skip)")
    sw.add_argument("--overhead-ms", type=float, default=JOB_OVERHEAD_MS_PER_PAIR,
                    help="the job's ms per pair besides attribution (bench/results/scale.md)")
    sw.add_argument("--dry-run", action="store_true",
                    help="on the CPU with a tiny random BERT, a few sentences and a small grid: the code path only")
    rep = sub.add_parser("report", help="write the markdown section from a run's JSON (here)")
    rep.add_argument("result")
    rep.add_argument("--results", default=str(RESULTS))
    args = p.parse_args()
    if args.cmd == "run":
        BATCH = args.batch
    if args.cmd == "pack":
        pack()
    elif args.cmd == "run":
        args.budget = {"minilm": args.budget_minilm, "mpnet": args.budget_mpnet}
        run(args)
    elif args.cmd == "sweep":
        if args.precisions[0] != "fp32":
            args.precisions = ["fp32", *[x for x in args.precisions if x != "fp32"]]
        if args.dry_run:  # the code path in seconds: few sentences, a small grid
            args.sentences = min(args.sentences, 6)
            args.scales, args.batches = args.scales[:2], args.batches[:2]
            args.stsb_pairs = min(args.stsb_pairs, 2)
        sweep(args)
    else:
        text = report(args.result)
        Path(args.results).write_text("# The engine on one GPU (bench/gpu.py)\n\n" + text)
        print(text)


if __name__ == "__main__":
    main()
