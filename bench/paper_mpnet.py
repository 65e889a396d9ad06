"""all-mpnet-base-v2 (shelf) results of the paper that need no training and no GPU.

    python bench/paper_mpnet.py fig2 --out docs/results/all-mpnet-base-v2/fig2-all-pairs.json
    python bench/paper_mpnet.py lexical --scores-only --out docs/results/all-mpnet-base-v2/lexical-5.4-scores.json
    python bench/paper_mpnet.py lexical --layer 8 --out docs/results/all-mpnet-base-v2/lexical-5.4-layer8.json

fig2     the reference similarities f(a, r_b), f(b, r_a) and reference terms f(r_a, r_b) of every STS-B test pair
         (forward passes only: e(x) and e(r) are the model's embeddings without its trailing Normalize, as in every
         attribution run; r is [CLS/<s>] PAD ... PAD [SEP/</s>] of the sentence's length, so references are
         computed once per length). No layer is involved: these are quantities of the whole model. The shares
         are those of sql/reference_terms.sql: |f(x, r)| <= 0.1 over both reference similarities of every pair,
         f(r_a, r_b) < 0.9 over the pairs.
lexical  the paper's section 5.4 example: "A puppy was born in X." vs "How many hurricanes occur in X each year?"
         for X in Auckland, Cambodia, Granville, the USA, Europe: the model's own score (cosine of its
         normalised embeddings) and the attributions at --layer (approximate mode, cos, Gauss-Legendre, N doubled
         per sentence until its factor error <= --tolerance), with the X-X word cell and the top word cells.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODEL = "sentence-transformers/all-mpnet-base-v2"
LEXICAL_A = "A puppy was born in X."
LEXICAL_B = "How many hurricanes occur in X each year?"
LEXICAL_X = ("Auckland", "Cambodia", "Granville", "the USA", "Europe")
# The paper's shelf scores (section 5.4): "> 0.3" for the first three, 0.13 and 0.19 for the last two.
LEXICAL_PAPER = {"Auckland": "> 0.3", "Cambodia": "> 0.3", "Granville": "> 0.3", "the USA": "0.13", "Europe": "0.19"}


def _embed(split, features):
    """e(x) = pool(T(x)) without Normalize: the embedding the attributions decompose (SplitModel.post)."""
    import torch

    with torch.no_grad():
        out = {"token_embeddings": split.auto_model(**features).last_hidden_state,
               "attention_mask": features["attention_mask"]}
        for module in split.post:
            out = module(out)
    return out["sentence_embedding"].double()


def fig2(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from jobs.evaluation.inputs import stsb
    from xsbert_core import load_model
    from xsbert_core.split import SplitModel

    t0 = time.perf_counter()
    model = load_model(MODEL)
    split = SplitModel(model, -1, "approx")
    texts_a, texts_b, _, ids = stsb("test")
    unique = list(dict.fromkeys(texts_a + texts_b))
    emb: dict[str, torch.Tensor] = {}
    ref_by_len: dict[int, torch.Tensor] = {}
    order = sorted(range(len(unique)), key=lambda i: len(unique[i]))
    for k in range(0, len(order), args.batch_size):
        chunk = [unique[i] for i in order[k : k + args.batch_size]]
        batch = split.tokenize(chunk, "warn")
        e = _embed(split, batch.features)
        for text, row in zip(chunk, e):
            emb[text] = row
        for b, n in enumerate(batch.lengths):
            if n not in ref_by_len:
                one = batch.select([b])
                ref_by_len[n] = _embed(split, one.reference_features())[0]
        if args.progress:
            print(f"  {min(k + args.batch_size, len(order))}/{len(order)} sentences, {time.perf_counter() - t0:.0f} s",
                  flush=True)
    lengths = {t: n for t, n in zip(unique, _lengths(split, unique))}

    def cos(u, v):
        return float(u @ v / (u.norm() * v.norm()))

    sims, terms, rows = [], [], []
    for pid, a, b in zip(ids, texts_a, texts_b):
        ea, eb, ra, rb = emb[a], emb[b], ref_by_len[lengths[a]], ref_by_len[lengths[b]]
        row = {"pair_id": pid, "ref_sim_a": cos(ea, rb), "ref_sim_b": cos(eb, ra), "ref_term": cos(ra, rb)}
        rows.append(row)
        sims += [row["ref_sim_a"], row["ref_sim_b"]]
        terms.append(row["ref_term"])
    sims_a, terms_a = np.array(sims), np.array(terms)
    near = int((np.abs(sims_a) <= 0.1).sum())
    below = int((terms_a < 0.9).sum())
    return {
        "model": MODEL, "mode": "approx (shelf)", "similarity": "cos", "layer": "none (forward quantities)",
        "subset": "STS-B test, all pairs", "pairs": len(rows), "unique_sentences": len(unique),
        "reference_lengths": len(ref_by_len),
        "ref_sim_within_0.1": near, "ref_sim_values": len(sims), "share_ref_sim_within_0.1": near / len(sims),
        "ref_term_below_0.9": below, "share_ref_term_below_0.9": below / len(terms),
        "ref_term_median": float(np.median(terms_a)), "ref_term_min": float(terms_a.min()),
        "ref_sim_median_abs": float(np.median(np.abs(sims_a))),
        "paper": {"share_ref_sim_within_0.1": 0.858, "share_ref_term_below_0.9": 0.067},
        "seconds": round(time.perf_counter() - t0, 1), "machine": platform.machine(), "torch_threads":
        torch.get_num_threads(), "rows": rows,
    }


def _lengths(split, texts: list[str]) -> list[int]:
    full = [len(ids) for ids in split.tokenizer(texts, truncation=False)["input_ids"]]
    return [min(n, split.max_seq_length) for n in full]


def lexical(args: argparse.Namespace) -> dict:
    import torch

    from xsbert_core import Explainer, load_model

    t0 = time.perf_counter()
    model = load_model(MODEL)
    ex = Explainer(model, layer=args.layer, mode="approx", similarity="cos", rule="gauss-legendre",
                   steps=args.steps, tolerance=args.tolerance, max_steps=args.max_steps)
    out = []
    for x in LEXICAL_X:
        a, b = LEXICAL_A.replace("X", x), LEXICAL_B.replace("X", x)
        enc = model.encode([a, b], convert_to_tensor=True)
        score = float(torch.nn.functional.cosine_similarity(enc[0:1], enc[1:2]))
        row = {"x": x, "a": a, "b": b, "score": score, "paper_score": LEXICAL_PAPER[x]}
        if not args.scores_only:
            res = ex.explain(a, b, words=True)
            wm = res.word_matrix
            xw = x.split()
            ua = [i for i, w in enumerate(res.words_a) if w in xw]
            ub = [j for j, w in enumerate(res.words_b) if w in xw]
            cells = sorted(((float(wm[i, j]), res.words_a[i], res.words_b[j]) for i in range(wm.shape[0])
                            for j in range(wm.shape[1])), key=lambda c: -abs(c[0]))
            row.update(
                attribution_sum=res.attribution_sum, target=res.target, error=res.error,
                steps=[res.steps_a, res.steps_b], factor_errors=[res.factor_error_a, res.factor_error_b],
                x_cell=float(sum(wm[i, j] for i in ua for j in ub)),
                x_share_of_score=float(sum(wm[i, j] for i in ua for j in ub)) / score,
                top_word_cells=[{"a": wa, "b": wb, "value": v} for v, wa, wb in cells[:5]],
                words_a=res.words_a, words_b=res.words_b, word_matrix=wm.tolist(),
            )
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("word_matrix", "words_a", "words_b")}),
              flush=True)
    settings = ({"layer": "none (scores only: the model's cosine of its normalised embeddings)"} if args.scores_only
                else {"layer": args.layer, "rule": "gauss-legendre", "steps": args.steps, "tolerance": args.tolerance,
                      "max_steps": args.max_steps})
    return {"model": MODEL, "mode": "approx (shelf)", "similarity": "cos", **settings,
            "seconds": round(time.perf_counter() - t0, 1), "pairs": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    f = sub.add_parser("fig2", help="reference similarities and terms of all STS-B test pairs")
    f.add_argument("--batch-size", type=int, default=32)
    f.add_argument("--progress", action="store_true")
    f.add_argument("--out", required=True)
    lx = sub.add_parser("lexical", help="section 5.4's place-name pairs: scores and attributions")
    lx.add_argument("--layer", type=int, default=8)
    lx.add_argument("--steps", type=int, default=16)
    lx.add_argument("--tolerance", type=float, default=1e-3)
    lx.add_argument("--max-steps", type=int, default=128)
    lx.add_argument("--scores-only", action="store_true")
    lx.add_argument("--out", required=True)
    args = p.parse_args(argv)
    result = fig2(args) if args.what == "fig2" else lexical(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "pairs")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
