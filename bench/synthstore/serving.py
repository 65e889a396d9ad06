"""The `xsbert serve` benchmark's store (bench/serve.py): one run at full-QQP size in the layout of a real job's.

The store (default /tmp/xsbert-bench-serve; never the repository) has the layout and the schemas of
`python -m jobs.attribute` (jobs.store.SCHEMAS and parquet_options): waves of --wave-size pairs, one `pairs` and
`sentences` part per wave and one `cells` / `word_cells` part per stage-2 batch of --batch-pairs pairs, as the
404k rehearsal run of bench/scale.py wrote them (25 waves, ~1,600 cell parts). What is real and what is not:
the texts are a QQP subset's questions ($XSBERT_QQP), each with ~1/3 of its words swapped for a word drawn from the
subset's word frequencies, tokenized by a stand-in (lowercase words and punctuation, words longer than 7
characters split into a piece and a `##` piece; [CLS] and [SEP] around). One template of --wave-size such pairs
is made and every wave holds it again under its own pair ids (random, in no order across waves, as real ids are)
and its own sentence ids, so the tables have full-QQP row counts (pairs, ~2 sentences per pair where full QQP has
1.33, ~280 cells and ~190 word cells per pair as in the rehearsal store) while each text occurs once per wave
(a text search matches ~25 times as many pairs as in real data: the same scan, more rows to count). Cell values
are random (a same-token cell larger on average), the sums in `pairs` are the sums of its cells, word cells are
random values on the word grid, the top-10 lists are null and the vectors random. The pages' speed depends on
the sizes and the layout, which are those of a real store, not on the values.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.store import SCHEMAS, part_name

from . import QQP, read_qqp, table_of, write_part

_WORD_RE = re.compile(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]")


def _tokens(text: str) -> tuple[list[str], list[int | None], list[str]]:
    """The stand-in tokenizer: tokens, word ids, words."""
    tokens: list[str] = ["[CLS]"]
    ids: list[int | None] = [None]
    words: list[str] = []
    for w in _WORD_RE.findall(text.lower()):
        k = len(words)
        words.append(w)
        if len(w) > 7:
            tokens += [w[:5], "##" + w[5:]]
            ids += [k, k]
        else:
            tokens.append(w)
            ids.append(k)
    return tokens + ["[SEP]"], ids + [None], words


def _questions() -> list[tuple[str, str, int]]:
    if not QQP:
        raise SystemExit("bench/serve.py: error: the texts are a QQP subset's questions: set $XSBERT_QQP to its file")
    rows = read_qqp(QQP)
    return [(r[3], r[4], int(r[5])) for r in rows if len(r) >= 6 and r[3].strip() and r[4].strip()]


def _template(m: int, rng: np.random.Generator) -> list[dict]:
    """`m` pairs of synthetic questions: texts, tokens, word ids, words, label (the module docstring)."""
    base = _questions()
    vocab_counts: dict[str, int] = {}
    for a, b, _ in base:
        for w in (a + " " + b).split():
            vocab_counts[w] = vocab_counts.get(w, 0) + 1
    vocab = np.array(list(vocab_counts))
    weights = np.array(list(vocab_counts.values()), dtype=float)
    weights /= weights.sum()
    draws = iter(vocab[rng.choice(len(vocab), size=60 * m, p=weights)].tolist())
    coins = iter((rng.random(60 * m) < 0.33).tolist())
    out = []
    for k in range(m):
        qa, qb, label = base[k % len(base)]
        swap: dict[str, str] = {}
        sides = []
        for q in (qa, qb):
            words = []
            for w in q.split():
                if w not in swap:
                    swap[w] = next(draws) if next(coins) else w
                words.append(swap[w])
            text = " ".join(words)
            sides.append((text, hashlib.sha256(text.encode()).hexdigest()[:12], *_tokens(text)))
        out.append({"sides": sides, "label": float(label)})
    return out


def generate(store: Path, n_pairs: int, seed: int, wave_size: int, batch_pairs: int, dim: int,
             from_wave: int = 0) -> Path:
    """Write the run `store/run` (see the module docstring); returns it. Every wave holds the same questions (one
    template of --wave-size pairs) under its own sentence ids and pair ids, with its own cell values and vectors."""
    rng = np.random.default_rng(seed)
    run = store / "run"
    if run.exists() and not from_wave:
        shutil.rmtree(run)
    for t in ("pairs", "cells", "word_cells", "sentences", "quarantine"):
        (run / t).mkdir(parents=True, exist_ok=True)
        for part in (run / t).glob("part-*.parquet"):  # an interrupted generation's later waves
            if int(part.name[5:11]) >= from_wave:
                part.unlink()
    t0 = time.time()
    template = _template(min(wave_size, n_pairs), rng)
    order = rng.permutation(n_pairs)  # pair ids in no order across waves, as real ids are
    # per batch of the template: the cell grid (pair index, i, j, tokens) and the same-token mask, made once
    grids: dict[tuple[str, int], tuple] = {}

    def grid(table: str, b0: int, b1: int) -> tuple:
        key = (table, b0, b1)
        if key not in grids:
            lists = [side[2 if table == "cells" else 4] for t in template[b0:b1] for side in t["sides"]]
            la, lb = np.array([len(x) for x in lists[0::2]]), np.array([len(x) for x in lists[1::2]])
            sizes = la * lb
            pidx = np.repeat(np.arange(b1 - b0), sizes)
            within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            i, j = within // lb[pidx], within % lb[pidx]
            flat_a = pa.array([x for xs in lists[0::2] for x in xs], pa.string())
            flat_b = pa.array([x for xs in lists[1::2] for x in xs], pa.string())
            xa = flat_a.take(pa.array(np.repeat(np.cumsum(la) - la, sizes) + i))
            xb = flat_b.take(pa.array(np.repeat(np.cumsum(lb) - lb, sizes) + j))
            same = pc.equal(xa, xb).to_numpy(zero_copy_only=False)
            grids[key] = (pidx, pa.array(i, pa.int32()), pa.array(j, pa.int32()), xa, xb, same)
        return grids[key]

    n_sentences = 0
    for seq, start in enumerate(range(0, n_pairs, wave_size)):
        if seq < from_wave:
            continue
        stop = min(start + wave_size, n_pairs)
        m = stop - start
        suffix = f"{seq:04x}"
        ids = [str(x) for x in order[start:stop]]
        sums = np.zeros((m, 3))
        for b0 in range(0, m, batch_pairs):
            b1 = min(b0 + batch_pairs, m)
            for table in ("cells", "word_cells"):
                pidx, i, j, xa, xb, same = grid(table, b0, b1)
                value = rng.normal(0.0, 0.02, len(pidx))
                value[same] += rng.normal(0.08, 0.05, int(same.sum()))
                pair_id = pa.array(ids[b0:b1], pa.string()).take(pa.array(pidx))
                names = ("i", "j", "token_a", "token_b") if table == "cells" else ("u", "v", "word_a", "word_b")
                cols = {"pair_id": pair_id, **dict(zip(names, (i, j, xa, xb))), "value": pa.array(value)}
                if table == "cells":
                    for c, part in enumerate((value, np.where(value > 0, value, 0.0), np.where(value < 0, value, 0.0))):
                        sums[b0:b1, c] += np.bincount(pidx, part, minlength=b1 - b0)
                write_part(run, table, part_name(seq, start + b0), table_of(table, cols, len(pidx)))
        seen: dict[str, tuple] = {}
        for t in template[:m]:
            for text, sid, tokens, word_ids, words in t["sides"]:
                seen.setdefault(sid + suffix, (text, tokens, word_ids, words))
        n_sent = len(seen)
        n_sentences += n_sent
        vectors = rng.standard_normal(n_sent * dim, dtype=np.float32) * np.float32(0.05)
        offsets = pa.array(np.arange(n_sent + 1, dtype=np.int32) * dim)
        rows = list(seen.values())
        sentence_cols = {
            "sentence_id": pa.array(list(seen)), "text": pa.array([r[0] for r in rows]),
            "n_tokens": pa.array([len(r[1]) for r in rows], pa.int32()), "n_words": pa.array([len(r[3]) for r in rows], pa.int32()),
            "tokens": pa.array([r[1] for r in rows]), "word_ids": pa.array([r[2] for r in rows], pa.list_(pa.int32())),
            "words": pa.array([r[3] for r in rows]), "n_steps": pa.array([2] * n_sent, pa.int32()),
            "truncated": pa.array([False] * n_sent), "embedding_norm": pa.array(np.ones(n_sent)),
            "factor_error": pa.array(rng.uniform(0, 0.01, n_sent)),
            "embedding": pa.ListArray.from_arrays(offsets, pa.array(vectors)),
            "reference_embedding": pa.ListArray.from_arrays(offsets, pa.array(vectors * np.float32(0.5))),
        }  # fmt: skip
        score = np.clip(sums[:, 0] + rng.normal(0, 0.02, m), -1, 1)
        sides = [t["sides"] for t in template[:m]]
        n_tok = [(len(s[0][2]), len(s[1][2])) for s in sides]
        n_word = [(len(s[0][4]), len(s[1][4])) for s in sides]
        pair_cols = {
            "pair_id": pa.array(ids), "row": pa.array(order[start:stop].astype(np.int64)),
            "split": pa.array(["train"] * m), "label": pa.array([t["label"] for t in template[:m]]),
            "text_a": pa.array([s[0][0] for s in sides]), "text_b": pa.array([s[1][0] for s in sides]),
            "sentence_id_a": pa.array([s[0][1] + suffix for s in sides]),
            "sentence_id_b": pa.array([s[1][1] + suffix for s in sides]),
            "n_tokens_a": pa.array([a for a, _ in n_tok], pa.int32()), "n_tokens_b": pa.array([b for _, b in n_tok], pa.int32()),
            "score": pa.array(score), "attribution_sum": pa.array(sums[:, 0]), "positive_sum": pa.array(sums[:, 1]),
            "negative_sum": pa.array(sums[:, 2]), "ref_sim_a": pa.array(rng.normal(0, 0.1, m)),
            "ref_sim_b": pa.array(rng.normal(0, 0.1, m)), "ref_term": pa.array(rng.uniform(0.8, 1, m)),
            "target": pa.array(score), "completeness_error": pa.array(sums[:, 0] - score),
            "factor_error_a": pa.array(rng.uniform(0, 0.01, m)), "factor_error_b": pa.array(rng.uniform(0, 0.01, m)),
            "steps_a": pa.array([2] * m, pa.int32()), "steps_b": pa.array([2] * m, pa.int32()),
            "truncated_a": pa.array([False] * m), "truncated_b": pa.array([False] * m),
            "n_cells": pa.array([a * b for a, b in n_tok], pa.int32()),
            "n_word_cells": pa.array([a * b for a, b in n_word], pa.int32()),
        }  # fmt: skip
        for table, cols, n in (("sentences", sentence_cols, n_sent), ("pairs", pair_cols, m)):
            write_part(run, table, part_name(seq), table_of(table, cols, n))
        print(f"wave {seq}: {stop:,} pairs, {n_sentences:,} sentences, {time.time() - t0:.0f} s", flush=True)
    quarantine = [{"row": n_pairs + k, "pair_id": f"q{k}", "reason": reason, "detail": "synthetic",
                   "text_a": "x", "text_b": "", "label": "0"}
                  for k, reason in enumerate(["too_long_a"] * 10 + ["empty_text_b"] * 4)]  # fmt: skip
    write_part(run, "quarantine", part_name(0), pa.Table.from_pylist(quarantine, schema=SCHEMAS["quarantine"]))
    manifest = {"run_id": "bench-serve", "config": {"model": "synthetic (bench/serve.py)", "mode": "approx",
                "similarity": "cos", "layer": 3, "n_layers": 6, "rule": "riemann", "steps": 2,
                "dataset": {"name": "qqp", "split": "train"}},
                "settings": {"model": "synthetic (bench/serve.py)", "layer": 3, "n_layers": 6, "mode": "approx",
                             "similarity": "cos", "rule": "riemann", "steps": 2},
                "tables": {"pairs": {"path": "pairs/*.parquet", "rows": n_pairs}}}  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (store / "complete.json").write_text(json.dumps({"pairs": n_pairs, "seed": seed, "seconds": time.time() - t0}))
    return run
