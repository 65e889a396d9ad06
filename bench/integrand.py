"""Why a sentence needs many nodes: the path integrand on a fine grid, and Gauss-Legendre's factor error by N.

    python bench/integrand.py --model DIR --layer 8 --text "If a die is rolled. what is the probability ..."

Per text (approx or exact mode, as the explainer resolves it):
1. The integrand of the completeness identity, g(alpha) = d e(x(alpha)) / d alpha = sum_s J_e(x(alpha)) . Delta_s
   (one Jacobian-vector product per node with every token's Delta at once), at the midpoints of --grid equal cells of
   [0, 1]: ||g||'s largest values, its median, and the width of its tallest peak (the alphas around the maximum
   where ||g|| stays above half of it). The midpoint sum's own error ||mean g - (e(x) - e(r))|| / ||e(x) - e(r)||
   says whether the grid resolves the integrand.
2. The explainer's factor error ||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)|| at each fixed N of --steps
   (Gauss-Legendre, the job's rule).
A narrow interior peak is what adaptive N doubles for: a global rule needs enough nodes across the whole of [0, 1]
to put several inside it. Writes --out-stem.md and .json (default bench/results/integrand).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch.func import jvp

ROOT = Path(__file__).resolve().parents[1]
from precision import provenance

from xsbert_core import Explainer, load_model
from xsbert_core.factors import endpoints
from xsbert_core.tangent_rules import constant_parameters

RESULTS = ROOT / "bench" / "results"


def midpoints(grid: int) -> np.ndarray:
    """The midpoints of `grid` equal cells of [0, 1]."""
    return (np.arange(grid) + 0.5) / grid


def integrand(ex: Explainer, text: str, alphas: np.ndarray, rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(g at each alpha (len(alphas), D), e(x) - e(r)) for one text, float64."""
    batch = ex.split.tokenize([text], ex.truncation, ex.prompt, ex.exclude_prompt)
    ends = endpoints(ex.split, batch)
    delta = ends.delta
    out = []
    with constant_parameters():
        for k in range(0, len(alphas), rows):
            a = torch.as_tensor(alphas[k : k + rows], dtype=delta.dtype, device=delta.device)
            n = len(a)
            x = ends.h_r + a[:, None, None] * delta
            feats = {key: v.repeat_interleave(n, 0) for key, v in batch.features.items()}
            shift = ends.shift.repeat_interleave(n, 0) if ends.shift is not None else None

            def e_of(h, feats=feats, shift=shift):
                return ex.split.tail(h, feats, shift, batch.prompt_length)

            out.append(jvp(e_of, (x,), (delta.repeat_interleave(n, 0),))[1].detach().double().cpu().numpy())
    return np.concatenate(out), (ends.e_x - ends.e_r)[0].double().cpu().numpy()


def peak(alphas: np.ndarray, g: np.ndarray) -> dict[str, float]:
    """The tallest peak of ||g||: where, how tall against the median, its width at half its height; and g's steepest
    change, max ||g(alpha_k+1) - g(alpha_k)|| / (alpha_k+1 - alpha_k), as the length ||g||_max / that slope (the
    scale a rule's nodes must resolve: a peak can be wide at half height and still have a steep edge)."""
    norm = np.linalg.norm(g, axis=1)
    slope = np.linalg.norm(np.diff(g, axis=0), axis=1) / np.diff(alphas)
    steep = int(np.argmax(slope))
    top = int(np.argmax(norm))
    half = norm[top] / 2
    lo, hi = top, top
    while lo > 0 and norm[lo - 1] > half:
        lo -= 1
    while hi < len(norm) - 1 and norm[hi + 1] > half:
        hi += 1
    cell = 1.0 / len(alphas)
    return {"alpha": float(alphas[top]), "height": float(norm[top]), "median": float(np.median(norm)),
            "width_at_half": float((hi - lo + 1) * cell), "from": float(alphas[lo] - cell / 2),
            "to": float(alphas[hi] + cell / 2), "steepest_at": float((alphas[steep] + alphas[steep + 1]) / 2),
            "steep_length": float(norm[top] / slope[steep])}  # fmt: skip


def measure(model, text: str, layer: int, grid: int, steps: list[int]) -> dict:
    ex = Explainer(model, layer=layer)  # the path and the tail only: its rule and N are not used
    alphas = midpoints(grid)
    g, target = integrand(ex, text, alphas)
    grid_error = float(np.linalg.norm(g.mean(0) - target) / np.linalg.norm(target))
    errors = {}
    for n in steps:
        errors[str(n)] = float(Explainer(model, layer=layer, rule="gauss-legendre", steps=n).factors([text])[0].error)
    return {"text": text, "mode": ex.mode, "layer": ex.layer, "tokens": int(ex.token_counts([text])[0][0]),
            "grid": grid, "grid_error": grid_error,
            "peak": peak(alphas, g), "gl_factor_error": errors}  # fmt: skip


def markdown(r: dict) -> str:
    lines = ["# The path integrand of hard sentences (bench/integrand.py)", "",
             f"{r['stamp']}, code {r['commit']}, {r['machine']}, torch {r['torch']}. Command: `{r['command']}`", "",
             f"{r['model']}, layer {r['texts'][0]['layer'] if r['texts'] else ''}. g(alpha) = d e(x(alpha)) / d alpha "
             f"at the midpoints of {r['grid']:,} cells of [0, 1]; the peak is ||g||'s tallest, its width the span "
             "around it where ||g|| stays above half its height; the steepest change of g between grid points, as "
             "the length over which g could change by its own largest size; GL: Gauss-Legendre's factor error at a "
             "fixed N.", "",
             "| text | tokens | mode | grid error | peak at alpha | height / median | width at half | steepest at | "
             "length ||g||max / max slope | "
             + " | ".join(f"GL N={n}" for n in r["steps"]) + " |",
             "|" + "---|" * (9 + len(r["steps"]))]  # fmt: skip
    for t in r["texts"]:
        p = t["peak"]
        lines.append(f"| {t['text']} | {t['tokens']} | {t['mode']} | {t['grid_error']:.1e} | {p['alpha']:.4f} | "
                     f"{p['height'] / p['median']:.1f} | {p['width_at_half']:.4f} | {p['steepest_at']:.4f} | "
                     f"{p['steep_length']:.1e} | "
                     + " | ".join(f"{t['gl_factor_error'][str(n)]:.1e}" for n in r["steps"]) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a local folder or a hub name")
    p.add_argument("--layer", type=int, default=8)
    p.add_argument("--text", action="append", required=True, help="a sentence (repeatable)")
    p.add_argument("--grid", type=int, default=4000, help="midpoint cells of [0, 1] for g(alpha)")
    p.add_argument("--steps", default="16,32,64,128,256,512", help="the fixed Gauss-Legendre N to report")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--note", default="", help="said of the machine in the results")
    p.add_argument("--out-stem", default=str(RESULTS / "integrand"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = [int(n) for n in args.steps.split(",") if n.strip()]
    model = load_model(args.model)
    result = {"model": args.model, "grid": args.grid, "steps": steps,
              "texts": [measure(model, t, args.layer, args.grid, steps) for t in args.text],
              **provenance("integrand.py", sys.argv[1:] if argv is None else list(argv), args.note)}  # fmt: skip
    Path(args.out_stem + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out_stem + ".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
