"""What rounding all-mpnet-base-v2's weights to float16 (and back to float32) does to the shelf model.

mpnet's weights travel to a GPU machine as float16 parts (half of 438 MB); the model computed there is then the
float16-rounded one, w' = float32(float16(w)), run in float32. This measures, on the CPU, that model against the
float32 one:

- Table 1 shelf: Spearman x 100 of cosine vs gold on STS-B test (all 1,379 pairs, forward passes), both models,
  and max |cos' - cos| over the pairs;
- attribution matrices at --layer (approx mode, Gauss-Legendre N = --steps) of the first --pairs test pairs:
  max |A' - A| over cells, that over max |A|, and |sum A' - sum A|.

    nice -n 15 python bench/fp16_shelf.py --pairs 3 --layer 8 --steps 24 --out bench/results/fp16_shelf
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from xsbert_core import Explainer, load_model
from xsbert_core.metrics import spearman

MPNET = "sentence-transformers/all-mpnet-base-v2"


def round_to_float16(model: torch.nn.Module) -> int:
    """w <- float32(float16(w)) for every floating-point parameter and buffer; how many tensors changed."""
    changed = 0
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.dtype == torch.float32:
                r = t.half().float()
                changed += int(not torch.equal(r, t))
                t.copy_(r)
    return changed


def cosines(model, a: list[str], b: list[str]) -> np.ndarray:
    unique = list(dict.fromkeys(a + b))
    emb = model.encode(unique, batch_size=32, convert_to_tensor=True, show_progress_bar=False)
    index = {t: k for k, t in enumerate(unique)}
    ea, eb = emb[[index[t] for t in a]], emb[[index[t] for t in b]]
    return torch.nn.functional.cosine_similarity(ea, eb, dim=-1).double().numpy()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=MPNET)
    p.add_argument("--pairs", type=int, default=3, help="test pairs whose attribution matrices are compared")
    p.add_argument("--layer", type=int, default=8)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--limit", type=int, default=None, help="first N test pairs for Table 1 (default all)")
    p.add_argument("--out", type=Path, default=Path("bench/results/fp16_shelf"))
    args = p.parse_args(argv)
    from jobs.evaluation.inputs import stsb

    a, b, gold, _ = stsb("test")
    if args.limit:
        a, b, gold = a[: args.limit], b[: args.limit], gold[: args.limit]
    pairs = list(zip(a[: args.pairs], b[: args.pairs]))
    res: dict = {"model": args.model, "n_table1_pairs": len(gold), "layer": args.layer, "steps": args.steps,
                 "rule": "gauss-legendre", "n_attribution_pairs": len(pairs), "torch_threads": torch.get_num_threads(),
                 "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} torch threads"}  # fmt: skip
    out = {}
    for name in ("float32", "float16-rounded"):
        t0 = time.perf_counter()
        model = load_model(args.model, attn_implementation=None)
        if name != "float32":
            res["tensors_changed_by_rounding"] = round_to_float16(model)
        cos = cosines(model, a, b)
        ex = Explainer(model, layer=args.layer, steps=args.steps, rule="gauss-legendre", mode="approx")
        mats = list(ex.explain_pairs(pairs))
        out[name] = (cos, mats)
        res[f"table1_shelf_spearman_x100_{name}"] = 100 * spearman(cos, gold)
        res[f"seconds_{name}"] = time.perf_counter() - t0
        print(name, res[f"table1_shelf_spearman_x100_{name}"], f"{res[f'seconds_{name}']:.0f} s", flush=True)
    (c32, m32), (c16, m16) = out["float32"], out["float16-rounded"]
    res["max_abs_cos_difference"] = float(np.abs(c16 - c32).max())
    res["spearman_x100_difference"] = res["table1_shelf_spearman_x100_float16-rounded"] - res[
        "table1_shelf_spearman_x100_float32"]
    res["attribution"] = [
        {"pair": k, "cells": int(x.matrix.size), "max_abs_cell": float(np.abs(x.matrix).max()),
         "max_abs_cell_difference": float(np.abs(y.matrix - x.matrix).max()),
         "relative_to_max_abs_cell": float(np.abs(y.matrix - x.matrix).max() / np.abs(x.matrix).max()),
         "sum_A": x.attribution_sum, "abs_sum_A_difference": abs(y.attribution_sum - x.attribution_sum),
         "completeness_error_float32": x.error, "completeness_error_float16": y.error}
        for k, (x, y) in enumerate(zip(m32, m16))
    ]  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
