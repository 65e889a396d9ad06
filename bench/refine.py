"""Adaptive N by panels against adaptive N by doubling, at the same tolerance: the work, the time and the error.

    python bench/refine.py --model DIR --layer 8 --pairs bench/results/gpu-job-cpu/mpnet/pairs.parquet

The unique questions of --pairs (a job's pairs table: text_a, text_b), or --text ones, go through the engine twice in
the same run, in the job's CPU batches, at the same start N, tolerance and cap (the job's defaults unless given):
`--refine double` (all of [0, 1] again at 2N) and `--refine panels` (xsbert_core.refine). Per question: its nodes in
all, its factor error, and the node passes it paid: doubling pays N0 + 2 N0 + ... + N = 2N - N0; panels pay every
panel computed, the final L and the L - 1 that were halved, (2L - 1) N0 (xsbert_core.refine.node_passes). JVPs are
node passes x tokens.

Equal error, not only equal tolerance: the questions that doubling took to --reference-from nodes or more are also
integrated at a fixed Gauss-Legendre --reference N, and each refinement's factor is compared with it,
||P - P_ref|| / ||P_ref|| and max |P - P_ref| / max |P_ref|.
Writes --out-stem.md and .json (default bench/results/refine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
from precision import provenance

from jobs.config import DEFAULT_ADAPTIVE_TOLERANCE, DEFAULT_BATCH_SIZE_CPU
from xsbert_core import Explainer, load_model
from xsbert_core.explainer import DEFAULT_MAX_STEPS, DEFAULT_STEPS
from xsbert_core.refine import node_passes

RESULTS = ROOT / "bench" / "results"
REFINEMENTS = ("double", "panels")


def questions(pairs: str | None, texts: list[str]) -> list[str]:
    """The unique texts of a pairs table's text_a, text_b (pair by pair), then --text ones."""
    out = []
    if pairs:
        import pyarrow.parquet as pq

        for row in pq.read_table(pairs, columns=["text_a", "text_b"]).to_pylist():
            out += [row["text_a"], row["text_b"]]
    return list(dict.fromkeys(out + texts))


def run(model, texts: list[str], layer: int, refine: str, start: int, tol: float, cap: int, batch: int) -> dict:
    ex = Explainer(model, layer=layer, steps=start, tolerance=tol, max_steps=cap, refine=refine)
    t0 = time.perf_counter()
    fs = ex.factors(texts, batch_size=batch)
    seconds = time.perf_counter() - t0
    rows = [{"text": sf.text, "tokens": len(sf.tokens), "n": sf.n_steps, "error": sf.error, "converged": sf.converged,
             "passes": node_passes(sf.n_steps, sf.panels, start),
             "panels": [[p.a, p.b] for p in sf.panels] if sf.panels else None} for sf in fs]  # fmt: skip
    return {"refine": refine, "seconds": seconds, "rows": rows, "factors": {sf.text: sf.factor for sf in fs}}


def compare(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    got, ref = got.double(), ref.double()
    return {"rel_fro": float((got - ref).norm() / ref.norm()),
            "max_cell": float((got - ref).abs().max() / ref.abs().max())}  # fmt: skip


def markdown(r: dict) -> str:
    d, p = (r["runs"][k] for k in REFINEMENTS)
    jvps = {k: sum(x["passes"] * x["tokens"] for x in r["runs"][k]["rows"]) for k in REFINEMENTS}
    npass = {k: sum(x["passes"] for x in r["runs"][k]["rows"]) for k in REFINEMENTS}
    lines = ["# Adaptive N by panels against doubling (bench/refine.py)", "",
             f"{r['stamp']}, code {r['commit']}, {r['machine']}, torch {r['torch']}. Command: `{r['command']}`", "",
             f"{r['model']}, layer {r['layer']}; {len(d['rows'])} questions; start N {r['start']}, tolerance "
             f"{r['tolerance']:g}, cap {r['cap']} nodes, batches of {r['batch']}, both refinements in this run.", "",
             "| refine | seconds | node passes | JVPs (passes x tokens) | converged | factor error mean | max |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for k, run_ in ((k, r["runs"][k]) for k in REFINEMENTS):
        errs = [x["error"] for x in run_["rows"]]
        lines.append(f"| {k} | {run_['seconds']:.1f} | {npass[k]:,} | {jvps[k]:,} | "
                     f"{sum(x['converged'] for x in run_['rows'])} of {len(errs)} | {sum(errs) / len(errs):.1e} | "
                     f"{max(errs):.1e} |")  # fmt: skip
    lines += ["", f"Doubling / panels: time {d['seconds'] / p['seconds']:.2f}x, node passes "
                  f"{npass['double'] / npass['panels']:.2f}x, JVPs {jvps['double'] / jvps['panels']:.2f}x.",
              "", "Per question, where the two differ in nodes:", "",
              "| question | tokens | doubling: N, passes, error | panels: nodes, panels, passes, error |",
              "|---|---|---|---|"]  # fmt: skip
    for x, y in zip(d["rows"], p["rows"]):
        if x["n"] != y["n"] or x["passes"] != y["passes"]:
            lines.append(f"| {x['text'][:70]} | {x['tokens']} | {x['n']}, {x['passes']}, {x['error']:.1e} | "
                         f"{y['n']}, {len(y['panels'] or [1])}, {y['passes']}, {y['error']:.1e} |")  # fmt: skip
    hist = {k: {} for k in REFINEMENTS}
    for k in REFINEMENTS:
        for x in r["runs"][k]["rows"]:
            hist[k][x["n"]] = hist[k].get(x["n"], 0) + 1
    lines += ["", "Questions by nodes in all: " + "; ".join(
        f"{k}: " + ", ".join(f"{n} ({c})" for n, c in sorted(hist[k].items())) for k in REFINEMENTS) + "."]
    if r["reference"]:
        lines += ["", f"Against a fixed Gauss-Legendre N = {r['reference_n']} (the questions doubling took to "
                      f"{r['reference_from']} nodes or more):", "",
                  "| question | doubling: N, rel. error, max cell | panels: nodes, rel. error, max cell | "
                  "reference's own factor error |", "|---|---|---|---|"]  # fmt: skip
        for x in r["reference"]:
            lines.append(f"| {x['text'][:70]} | {x['double']['n']}, {x['double']['rel_fro']:.1e}, "
                         f"{x['double']['max_cell']:.1e} | {x['panels']['n']}, {x['panels']['rel_fro']:.1e}, "
                         f"{x['panels']['max_cell']:.1e} | {x['reference_error']:.1e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a local folder or a hub name")
    p.add_argument("--layer", type=int, default=8)
    p.add_argument("--pairs", help="a pairs table (Parquet with text_a, text_b): its unique questions")
    p.add_argument("--text", action="append", default=[], help="a sentence (repeatable)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="start N (doubling) and N per panel")
    p.add_argument("--tolerance", type=float, default=DEFAULT_ADAPTIVE_TOLERANCE)
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS)
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE_CPU)
    p.add_argument("--reference", type=int, default=1024, help="fixed GL N of the reference (0: none)")
    p.add_argument("--reference-from", type=int, default=256,
                   help="compare the questions that doubling took to this many nodes or more")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--note", default="", help="said of the machine in the results")
    p.add_argument("--out-stem", default=str(RESULTS / "refine"))
    given = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(given)
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = questions(args.pairs, args.text)
    if not texts:
        p.error("no questions: give --pairs or --text")
    model = load_model(args.model)
    Explainer(model, layer=args.layer, steps=args.steps).factors(texts[:1])  # warm-up: one-time costs out of the times
    runs = {}
    for refine in REFINEMENTS:
        runs[refine] = run(model, texts, args.layer, refine, args.steps, args.tolerance, args.max_steps,
                           args.batch_size)  # fmt: skip
        print(f"{refine}: {runs[refine]['seconds']:.1f} s", flush=True)
    reference = []
    hard = [x["text"] for x in runs["double"]["rows"] if x["n"] >= args.reference_from] if args.reference else []
    for text in hard:
        ref = Explainer(model, layer=args.layer, steps=args.reference).factors([text])[0]
        row = {"text": text, "reference_error": ref.error}
        for k in REFINEMENTS:
            n = next(x["n"] for x in runs[k]["rows"] if x["text"] == text)
            row[k] = {"n": n, **compare(runs[k]["factors"][text], ref.factor)}
        reference.append(row)
        print(f"reference for {text[:50]!r}: done", flush=True)
    for k in REFINEMENTS:
        del runs[k]["factors"]
    result = {"model": args.model, "layer": args.layer, "start": args.steps, "tolerance": args.tolerance,
              "cap": args.max_steps, "batch": args.batch_size, "runs": runs, "reference": reference,
              "reference_n": args.reference, "reference_from": args.reference_from,
              **provenance("refine.py", given, args.note)}  # fmt: skip
    Path(args.out_stem + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out_stem + ".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
