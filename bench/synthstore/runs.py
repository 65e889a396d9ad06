"""The SQL benchmark's store: two runs of the same synthetic pairs (jobs.attribute's layout, one part per wave), with
cell values of a model fitted to `xsbert explain`, jobs.parse's `parses` table, and the invariants the store holds
(CHECKS; bench/synthstore/__init__.py says what is real and what is modelled)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.attribution.actors import top_cell_lists
from jobs.config import RunConfig
from jobs.store import SCHEMAS, STORE_VERSION, run_id
from xsbert_core.metrics import grouped_average_ranks
from xsbert_core.syntax import ALIGNMENTS

from . import GENERATOR_VERSION, log
from . import write_part as _write_part
from .corpus import (
    MAX_SEQ_LENGTH,
    N_LAYERS,
    UPOS,
    Corpus,
    Templates,
    build_templates,
    csr_take,
    list_array,
    local_index,
    make_corpus,
    mix64,
    offsets_of,
    unit,
)

# CELL MODEL, fitted by eye to `xsbert explain` (all-MiniLM-L6-v2, approx, cos, layer 3, gauss-legendre 16)
# on 40 random pairs of the QQP subset (11,242 cells): word-token cells are lognormal with median 0.0069
# and log-sd 0.89 (q10 0.0021, q90 0.020; 0.3% negative), their scale falls like 1/sqrt(S_a S_b); cells of
# the same token (token_a = token_b) are ~3x larger (median 0.021, q90 0.17); [CLS] cells ~3e-5;
# [SEP] cells ~0.0025 (16% of special cells negative); |completeness error| ~2e-4; factor error ~1e-4;
# ref_sim_a/b ~ N(0.013, 0.062); ref_term ~0.987 (sd 0.019). Scores: duplicates 0.79 +- 0.14,
# others 0.62 +- 0.25. Log-value = pair level + token importance (per token type) + row and column
# noise + cell noise (+ a per-token same-token bonus); run 2 draws each part correlated with run 1's.
CELL_MEDIAN = 0.0069
SAME_TOKEN_FACTOR = 4.0


# =========================================================================== values
@dataclass
class RunModel:
    """What differs between the two runs: per-token importance and same-token bonus, noise correlation."""

    layer: int
    importance: np.ndarray  # per token id, ~N(0, 1)
    bonus: np.ndarray  # per token id, log of the same-token factor
    rho: float  # correlation of this run's row/column/cell noise with run 1's (1 for run 1)


def run_models(n_vocab: int, seed: int) -> tuple[RunModel, RunModel]:
    rng = np.random.default_rng(seed + 1)
    imp = rng.standard_normal(n_vocab)
    bonus = np.log(SAME_TOKEN_FACTOR) + 0.8 * rng.standard_normal(n_vocab)
    imp2 = 0.8 * imp + 0.6 * rng.standard_normal(n_vocab)
    bonus2 = np.log(SAME_TOKEN_FACTOR) + 0.8 * (bonus - np.log(SAME_TOKEN_FACTOR)) + 0.48 * rng.standard_normal(n_vocab)
    return RunModel(3, imp, bonus, 1.0), RunModel(5, imp2, bonus2, 0.6)


def cell_values(
    rng: np.random.Generator,
    m: RunModel,
    base: dict[str, np.ndarray],
    pidx: np.ndarray,
    i: np.ndarray,
    j: np.ndarray,
    tok_a: np.ndarray,
    tok_b: np.ndarray,
    special: np.ndarray,
    same: np.ndarray,
) -> np.ndarray:
    """A[i, j] of the cells of a wave (CELL MODEL); `base` holds run 1's noise, shared by run 2 via rho."""
    mix = np.sqrt(max(0.0, 1.0 - m.rho**2))

    def noise(name: str, n: int) -> np.ndarray:
        z = base[name] if name in base else base.setdefault(name, rng.standard_normal(n))
        return z if m.rho == 1.0 else m.rho * z + mix * rng.standard_normal(n)

    row = noise("row", base["n_rows"])[base["row_off"][pidx] + i]
    col = noise("col", base["n_cols"])[base["col_off"][pidx] + j]
    log_v = (base["level"][pidx] + 0.45 * (m.importance[tok_a] + m.importance[tok_b]) + 0.35 * (row + col)
             + 0.5 * noise("cell", len(pidx)))  # fmt: skip
    log_v = np.where(same, log_v + m.bonus[tok_a] + 0.5 * noise("same", len(pidx)), log_v)
    v = np.exp(np.minimum(log_v, 0.0))  # no cell above 1 (real same-token cells: q99 0.38)
    flip = unit(mix64(base["cell_key"] ^ np.uint64(m.layer))) < 0.003
    v = np.where(flip, -0.3 * v, v)
    cls = (i == 0) | (j == 0)
    sep_v = 0.0015 * np.exp(noise("special", len(pidx)))
    sep_v = np.where(unit(mix64(base["cell_key"] ^ np.uint64(97 + m.layer))) < 0.25, -sep_v, sep_v)
    v = np.where(special, np.where(cls, 3e-5 * np.exp(0.4 * noise("cls", len(pidx))), sep_v), v)
    return v


# =========================================================================== writing the store
def run_config(layer: int, n_pairs: int, seed: int) -> dict[str, Any]:
    """The synthetic runs' config: jobs/config.py's RunConfig (the fields every run id hashes), filled as a fixed-N
    all-MiniLM-L6-v2 run of every cell would be, with the generator in place of the weights and the dataset."""
    import xsbert_core

    return RunConfig(
        store_version=STORE_VERSION,
        code_version=xsbert_core.__version__,
        model="sentence-transformers/all-MiniLM-L6-v2",
        weights_sha256="synthetic (bench/sql.py: no model was run)",
        mode="approx",
        similarity="cos",
        layer=layer,
        n_layers=N_LAYERS,
        rule="gauss-legendre",
        steps=16,
        tolerance=None,
        max_steps=256,
        truncation="quarantine",
        min_abs=0.0,
        dataset={
            "name": "bench/sql.py synthetic QQP",
            "config": {"pairs": n_pairs, "seed": seed, "generator_version": GENERATOR_VERSION},
            "split": "train",
            "columns": {"text_a": "question1", "text_b": "question2", "label": "is_duplicate", "id": "id"},
        },
    ).as_dict()

def write_part(run: Path, table: str, seq: int, data: pa.Table) -> int:
    """Part `seq` of `table` in the run (one part per wave); its rows."""
    return _write_part(run, table, f"part-{seq:06d}.parquet", data)


TABLES = tuple(dict.fromkeys([*SCHEMAS, "parses"]))  # the attribution job's tables and jobs.parse's


def sentence_tables(
    tm: Templates,
    c: Corpus,
    sents: np.ndarray,
    rng: np.random.Generator,
    dim: int,
    ref_emb: np.ndarray,
    factor_error: np.ndarray,
) -> tuple[pa.Table, pa.Table]:
    """The `sentences` and `parses` rows of the sentences `sents` (in sentence_id order)."""
    sid = c.sentence_id.take(pa.array(sents))
    order = np.asarray(pc.sort_indices(sid))
    sents, sid = sents[order], sid.take(pa.array(order))
    ti, toff = csr_take(c.t_off, sents)
    wi, woff = csr_take(c.w_off, sents)
    vocab = pa.array(tm.vocab)
    type_text = pa.array(tm.type_text)
    n = len(sents)
    n_tok = np.diff(toff).astype(np.int32)
    word_ids = pa.array(c.t_word[ti], pa.int32(), mask=c.t_word[ti] < 0)
    words = type_text.take(pa.array(c.w_type[wi]))
    emb = rng.standard_normal((n, dim), dtype=np.float32)
    norm = rng.normal(6.0, 0.6, n)
    emb *= (norm / np.linalg.norm(emb, axis=1))[:, None].astype(np.float32)
    ref = ref_emb[np.minimum(n_tok, len(ref_emb) - 1)]
    sentences = pa.table(
        {
            "sentence_id": sid,
            "text": c.text.take(pa.array(sents)),
            "n_tokens": n_tok,
            "n_words": np.diff(woff).astype(np.int32),
            "tokens": list_array(toff, vocab.take(pa.array(c.t_tok[ti]))),
            "word_ids": list_array(toff, word_ids),
            "token_start": list_array(toff, pa.array(c.t_start[ti])),
            "token_end": list_array(toff, pa.array(c.t_end[ti])),
            "words": list_array(woff, words),
            "factor_error": factor_error[sents],
            "n_steps": np.full(n, 16, np.int32),
            "truncated": np.zeros(n, bool),
            "embedding_norm": np.linalg.norm(emb.astype(np.float64), axis=1),
            "embedding": list_array(np.arange(n + 1, dtype=np.int64) * dim, pa.array(emb.ravel())),
            "reference_embedding": list_array(np.arange(n + 1, dtype=np.int64) * dim, pa.array(ref.ravel())),
        }
    )
    src = c.w_src[wi]
    upos, dep, raw = tm.q_upos[src], tm.q_deprel[src], tm.q_deprel_raw[src]
    aligned = upos >= 0
    s_of_w, u_of_w = local_index(woff)
    deprels = pa.array(tm.deprels)
    parses = pa.table(
        {
            "sentence_id": sid.take(pa.array(s_of_w)),
            "u": u_of_w.astype(np.int32),
            "word": words,
            "upos": pa.array(UPOS).take(pa.array(np.where(aligned, upos, 0).astype(np.int32), mask=~aligned)),
            "deprel": deprels.take(pa.array(np.where(aligned, dep, 0).astype(np.int32), mask=~aligned)),
            "deprel_raw": deprels.take(pa.array(np.where(aligned, raw, 0).astype(np.int32), mask=~aligned)),
            "head": pa.array(tm.q_head[src], pa.int32(), mask=tm.q_head[src] < 0),
            "aligned": aligned,
            "alignment": pa.array(ALIGNMENTS).take(pa.array(tm.q_alignment[src].astype(np.int32))),
            "parser": pa.array(["spacy"] * len(src), pa.string()),
            "parser_version": pa.array([tm.parser_version] * len(src), pa.string()),
            "parser_model": pa.array([tm.parser_model] * len(src), pa.string()),
        },
        schema=SCHEMAS["parses"],
    )
    return sentences, parses


def wave_tables(
    tm: Templates,
    c: Corpus,
    lo: int,
    hi: int,
    models: tuple[RunModel, RunModel],
    pair_params: dict[str, np.ndarray],
    rng: np.random.Generator,
) -> tuple[list[dict[str, pa.Table]], dict[str, int]]:
    """pairs, cells, word_cells of pairs [lo, hi) for each run."""
    sa, sb = c.sa[lo:hi], c.sb[lo:hi]
    n = hi - lo
    s_a, s_b = np.diff(c.t_off)[sa], np.diff(c.t_off)[sb]
    cnt = s_a * s_b
    coff = offsets_of(cnt)
    pidx, local = local_index(coff)
    sbp = s_b[pidx]
    i = local // sbp
    j = local - i * sbp
    tok_a = c.t_tok[c.t_off[sa][pidx] + i]
    tok_b = c.t_tok[c.t_off[sb][pidx] + j]
    wid_a = c.t_word[c.t_off[sa][pidx] + i]
    wid_b = c.t_word[c.t_off[sb][pidx] + j]
    special = (wid_a < 0) | (wid_b < 0)
    same = (tok_a == tok_b) & ~special
    level = np.log(CELL_MEDIAN) - 0.5 * np.log(cnt / 225.0) + 0.3 * rng.standard_normal(n)
    base: dict[str, Any] = {
        "level": level, "row_off": offsets_of(s_a)[:-1], "col_off": offsets_of(s_b)[:-1],
        "n_rows": int(s_a.sum()), "n_cols": int(s_b.sum()),
        "cell_key": mix64((c.rows[lo:hi][pidx].astype(np.uint64) << np.uint64(20)) ^ local.astype(np.uint64)),
    }  # fmt: skip
    # word cells: every (u, v) of the pair; value = mean of its tokens' cells
    n_wa, n_wb = np.diff(c.w_off)[sa], np.diff(c.w_off)[sb]
    wcnt = n_wa * n_wb
    woff = offsets_of(wcnt)
    wp, wlocal = local_index(woff)
    u = wlocal // n_wb[wp]
    v = wlocal - u * n_wb[wp]
    valid = ~special
    wkey = woff[:-1][pidx[valid]] + wid_a[valid].astype(np.int64) * n_wb[pidx[valid]] + wid_b[valid]
    ntok_w = np.diff(tm.type_tok_off)[c.w_type]
    size = ntok_w[c.w_off[sa][wp] + u] * ntok_w[c.w_off[sb][wp] + v]
    type_text = pa.array(tm.type_text)
    vocab = pa.array(tm.vocab)
    pid = c.pair_id[lo:hi]
    shared = {
        "cells": {
            "pair_id": pid.take(pa.array(pidx)), "i": i.astype(np.int32), "j": j.astype(np.int32),
            "token_a": vocab.take(pa.array(tok_a)), "token_b": vocab.take(pa.array(tok_b)),
        },
        "word_cells": {
            "pair_id": pid.take(pa.array(wp)), "u": u.astype(np.int32), "v": v.astype(np.int32),
            "word_a": type_text.take(pa.array(c.w_type[c.w_off[sa][wp] + u])),
            "word_b": type_text.take(pa.array(c.w_type[c.w_off[sb][wp] + v])),
        },
    }  # fmt: skip
    out = []
    for m in models:
        val = cell_values(rng, m, base, pidx, i, j, tok_a, tok_b, special, same)
        wval = np.bincount(wkey, weights=val[valid], minlength=int(woff[-1])) / size
        total = np.bincount(pidx, weights=val, minlength=n)
        pos = np.bincount(pidx, weights=np.maximum(val, 0), minlength=n)
        neg = np.bincount(pidx, weights=np.minimum(val, 0), minlength=n)
        err = pair_params["err"][lo:hi] * (1.0 if m.layer == 3 else 0.6)
        pairs = {
            "pair_id": pid, "row": c.rows[lo:hi], "split": pa.array(["train"] * n, pa.string()),
            "label": c.label[lo:hi],
            "text_a": c.text.take(pa.array(sa)), "text_b": c.text.take(pa.array(sb)),
            "sentence_id_a": c.sentence_id.take(pa.array(sa)), "sentence_id_b": c.sentence_id.take(pa.array(sb)),
            "n_tokens_a": s_a.astype(np.int32), "n_tokens_b": s_b.astype(np.int32),
            "score": pair_params["score"][lo:hi], "attribution_sum": total, "positive_sum": pos, "negative_sum": neg,
            "ref_sim_a": pair_params["ref_sim_a"][lo:hi], "ref_sim_b": pair_params["ref_sim_b"][lo:hi],
            "ref_term": pair_params["ref_term"][lo:hi], "target": total - err, "completeness_error": err,
            "factor_error_a": pair_params["factor_error"][sa], "factor_error_b": pair_params["factor_error"][sb],
            "steps_a": np.full(n, 16, np.int32), "steps_b": np.full(n, 16, np.int32),
            "truncated_a": np.zeros(n, bool), "truncated_b": np.zeros(n, bool),
            "n_cells": cnt.astype(np.int32), "n_word_cells": wcnt.astype(np.int32),
        }  # fmt: skip
        adj = c.adj[lo:hi]
        meta = tm.adj_meta
        for k, name in enumerate(("triplet", "kind", "template")):
            pairs[name] = pa.array([meta[x][k] if x >= 0 else None for x in adj], pa.string())
        # what stage 2 stores for agreement.sql: ranks per pair, the top-10 lists (jobs/attribution/actors.py)
        content_rank = np.full(val.size, np.nan)
        content_rank[valid] = grouped_average_ranks(val[valid], pidx[valid])
        has = np.ones(n, bool)
        for by in ("abs", "value"):
            pairs[f"top10_{by}"] = top_cell_lists(val, pidx, i, j, by, ("i", "j"), has)
            pairs[f"content_top10_{by}"] = top_cell_lists(val[valid], pidx[valid], i[valid], j[valid], by, ("i", "j"),
                                                          has)  # fmt: skip
            pairs[f"word_top10_{by}"] = top_cell_lists(wval, wp, u, v, by, ("u", "v"), has)
        out.append(
            {
                "pairs": pa.table(pairs),
                "cells": pa.table({**shared["cells"], "value": val,
                                   "value_rank": grouped_average_ranks(val, pidx).astype(np.float32),
                                   "content_rank": pa.array(content_rank.astype(np.float32),
                                                            mask=np.isnan(content_rank))}),  # fmt: skip
                "word_cells": pa.table({**shared["word_cells"], "value": wval,
                                        "value_rank": grouped_average_ranks(wval, wp).astype(np.float32)}),
            }
        )
    return out, {"cells": int(coff[-1]), "word_cells": int(woff[-1]), "same_token_cells": int(same.sum())}


def pair_parameters(c: Corpus, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per pair: score, reference terms, completeness error; per sentence: factor error (CELL MODEL)."""
    n = len(c.rows)
    score = 0.45 + 0.5 * c.overlap + 0.12 * c.label + rng.normal(0, 0.12, n)
    err = rng.standard_t(3, n) * 1.2e-4
    return {
        "score": np.clip(score, -0.2, 1.0),
        "ref_sim_a": rng.normal(0.013, 0.062, n),
        "ref_sim_b": rng.normal(0.013, 0.062, n),
        "ref_term": np.clip(1.0 - rng.exponential(0.013, n), 0.5, 1.0),
        "err": err,
        "factor_error": np.exp(rng.normal(np.log(5e-5), 1.2, len(c.t_off) - 1)),
    }


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def table_bytes(run: Path) -> dict[str, int]:
    return {d.name: dir_bytes(d) for d in sorted(run.iterdir()) if d.is_dir()}


def generate(args: argparse.Namespace) -> dict[str, Any]:
    """Make the store under args.store; returns its description (also written to bench-sql.json)."""
    store = Path(args.store)
    t0 = time.perf_counter()
    tm = build_templates(args)
    t_templates = time.perf_counter() - t0
    c = make_corpus(tm, args.pairs, args.seed)
    log(f"corpus: {c.stats['pairs']:,} pairs, {c.stats['sentences']:,} sentences, "
        f"{c.stats['quarantined']} quarantined ({time.perf_counter() - t0:.0f}s)")  # fmt: skip
    rng = np.random.default_rng(args.seed + 2)
    models = run_models(len(tm.vocab), args.seed)
    configs = [run_config(m.layer, args.pairs, args.seed) for m in models]
    rids = [run_id(cfg) for cfg in configs]
    building = store / ".building"
    shutil.rmtree(building, ignore_errors=True)
    runs = [building / rid for rid in rids]
    for run in runs:
        for table in TABLES:
            (run / table).mkdir(parents=True)
    params = pair_parameters(c, rng)
    ref_emb = np.random.default_rng(args.seed + 3).standard_normal((MAX_SEQ_LENGTH + 2, args.embedding_dim))
    ref_emb = (ref_emb / np.linalg.norm(ref_emb, axis=1, keepdims=True) * 5.5).astype(np.float32)
    seen = np.zeros(len(c.t_off) - 1, bool)
    counts = {t: 0 for t in ("pairs", "cells", "word_cells", "sentences", "parses", "same_token_cells")}
    n_pairs = len(c.rows)
    waves = range(0, n_pairs, args.wave_size)
    for seq, lo in enumerate(waves):
        hi = min(n_pairs, lo + args.wave_size)
        tables, n = wave_tables(tm, c, lo, hi, models, params, rng)
        for run, t in zip(runs, tables):
            for name in ("cells", "word_cells", "pairs"):
                write_part(run, name, seq, t[name])
        new = np.unique(np.concatenate([c.sa[lo:hi], c.sb[lo:hi]]))
        new = new[~seen[new]]
        seen[new] = True
        sentences, parses = sentence_tables(tm, c, new, rng, args.embedding_dim, ref_emb, params["factor_error"])
        write_part(runs[0], "sentences", seq, sentences)
        write_part(runs[0], "parses", seq, parses)
        for table in ("sentences", "parses"):  # text-only tables: run 2 shares run 1's files (hard links)
            os.link(runs[0] / table / f"part-{seq:06d}.parquet", runs[1] / table / f"part-{seq:06d}.parquet")
        counts["pairs"] += hi - lo
        counts["sentences"] += sentences.num_rows
        counts["parses"] += parses.num_rows
        for k in ("cells", "word_cells", "same_token_cells"):
            counts[k] += n[k]
        log(f"wave {seq + 1}/{len(waves)}: {hi:,} pairs, {counts['cells']:,} cells "
            f"({time.perf_counter() - t0:.0f}s)")  # fmt: skip
    last = len(waves)
    for run in runs:
        write_part(run, "quarantine", last, c.quarantine)
    gen_s = time.perf_counter() - t0
    counts["quarantine"] = c.quarantine.num_rows
    for run, rid, cfg, m in zip(runs, rids, configs, models):
        tables = {
            t: {"path": f"{t}/*.parquet", "parts": len(list((run / t).glob("*.parquet"))),
                "rows": sum(pq.ParquetFile(p).metadata.num_rows for p in (run / t).glob("*.parquet"))}
            for t in TABLES
        }  # fmt: skip
        manifest = {
            "run_id": rid, "store_version": STORE_VERSION, "schema": "docs/STORE.md", "config": cfg,
            "settings": {k: cfg[k] for k in ("model", "mode", "similarity", "layer", "n_layers", "rule", "steps")},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "tables": tables,
            "synthetic": {"generator": "bench/sql.py", "seed": args.seed, "stats": c.stats,
                          "shares_text_tables_with": [r for r in rids if r != rid]},
            "runs": [{"counts": {"n_in": c.stats["pairs_in"], "n_done": counts["pairs"],
                                 "n_quarantined": counts["quarantine"]}, "wall_s": gen_s}],
        }  # fmt: skip
        (run / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for rid in rids:
        final = store / rid
        shutil.rmtree(final, ignore_errors=True)
        os.replace(building / rid, final)
    shutil.rmtree(building, ignore_errors=True)
    desc = {
        "generator_version": GENERATOR_VERSION, "pairs_requested": args.pairs, "seed": args.seed,
        "wave_size": args.wave_size, "embedding_dim": args.embedding_dim,
        "run": str(store / rids[0]), "run2": str(store / rids[1]), "counts": counts, "stats": c.stats,
        "generate_s": gen_s, "templates_s": t_templates,
        "store_bytes": dir_bytes(store / rids[0]) + dir_bytes(store / rids[1]) - sum(
            dir_bytes(store / rids[1] / t) for t in ("sentences", "parses")),
        "run_bytes": table_bytes(store / rids[0]), "run2_bytes": table_bytes(store / rids[1]),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    (store / "bench-sql.json").write_text(json.dumps(desc, indent=1) + "\n", encoding="utf-8")
    log(f"store: {store} ({desc['store_bytes'] / 1e9:.2f} GB, {gen_s:.0f}s)")
    return desc


def open_store(args: argparse.Namespace) -> dict[str, Any]:
    """The store's description: reused when --reuse and complete and made with these settings, else made."""
    store = Path(args.store)
    marker = store / "bench-sql.json"
    ours = ("_cache", ".building", "_spill", "_out")
    if store.exists() and not marker.exists() and any(p.name not in ours for p in store.iterdir()):
        raise SystemExit(f"bench/sql.py: error: {store} exists and is not a bench/sql.py store (no bench-sql.json)")
    if marker.exists():
        desc = json.loads(marker.read_text(encoding="utf-8"))
        same = (desc.get("generator_version") == GENERATOR_VERSION and desc.get("pairs_requested") == args.pairs
                and desc.get("seed") == args.seed and desc.get("wave_size") == args.wave_size
                and desc.get("embedding_dim") == args.embedding_dim)  # fmt: skip
        complete = all((Path(desc[k]) / "manifest.json").exists() for k in ("run", "run2"))
        if args.reuse and same and complete:
            log(f"store: reusing {store} ({desc['counts']['pairs']:,} pairs, made {desc['created_at']})")
            return desc
        marker.unlink()
        for k in ("run", "run2"):  # only what this script made
            shutil.rmtree(desc[k], ignore_errors=True)
    store.mkdir(parents=True, exist_ok=True)
    return generate(args)


def existing_run(args: argparse.Namespace) -> dict[str, Any]:
    """--run: the description of a run directory written by jobs.attribute (rows per table from the Parquet
    footers, bytes on disk, its config); nothing is generated or changed."""
    import duckdb

    runs = {k: Path(v).resolve() for k, v in (("run", args.run), ("run2", args.run2 or args.run))}
    for key, run in runs.items():
        if not (run / "manifest.json").is_file():
            raise SystemExit(f"bench/sql.py: error: --{key} {run}: not a run directory (no manifest.json)")
    run = runs["run"]
    con = duckdb.connect()
    counts, run_bytes = {}, {}
    for table in TABLES:
        parts = sorted((run / table).glob("*.parquet"))
        run_bytes[table] = sum(f.stat().st_size for f in parts)
        counts[table] = (con.execute(f"select count(*) from read_parquet('{run}/{table}/*.parquet')").fetchone()[0]
                         if parts else None)  # fmt: skip
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    return {"run": str(run), "run2": str(runs["run2"]), "counts": counts, "run_bytes": run_bytes,
            "config": manifest.get("config", {})}  # fmt: skip


# Invariants of the store (docs/STORE.md) that the generator must hold; each query returns 0 when it does.
CHECKS = {
    "pairs: a row per stored cell and word cell, sums equal to the cells'": """
        select count(*) from pairs join (
            select pair_id, count(*) as n, sum(value) as s, sum(greatest(value, 0)) as pos,
                sum(least(value, 0)) as neg
            from cells group by 1) using (pair_id)
        where n != n_cells or abs(s - attribution_sum) > 1e-9 or abs(pos - positive_sum) > 1e-9
            or abs(neg - negative_sum) > 1e-9""",
    "word cells per pair = n_word_cells": """
        select count(*) from pairs join (select pair_id, count(*) as n from word_cells group by 1) using (pair_id)
        where n != n_word_cells""",
    "every pair has its cells": "select count(*) from pairs where pair_id not in (select pair_id from cells)",
    "one sentences row per sentence_id": "select count(*) - count(distinct sentence_id) from sentences",
    "every pair's sentences stored, each used": """
        select (select count(*) from pairs where sentence_id_a not in (select sentence_id from sentences)
                or sentence_id_b not in (select sentence_id from sentences))
             + (select count(*) from sentences where sentence_id not in
                (select sentence_id_a from pairs union select sentence_id_b from pairs))""",
    "token lists of n_tokens, word lists of n_words": """
        select count(*) from sentences where len(tokens) != n_tokens or len(word_ids) != n_tokens
            or len(token_start) != n_tokens or len(words) != n_words""",
    "parses: one row per (sentence, word)": """
        select count(*) from sentences left join (select sentence_id, count(*) as n, max(u) as m
            from parses group by 1) using (sentence_id) where n is distinct from n_words
            or (n_words > 0 and m != n_words - 1)""",
    "rows in = pairs + quarantine, each row once": """
        select count(*) - count(distinct row) from (select row from pairs union all select row from quarantine)""",
}


def check_store(desc: dict[str, Any]) -> dict[str, int]:
    """Run CHECKS on run 1 (and the pairs of run 2); exit 1 when one fails."""
    import duckdb

    con = duckdb.connect()
    con.execute("set threads = 2")
    failed = {}
    for key in ("run", "run2"):
        for table in TABLES:
            con.execute(
                f"create or replace view {table} as select * from read_parquet('{desc[key]}/{table}/*.parquet')"
            )
        for name, sql in CHECKS.items():
            if key == "run2" and "pairs" not in name:
                continue
            t0 = time.perf_counter()
            bad = con.execute(sql).fetchone()[0]
            log(f"check {key}: {name}: {'ok' if bad == 0 else f'{bad} violations'} ({time.perf_counter() - t0:.0f}s)")
            if bad:
                failed[f"{key}: {name}"] = bad
    if failed:
        raise SystemExit(f"bench/sql.py: error: the store breaks {len(failed)} invariant(s): {failed}")
    return failed

