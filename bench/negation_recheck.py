"""Fig 8's *not* attributions recomputed from token totals, to recheck a run's signs with other weights.

The total attribution of the *not* token is a row sum of the pair matrix, and a row sum needs no full matrix:

    A = P_a^T P_b / c                       (pairs.py; c = ||e(a)|| ||e(b)|| for cos)
    not(a, b) = sum_{i in not} sum_j A[i, j] = P_a[:, not] . P_b[:, all] / c
    sum A     = P_a[:, all] . P_b[:, all] / c
    P[:, m]   = sum_s m_s P[:, s] = sum_n w_n J_e(x(alpha_n)) (Delta * m)      (factors.py, by linearity)

so each side needs one JVP per node for each token set m (the not-token, all tokens), where the engine's factors
take one per token. `masked_factors` is that sum; tests/test_negation_recheck.py holds it to the engine's columns
summed over m. The script gives every negation pair's *not* attribution and completeness error at each N of
--steps, the sign at the smallest N whose |error| is below --margin x |not| (sql/negation_signs.sql's rule), and,
with --record, each value beside the one a negation_signs record stored for the same pair and N:

    python bench/negation_recheck.py --model all-mpnet-base-v2 --layer 9 --steps 32,64,128,256 --record-float16 \
        --record docs/results/all-mpnet-base-v2/negation-layer9-paper.json --out docs/results/all-mpnet-base-v2/negation-layer9-float32-recheck.json

--record-float16 computes everything a second time with the weights rounded to float16 and back (as jobs.bundle
--float16 carries them), which is what a record made from such a transfer must be reproduced by.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.func import jvp, vmap

from jobs.attribution.datasets import STANDALONE_NOT, negation_pairs
from jobs.attribution.inputs import BUNDLED_STSB
from xsbert_core.factors import endpoints
from xsbert_core.models import load_model
from xsbert_core.pairs import completeness_target
from xsbert_core.quadrature import nodes_and_weights
from xsbert_core.split import SplitModel

FLOAT16_MAX = 65504.0


@torch.no_grad()
def masked_factors(split: SplitModel, texts: list[str], masks: list[Tensor], rule: str, n_steps: int,
                   ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Per text t: P_t[:, m] for each row m of masks[t] (K x S_t, token weights), shape (T, D, K), with e(x), e(r).

    P[:, m] = sum_n w_n J_e(x(alpha_n)) (Delta * m), x(alpha) = h(r) + alpha Delta: the engine's factor columns
    summed over m, one JVP per node and mask. Texts are taken one at a time at their own length."""
    alphas, weights = nodes_and_weights(rule, n_steps)
    out, e_x, e_r = [], [], []
    for text, mask in zip(texts, masks):
        batch = split.tokenize([text], "error")
        ends = endpoints(split, batch)
        s = batch.lengths[0]
        if mask.shape[1] != s:
            raise ValueError(f"mask of {mask.shape[1]} tokens for a text of {s}: {text!r}")
        alpha = torch.as_tensor(alphas, dtype=ends.h_x.dtype)
        weight = torch.as_tensor(weights, dtype=ends.h_x.dtype)
        delta = ends.delta[:, :s]  # (1, S, H)
        x = ends.h_r[:, :s] + alpha[:, None, None] * delta  # (N, S, H)
        feats = {k: v[:, :s].repeat(n_steps, 1) for k, v in batch.features.items()}

        def push(t: Tensor) -> Tensor:
            return jvp(lambda h: split.tail(h, feats), (x,), (t,))[1]

        tangents = mask.to(delta.dtype)[:, None, :, None] * delta.expand(n_steps, -1, -1)[None]  # (K, N, S, H)
        jv = vmap(push)(tangents)  # (K, N, D)
        out.append((jv * weight[None, :, None]).sum(1).T)  # (D, K)
        e_x.append(ends.e_x[0])
        e_r.append(ends.e_r[0])
    return torch.stack(out), torch.stack(e_x), torch.stack(e_r)


@dataclass
class NotValue:
    """One negation pair at one N: the not-token's total attribution, sum A, its target and error."""

    pair_id: str
    steps: int
    not_attribution: float
    attribution_sum: float
    target: float
    error: float


def not_tokens(split: SplitModel, text: str) -> list[int]:
    """The token positions of `text`'s one standalone "not" (those whose characters lie inside its span)."""
    spans = [m.span() for m in STANDALONE_NOT.finditer(text)]
    if len(spans) != 1:
        raise ValueError(f"not exactly one standalone 'not': {text!r}")
    start, end = spans[0]
    batch = split.tokenize([text], "error")
    hits = [k for k, (s, e) in enumerate(batch.offsets[0]) if e > s and s >= start and e <= end]
    if not hits:
        raise ValueError(f"no token of the 'not' in {text!r}")
    return hits


def not_values(split: SplitModel, pairs: list[tuple[str, str, str]], rule: str, n_steps: int) -> list[NotValue]:
    """(pair_id, text with the not, text without it) -> NotValue at n_steps; similarity cos (both models' own)."""
    texts_a = [a for _, a, _ in pairs]
    texts_b = [b for _, _, b in pairs]
    masks_a, masks_b = [], []
    for a, b in zip(texts_a, texts_b):
        s_a = split.tokenize([a], "error").lengths[0]
        s_b = split.tokenize([b], "error").lengths[0]
        m = torch.zeros(2, s_a)
        m[0, not_tokens(split, a)] = 1.0
        m[1] = 1.0
        masks_a.append(m)
        masks_b.append(torch.ones(1, s_b))
    p_a, ex_a, er_a = masked_factors(split, texts_a, masks_a, rule, n_steps)
    p_b, ex_b, er_b = masked_factors(split, texts_b, masks_b, rule, n_steps)
    out = []
    for k, (pid, _, _) in enumerate(pairs):
        c = float(ex_a[k].double().norm() * ex_b[k].double().norm())
        full_b = p_b[k, :, 0].double()
        not_attr = float(p_a[k, :, 0].double() @ full_b) / c
        total = float(p_a[k, :, 1].double() @ full_b) / c
        target = completeness_target(ex_a[k], ex_b[k], er_a[k], er_b[k], "cos")
        out.append(NotValue(pid, n_steps, not_attr, total, target, total - target))
    return out


def rounded_float16(model):
    """A copy of `model` with every float32 weight that float16 holds rounded to float16 and back (jobs.bundle's
    --float16 transfer): w' = float32(float16(w))."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            if p.dtype == torch.float32 and float(p.abs().max()) <= FLOAT16_MAX:
                p.copy_(p.half().float())
    return twin


def chosen(values: dict[int, NotValue], margin: float) -> NotValue | None:
    """The value at the smallest N whose |error| < margin x |not| (None: none is clear)."""
    for n in sorted(values):
        v = values[n]
        if abs(v.error) < margin * abs(v.not_attribution):
            return v
    return None


def run(split: SplitModel, pairs, rule: str, steps: list[int], margin: float, label: str) -> dict[str, dict[int, NotValue]]:
    """Every pair at the smallest N of `steps` first, then at each larger N only the pairs not yet clear."""
    values: dict[str, dict[int, NotValue]] = {pid: {} for pid, _, _ in pairs}
    todo = list(pairs)
    for n in steps:
        if not todo:
            break
        t0 = time.perf_counter()
        for v in not_values(split, todo, rule, n):
            values[v.pair_id][n] = v
        todo = [p for p in todo if chosen(values[p[0]], margin) is None]
        print(f"{label}: N = {n}: {len(values) - len(todo)} of {len(values)} clear "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return values


def summary(values: dict[str, dict[int, NotValue]], margin: float) -> dict:
    rows, negative, clear = [], 0, 0
    for pid, by_n in values.items():
        c = chosen(by_n, margin)
        clear += c is not None
        negative += bool(c is not None and c.not_attribution < 0)
        rows.append({"pair_id": pid, "N": c.steps if c else None,
                     "negative": (c.not_attribution < 0) if c else None,
                     "not_attribution": {str(n): v.not_attribution for n, v in by_n.items()},
                     "completeness_error": {str(n): v.error for n, v in by_n.items()}})  # fmt: skip
    return {"pairs": len(values), "clear": clear, "negative": negative, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="all-mpnet-base-v2")
    ap.add_argument("--layer", type=int, default=9)
    ap.add_argument("--rule", default="gauss-legendre")
    ap.add_argument("--steps", default="32,64,128", help="the N tried, smallest first (comma-separated)")
    ap.add_argument("--margin", type=float, default=0.1)
    ap.add_argument("--limit", type=int, default=None, help="the first L negation pairs only")
    ap.add_argument("--record", type=Path, default=None, help="a negation_signs JSON record to set beside")
    ap.add_argument("--record-float16", action="store_true",
                    help="also compute with the weights rounded to float16 and back (as jobs.bundle --float16 carries them)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = sorted(int(s) for s in args.steps.split(","))
    df = negation_pairs(str(BUNDLED_STSB), "test")
    pairs = [(r.pair_id, r.sentence1, r.sentence2) for r in df.itertuples()][: args.limit]
    model = load_model(args.model)
    result: dict = {"model": args.model, "layer": args.layer, "rule": args.rule, "steps": steps,
                    "margin": args.margin, "torch": torch.__version__, "threads": torch.get_num_threads()}  # fmt: skip
    weights = {"float32": model}
    if args.record_float16:
        weights["float16-rounded"] = rounded_float16(model)
    for label, m in weights.items():
        t0 = time.perf_counter()
        values = run(SplitModel(m, args.layer, "approx"), pairs, args.rule, steps, args.margin, label)
        result[label] = {**summary(values, args.margin), "wall_s": time.perf_counter() - t0}
    if args.record:
        rec = {r["pair_id"]: r for r in json.loads(args.record.read_text())["rows"]}
        for label in weights:
            diffs, signs = [], 0
            for row in result[label]["rows"]:
                old = rec.get(row["pair_id"])
                if old is None:
                    continue
                for n, v in row["not_attribution"].items():
                    if n in old["not_attribution"]:
                        diffs.append(abs(v - old["not_attribution"][n]))
                if row["negative"] is not None and old.get("counted") and row["negative"] != old["negative"]:
                    signs += 1
            result[label]["against_record"] = {"max_abs_difference": max(diffs) if diffs else None,
                                               "values_compared": len(diffs), "signs_that_differ": signs}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for label in weights:
        r = result[label]
        print(f"{label}: {r['negative']} of {r['clear']} clear negative ({r['pairs']} pairs); "
              f"against the record: {r.get('against_record')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
