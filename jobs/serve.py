"""`xsbert serve`: a local, read-only web app over a run; `xsbert show`: one stored pair at a terminal.

    xsbert serve --run runs/<id> [--run2 runs/<id2>] [--port 8000] [--host 127.0.0.1]
    xsbert show --run runs/<id> --pair ID [--words] [--png OUT.png]

Pages (jinja2 templates of jobs/templates/, jobs.pages' environment: every dataset string escaped):

    /pairs    the pairs: text (substring) or token search, filters (score, label, |error|, sums, tokens), sort by any
              of them, pages of --page-size; quarantined rows by reason; counts always shown
    /pair     one pair: texts, score, sums, reference terms, errors; token x token and word x word heatmaps (SVG,
              diverging colours centred at 0, the value of a cell on hover), top positive and negative cells; with
              --run2 the same pair in both runs side by side and their difference
    /tokens   lexical ranks (sql/lexical_ranks.sql): each token's same-token attributions over the store
    /token    one token's same-token cells, linked to their pairs

Every page shows its SQL as run (parameters bound, `$name`), and as an `xsbert sql` command to paste.

Design for a store of 404k pairs / 115M cells (bench/serve.py, bench/results/serve.md): DuckDB over the run's
Parquet. The pairs pages sort and filter a copy of the list's columns of `pairs` made in memory at start
(`pairs_memory`, ~100 MB at 404k pairs; reading Parquet on every page was ~10x slower). A pair page
finds the pair's wave from the name of its `pairs` part (part-<wave>.parquet) and reads the cells, word cells and
sentences of that wave's parts only (the job writes a wave's cells as part-<wave>-*.parquet), not the whole
`cells` table; a store laid out otherwise falls back to the whole table. The tokens pages read a table of the
same-token cells (token_a = token_b, ~2% of the cells) that a background thread builds once at start (in memory,
never in the run). Both copies are of the run as it was at start.

Read-only: the server answers GET and HEAD only, DuckDB holds the run's tables as views over its files, and
nothing is written anywhere. It listens on 127.0.0.1 unless --host says otherwise. Pages carry a Content
Security Policy that allows no script at all, so a dataset string could not run even if escaping failed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import duckdb
import numpy as np

from xsbert_core import InputError, XsbertError

from . import _sql
from .store import part_seq

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
PAGE_SIZE = 50  # rows per page of a list
MAX_PAGE_SIZE = 500
TOP_CELLS = 10  # top positive and top negative cells on a pair page
# The tables jobs.attribute writes for every run (each has at least one part once a wave is committed).
REQUIRED = ("pairs", "cells", "word_cells", "sentences", "quarantine")
# Sort keys and filters of the pairs list: name -> SQL expression over `pairs` (fixed text, never user input).
COLUMNS = {
    "score": "score",
    "label": "label",
    "error": "abs(completeness_error)",
    "sum": "attribution_sum",
    "positive": "positive_sum",
    "negative": "negative_sum",
    "tokens": "n_tokens_a + n_tokens_b",
}
SORTS = {**COLUMNS, "pair_id": "pair_id", "row": "row"}
COLUMN_NAMES = {"score": "score", "label": "label", "error": "|completeness error|", "sum": "ΣA",
                "positive": "positive sum", "negative": "negative sum", "tokens": "tokens (a + b)",
                "pair_id": "pair id", "row": "source row"}  # fmt: skip
TOKEN_SORTS = {"rank": "rank", "mean": "mean", "n": "n", "std": "std", "token": "token"}
# The pair's columns shown on its page (when the run has them).
PAIR_FIELDS = ("pair_id", "row", "split", "label", "text_a", "text_b", "sentence_id_a", "sentence_id_b", "n_tokens_a",
               "n_tokens_b", "score", "attribution_sum", "positive_sum", "negative_sum", "ref_sim_a", "ref_sim_b",
               "ref_term", "target", "completeness_error", "factor_error_a", "factor_error_b", "steps_a", "steps_b",
               "truncated_a", "truncated_b", "n_cells", "n_word_cells")  # fmt: skip
LIST_FIELDS = "pair_id, label, score, attribution_sum, positive_sum, negative_sum, completeness_error, n_tokens_a, " \
              "n_tokens_b, text_a, text_b"  # fmt: skip
# Diverging colours (RdBu, reversed): blue negative, white 0, red positive; value / bound in [-1, 1].
_STOPS = ((-1.0, (33, 102, 172)), (-0.5, (146, 197, 222)), (0.0, (247, 247, 247)), (0.5, (244, 165, 130)),
          (1.0, (178, 24, 43)))  # fmt: skip
_PARAM_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
SEARCH_SEPARATOR = "\x1f"  # between the two texts in pairs_memory.search_text (never searched for)


class BadRequest(XsbertError):
    """A query parameter that is not what the page takes (400)."""


class NotFound(XsbertError):
    """No such page, pair or token (404)."""


class Busy(XsbertError):
    """What the page needs is still being read at start (503: reload in a moment)."""


# --------------------------------------------------------------------------- opening a run
@dataclass
class RunInfo:
    """One run as the pages see it: where it is, its manifest, its counts and the parts of each table by wave."""

    path: _sql.Run
    flag: str  # --run / --run2
    suffix: str  # '' / '_2': the views' suffix
    manifest: dict[str, Any]
    counts: dict[str, int]
    columns: set[str]  # of `pairs`
    note: str | None = None

    @property
    def settings(self) -> dict[str, Any]:
        return {**(self.manifest.get("config") or {}), **(self.manifest.get("settings") or {})}

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or _sql.run_name(self.path))

    def label(self) -> str:
        s = self.settings
        return f"{s.get('model')} · layer {s.get('layer')} · {s.get('mode')} · {s.get('similarity')}"

    def glob(self, table: str, wave: int | None = None) -> str:
        name = "*.parquet" if wave is None else f"part-{wave:06d}*.parquet"
        return str(_sql.join(self.path, table, name))


def open_run(con: duckdb.DuckDBPyConnection, run: str, flag: str, suffix: str) -> RunInfo:
    """Check that `run` is a whole, readable run (InputError in one line when it is missing or half-written) and
    read its manifest and counts (Parquet footers only)."""
    path = _sql.check_run(run, flag)
    text = _sql.read_text(_sql.join(path, "manifest.json"))
    if text is None:
        raise InputError(f"{flag} {run}: no manifest.json: a half-written run (python -m jobs.attribute writes it when "
                         "the run ends: still running, or killed before its end; rerun the same command to finish it)")
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{flag} {run}: manifest.json is not readable JSON ({exc}): a half-written run?") from exc
    counts: dict[str, int] = {}
    for table in REQUIRED:
        if not _sql.has_table(path, table):
            raise InputError(f"{flag} {run}: no {table}/*.parquet: a half-written run (jobs.attribute writes every "
                             "table of a wave before its pairs part) or not a run of this store version")
        try:
            counts[table] = con.execute(f"select count(*) from {table}{suffix}").fetchone()[0]
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"{flag} {run}: its {table} table cannot be read ({first}): a damaged or half-copied "
                             "run") from exc
    stated = ((manifest.get("tables") or {}).get("pairs") or {}).get("rows")
    note = None
    if isinstance(stated, int) and counts["pairs"] < stated:
        raise InputError(f"{flag} {run}: manifest.json lists {stated:,} pairs but pairs/ holds {counts['pairs']:,}: "
                         "parts are missing (a half-copied run?)")  # fmt: skip
    if isinstance(stated, int) and counts["pairs"] > stated:
        note = (f"pairs/ holds {counts['pairs']:,} pairs, {counts['pairs'] - stated:,} more than manifest.json lists: "
                "a rerun is adding pairs to this run; pages show the committed waves")  # fmt: skip
    columns = {r[0] for r in con.execute(f"describe pairs{suffix}").fetchall()}
    return RunInfo(path, flag, suffix, manifest, counts, columns, note)


# --------------------------------------------------------------------------- queries, shown as run
@dataclass
class Shown:
    """One query of a page: its SQL as run (parameters `$name`, bound), the parameters, and the same query as an
    `xsbert sql` command (the whole-table views, the parameters written in as SQL literals)."""

    title: str
    sql: str
    params: dict[str, Any]
    command: str
    seconds: float = 0.0
    note: str | None = None


def sql_literal(value: Any) -> str:
    """A value as a SQL literal, for the command shown on the page (never for running)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    return _sql._literal(value)


def _dedent(sql: str) -> str:
    lines = [line.rstrip() for line in sql.strip("\n").splitlines()]
    indent = min((len(x) - len(x.lstrip()) for x in lines[1:] if x.strip()), default=0)
    return "\n".join([lines[0].strip()] + [x[indent:] for x in lines[1:]])


class Page:
    """What one request ran: its queries (Shown), on a cursor of its own."""

    def __init__(self, con: duckdb.DuckDBPyConnection, command: Callable[[str, bool], str]) -> None:
        self.con = con.cursor()
        self.command = command
        self.queries: list[Shown] = []

    def close(self) -> None:
        self.con.close()

    def run(self, title: str, sql: str, params: dict[str, Any] | None = None, *, view_sql: str | None = None,
            view_params: dict[str, Any] | None = None, run2: bool = False, note: str | None = None) -> list[tuple]:  # fmt: skip
        """Run `sql` with `params` bound; record it with its `xsbert sql` form (`view_sql`: the same query over the
        views, when `sql` reads parts directly)."""
        params = params or {}
        sql = _dedent(sql)
        t = time.perf_counter()
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        rows = self.con.execute(sql, used).fetchall() if used else self.con.execute(sql).fetchall()
        shown_sql = _dedent(view_sql) if view_sql is not None else sql
        vp = {**params, **(view_params or {})}
        text = _PARAM_RE.sub(lambda m: sql_literal(vp[m.group(1)]) if m.group(1) in vp else m.group(0), shown_sql)
        self.queries.append(Shown(title, sql, used, self.command(text, run2), time.perf_counter() - t, note))
        return rows


class App:
    """The open run(s), the DuckDB connection with their views, and the same-token table built in the background."""

    def __init__(self, run: str | Any, run2: str | Any | None = None, page_size: int = PAGE_SIZE) -> None:
        con_run = _sql.check_run(run)
        con_run2 = _sql.check_run(run2, "--run2") if run2 is not None else None
        try:
            self.con = _sql.connect(con_run, con_run2)
        except duckdb.Error as exc:  # a view over a part that is not Parquet (cut short, half-copied)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"--run {run}{f' / --run2 {run2}' if run2 is not None else ''}: a table cannot be read "
                             f"({first}): a damaged or half-copied run") from exc
        self.run = open_run(self.con, str(run), "--run", "")
        self.run2 = open_run(self.con, str(run2), "--run2", "_2") if run2 is not None else None
        self.page_size = page_size
        self.started = time.time()
        self.same_tokens = threading.Event()
        self.same_tokens_error: str | None = None
        self.same_tokens_seconds: float | None = None
        self.reasons = self.con.execute(
            "select reason, count(*) from quarantine group by 1 order by 2 desc, 1").fetchall()
        t = time.perf_counter()
        self.con.execute(_dedent(self.PAIRS_MEMORY_SQL))
        self.pairs_memory_seconds = time.perf_counter() - t
        threading.Thread(target=self._build_same_tokens, name="same-token-cells", daemon=True).start()

    # the pairs list's columns in memory, once per start (~100 MB at 404k pairs): the list pages sort and filter
    # them without reading Parquet; `search_text` is both texts lowercased, for the substring search
    PAIRS_MEMORY_SQL = f"""
        create table pairs_memory as
        select {LIST_FIELDS}, sentence_id_a, sentence_id_b, row,
               lower(text_a) || chr(31) || lower(text_b) as search_text
        from pairs"""

    # the same-token cells, once per start
    SAME_TOKEN_SQL = """
        create table same_token_cells as
        select pair_id, i, j, token_a as token, value from cells where token_a = token_b order by token"""
    # per token: n, sum, sum of squares (the ranks of any min_count are ranks over this small table)
    TOKEN_STATS_SQL = """
        create table token_stats as
        select token, count(*) as n, avg(value) as mean, stddev_samp(value) as std,
               token in (select token from special_tokens) as is_special
        from same_token_cells group by token"""
    # every (token, sentence) of the run, sorted by token (DuckDB skips the row groups of other tokens): the token
    # search of the pairs list
    SENTENCE_TOKENS_SQL = """
        create table sentence_tokens as
        select distinct unnest(tokens) as token, sentence_id from sentences order by token"""
    SPECIAL_SQL = """
        create table special_tokens as
        select distinct unnest([t for t, k in tokens if word_ids[k] is null]) as token from sentences"""

    def _build_same_tokens(self) -> None:
        t = time.perf_counter()
        con = self.con.cursor()
        try:
            con.execute(_dedent(self.SAME_TOKEN_SQL))
            con.execute(_dedent(self.SPECIAL_SQL))
            con.execute(_dedent(self.TOKEN_STATS_SQL))
            con.execute(_dedent(self.SENTENCE_TOKENS_SQL))
        except duckdb.Error as exc:
            self.same_tokens_error = str(exc).strip().splitlines()[0]
        finally:
            con.close()
            self.same_tokens_seconds = time.perf_counter() - t
            self.same_tokens.set()

    def command(self, sql: str, run2: bool = False) -> str:
        """`xsbert sql --run DIR [--run2 DIR2] "SQL"` for the shell."""
        argv = ["xsbert", "sql", "--run", str(self.run.path)]
        if run2 and self.run2 is not None:
            argv += ["--run2", str(self.run2.path)]
        return shlex.join(argv + [" ".join(sql.split())])

    def runs(self) -> list[RunInfo]:
        return [self.run] + ([self.run2] if self.run2 is not None else [])


# --------------------------------------------------------------------------- parameters
class Params:
    """A request's query string, read into typed values (BadRequest, 400, when a value is not of its type)."""

    def __init__(self, query: str) -> None:
        self.raw = {k: v[-1] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}

    def text(self, name: str, default: str = "") -> str:
        value = self.raw.get(name, default)
        if len(value) > 1000:
            raise BadRequest(f"{name}: longer than 1,000 characters")
        return value

    def number(self, name: str) -> float | None:
        value = self.raw.get(name, "").strip()
        if not value:
            return None
        try:
            x = float(value)
        except ValueError:
            raise BadRequest(f"{name}: not a number: {value!r}") from None
        if not math.isfinite(x):
            raise BadRequest(f"{name}: not a finite number: {value!r}")
        return x

    def integer(self, name: str, default: int, low: int, high: int | None = None) -> int:
        value = self.raw.get(name, "").strip()
        if not value:
            return default
        try:
            x = int(value)
        except ValueError:
            raise BadRequest(f"{name}: not a whole number: {value!r}") from None
        if x < low or (high is not None and x > high):
            raise BadRequest(f"{name}: {x} is outside {low}..{high if high is not None else '∞'}")
        return x

    def choice(self, name: str, options: Any, default: str) -> str:
        value = self.raw.get(name, "") or default
        if value not in options:
            raise BadRequest(f"{name}: {value!r} is not one of {', '.join(options)}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw.get(name, "").strip().lower()
        if not value:
            return default
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise BadRequest(f"{name}: {value!r} is not 1 or 0")

    def link(self, **changes: Any) -> str:
        """This query string with some parameters changed (None drops one)."""
        merged = {**self.raw, **{k: v for k, v in changes.items()}}
        return urllib.parse.urlencode({k: v for k, v in merged.items() if v not in (None, "")})


# --------------------------------------------------------------------------- heatmaps
def colour(value: float, bound: float) -> str:
    """The cell's fill: diverging, white at 0, full red at +bound, full blue at -bound."""
    x = 0.0 if bound <= 0 or not math.isfinite(value) else max(-1.0, min(1.0, value / bound))
    for (x0, c0), (x1, c1) in zip(_STOPS, _STOPS[1:]):
        if x <= x1:
            f = (x - x0) / (x1 - x0)
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1))
    return "#%02x%02x%02x" % _STOPS[-1][1]


@dataclass
class Heatmap:
    """A matrix drawn as SVG rects: labels, per cell (value, fill), the colour bound (max |value|)."""

    title: str
    rows: list[str]
    cols: list[str]
    values: np.ndarray
    kind: str = "attribution"  # or "difference"
    bound: float = field(init=False)
    cell: int = field(init=False)

    def __post_init__(self) -> None:
        finite = self.values[np.isfinite(self.values)]
        self.bound = float(np.abs(finite).max()) if finite.size else 0.0
        n = max(len(self.rows), len(self.cols), 1)
        self.cell = max(6, min(24, 720 // n))

    @property
    def label_width(self) -> int:
        return 8 + 7 * max((len(r) for r in self.rows), default=1)

    @property
    def label_height(self) -> int:
        return 8 + int(5.2 * max((len(c) for c in self.cols), default=1))

    def cells(self):
        """(x, y, value, fill, row label, column label) per cell."""
        for i, row in enumerate(self.rows):
            for j, col in enumerate(self.cols):
                v = float(self.values[i, j])
                yield j * self.cell, i * self.cell, v, colour(v, self.bound), row, col

    def legend(self) -> list[tuple[float, str]]:
        return [(x, colour(x * self.bound, self.bound)) for x in (-1.0, -0.5, 0.0, 0.5, 1.0)]


def top_cells(values: np.ndarray, rows: list[str], cols: list[str], k: int = TOP_CELLS) -> dict[str, list[tuple]]:
    """The k largest positive and the k most negative cells: (value, i, j, row label, column label)."""
    flat = values.ravel()
    order = np.argsort(-flat, kind="stable")
    n = values.shape[1] if values.ndim == 2 and values.shape[1] else 1
    pos = [(float(flat[f]), f // n, f % n) for f in order[:k] if flat[f] > 0]
    neg = [(float(flat[f]), f // n, f % n) for f in order[::-1][:k] if flat[f] < 0]
    return {name: [(v, int(i), int(j), rows[i], cols[j]) for v, i, j in cells] for name, cells in
            (("positive", pos), ("negative", neg))}  # fmt: skip


# --------------------------------------------------------------------------- one pair, from the store
@dataclass
class StoredPair:
    """One pair of one run as stored: its `pairs` row, the token and word matrices (cells not stored: 0), tokens."""

    run: RunInfo
    row: dict[str, Any]
    tokens_a: list[str]
    tokens_b: list[str]
    word_ids_a: list[int | None]
    word_ids_b: list[int | None]
    words_a: list[str]
    words_b: list[str]
    matrix: np.ndarray
    word_matrix: np.ndarray
    wave: int | None


def _fill(shape: tuple[int, int], rows: list[tuple]) -> np.ndarray:
    m = np.zeros(shape)
    for x, y, v in rows:
        if 0 <= x < shape[0] and 0 <= y < shape[1] and v is not None:
            m[x, y] = v
    return m


def load_pair(page: Page, run: RunInfo, pair_id: str) -> StoredPair | None:
    """The pair's row, matrices and tokens from `run`; None when the run has no such pair. Reads the cells, word
    cells and sentences of the pair's wave only (the parts named part-<wave>*), else of the whole tables."""
    two = run.suffix == "_2"
    fields = [f for f in PAIR_FIELDS if f in run.columns]
    extra = sorted(run.columns - set(PAIR_FIELDS) - {"top10_abs", "top10_value", "content_top10_abs",
                                                      "content_top10_value", "word_top10_abs", "word_top10_value"})  # fmt: skip
    cols = ", ".join(fields + extra)
    found = page.run(
        f"the pair ({run.flag[2:]})",
        f"select {cols}, filename from read_parquet($pairs_parts, filename = true) where pair_id = $id",
        {"pairs_parts": run.glob("pairs"), "id": pair_id},
        view_sql=f"select {cols} from pairs{run.suffix} where pair_id = $id", run2=two)  # fmt: skip
    if not found:
        return None
    row = dict(zip(fields + extra + ["filename"], found[0]))
    wave = part_seq(str(row.pop("filename")).replace("\\", "/").rsplit("/", 1)[-1])

    def narrowed(title: str, table: str, select: str, where: str, params: dict[str, Any], expect: int) -> list[tuple]:
        view = f"select {select} from {table}{run.suffix} where {where}"
        if wave is not None:
            rows = page.run(title, f"select {select} from read_parquet($parts) where {where}",
                            {**params, "parts": run.glob(table, wave)}, view_sql=view, run2=two,
                            note=f"read from the parts of wave {wave} ({table}/part-{wave:06d}*.parquet)")  # fmt: skip
            if len(rows) >= expect:
                return rows
        return page.run(title, view, params, run2=two)

    ids = (row["sentence_id_a"], row["sentence_id_b"])
    sent = narrowed("the two sentences", "sentences", "sentence_id, tokens, word_ids, words",
                    "sentence_id in ($sentence_a, $sentence_b)", {"sentence_a": ids[0], "sentence_b": ids[1]},
                    len(set(ids)))  # fmt: skip
    by_id = {r[0]: r for r in sent}
    a, b = by_id.get(ids[0]), by_id.get(ids[1])
    tokens_a, ids_a, words_a = (list(a[1] or []), list(a[2] or []), list(a[3] or [])) if a else ([], [], [])
    tokens_b, ids_b, words_b = (list(b[1] or []), list(b[2] or []), list(b[3] or [])) if b else ([], [], [])
    n_cells = row.get("n_cells") or 0
    cells = narrowed("the token cells", "cells", "i, j, value, token_a, token_b", "pair_id = $id", {"id": pair_id},
                     1 if n_cells else 0)  # fmt: skip
    words = narrowed("the word cells", "word_cells", "u, v, value, word_a, word_b", "pair_id = $id", {"id": pair_id},
                     1 if (row.get("n_word_cells") or 0) else 0)  # fmt: skip
    if not tokens_a or not tokens_b:  # no sentences row: the tokens the cells name
        tokens_a = _labels([(r[0], r[3]) for r in cells], row.get("n_tokens_a"))
        tokens_b = _labels([(r[1], r[4]) for r in cells], row.get("n_tokens_b"))
        ids_a, ids_b = [None] * len(tokens_a), [None] * len(tokens_b)
    if not words_a or not words_b:
        words_a = _labels([(r[0], r[3]) for r in words], None)
        words_b = _labels([(r[1], r[4]) for r in words], None)
    matrix = _fill((len(tokens_a), len(tokens_b)), [(r[0], r[1], r[2]) for r in cells])
    word_matrix = _fill((len(words_a), len(words_b)), [(r[0], r[1], r[2]) for r in words])
    return StoredPair(run, row, tokens_a, tokens_b, ids_a, ids_b, words_a, words_b, matrix, word_matrix, wave)


def _labels(pairs: list[tuple[int, str]], n: int | None) -> list[str]:
    size = max([k + 1 for k, _ in pairs] + [n or 0])
    out = ["?"] * size
    for k, label in pairs:
        out[k] = label
    return out


def views(pair: StoredPair, level: str, specials: bool) -> tuple[np.ndarray, list[str], list[str]]:
    """The matrix shown: token level without the special tokens' rows and columns unless `specials`, or words."""
    if level == "word":
        return pair.word_matrix, pair.words_a, pair.words_b
    rows = [i for i, w in enumerate(pair.word_ids_a) if specials or w is not None] or list(range(len(pair.tokens_a)))
    cols = [j for j, w in enumerate(pair.word_ids_b) if specials or w is not None] or list(range(len(pair.tokens_b)))
    if len(pair.word_ids_a) != len(pair.tokens_a) or len(pair.word_ids_b) != len(pair.tokens_b):
        rows, cols = list(range(len(pair.tokens_a))), list(range(len(pair.tokens_b)))
    return pair.matrix[np.ix_(rows, cols)], [pair.tokens_a[i] for i in rows], [pair.tokens_b[j] for j in cols]


# --------------------------------------------------------------------------- pages
def _where_pairs(p: Params, args: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The WHERE terms of the pairs list and the CTEs they need; `args` gets the bound values."""
    terms: list[str] = []
    ctes: list[str] = []
    q = p.text("q").strip()
    if q:
        args["q"], args["q_id"] = q.lower().replace(SEARCH_SEPARATOR, ""), q
        terms.append("(contains(search_text, $q) or pair_id = $q_id)")
    token = p.text("token").strip()
    if token:
        args["token_forms"] = [token, f"Ġ{token}", f"▁{token}"] if not token.startswith(("Ġ", "▁", "##")) else [token]
        ctes.append("with_token as (select sentence_id from sentence_tokens where token in (select unnest($token_forms)))")
        terms.append("(sentence_id_a in (select sentence_id from with_token) or "
                     "sentence_id_b in (select sentence_id from with_token))")  # fmt: skip
    for name, expr in COLUMNS.items():
        for bound, op in (("min", ">="), ("max", "<=")):
            x = p.number(f"{bound}_{name}")
            if x is not None:
                args[f"{bound}_{name}"] = x
                terms.append(f"{expr} {op} ${bound}_{name}")
    return terms, ctes


def page_pairs(app: App, page: Page, p: Params) -> dict[str, Any]:
    size = p.integer("size", app.page_size, 1, MAX_PAGE_SIZE)
    number = p.integer("page", 1, 1)
    reason = p.text("reason").strip()
    sort = p.choice("sort", SORTS, "score")
    order = p.choice("order", ("asc", "desc"), "desc")
    args: dict[str, Any] = {"limit": size, "offset": (number - 1) * size}
    if reason:
        if reason != "any" and reason not in {r for r, _ in app.reasons}:
            raise BadRequest(f"reason: {reason!r} is not a quarantine reason of this run")
        terms = [] if reason == "any" else ["reason = $reason"]
        args["reason"] = reason
        q = p.text("q").strip()
        if q:
            args["q"], args["q_id"] = q.lower(), q
            terms.append("(contains(lower(text_a), $q) or contains(lower(text_b), $q) or pair_id = $q_id)")
        where = f"where {' and '.join(terms)}" if terms else ""
        total = page.run("how many rows match", f"select count(*) from quarantine {where}", args)[0][0]
        rows = page.run("the page of quarantined rows", f"""
            select row, pair_id, reason, detail, text_a, text_b, label
            from quarantine {where}
            order by row
            limit $limit offset $offset""", args)  # fmt: skip
        items = [dict(zip(("row", "pair_id", "reason", "detail", "text_a", "text_b", "label"), r)) for r in rows]
        kind = "quarantine"
    else:
        terms, ctes = _where_pairs(p, args)
        where = f"where {' and '.join(terms)}" if terms else ""
        with_ = f"with {', '.join(ctes)}\n" if ctes else ""
        if "with_token" in with_:
            building = _wait_same_tokens(app)
            if building:
                raise Busy("the token index is being built (once per start of the server): reload in a moment")
        view_with = with_.replace("select sentence_id from sentence_tokens where token in (select unnest($token_forms))",
                                  "select sentence_id from sentences where list_has_any(tokens, $token_forms)")
        view_where = where.replace("contains(search_text, $q)", "contains(lower(text_a), $q) or contains(lower(text_b), $q)")
        note = "over pairs_memory, read at start: " + " ".join(App.PAIRS_MEMORY_SQL.split())
        total = (page.run("how many pairs match", f"{with_}select count(*) from pairs_memory {where}", args,
                          view_sql=f"{view_with}select count(*) from pairs {view_where}", note=note)[0][0]
                 if terms else app.run.counts["pairs"])  # fmt: skip
        # the page's rows by their sort keys alone, then their columns: a deep page sorts two columns, not the texts
        head = f"{with_.rstrip()}, " if with_ else "with "
        rows = page.run("the page of pairs", f"""
            {head}page as (
                select rowid as k from pairs_memory {where}
                order by {SORTS[sort]} {order} nulls last, pair_id
                limit $limit offset $offset
            )
            select {LIST_FIELDS} from pairs_memory where rowid in (select k from page)
            order by {SORTS[sort]} {order} nulls last, pair_id""", args,
            view_sql=f"""
            {view_with}select {LIST_FIELDS}
            from pairs {view_where}
            order by {SORTS[sort]} {order} nulls last, pair_id
            limit $limit offset $offset""", note=note)  # fmt: skip
        items = [dict(zip([c.strip() for c in LIST_FIELDS.split(",")], r)) for r in rows]
        kind = "pairs"
    pages = max(1, math.ceil(total / size))
    if number > pages and total:
        raise NotFound(f"page {number}: there are {pages} pages of {size}")
    return {"kind": kind, "items": items, "total": total, "number": number, "pages": pages, "size": size,
            "first": (number - 1) * size + 1 if items else 0, "last": (number - 1) * size + len(items),
            "sort": sort, "order": order, "reason": reason, "columns": COLUMNS, "column_names": COLUMN_NAMES,
            "sorts": SORTS}  # fmt: skip


def page_pair(app: App, page: Page, p: Params) -> dict[str, Any]:
    pair_id = p.text("id")
    if not pair_id:
        raise BadRequest("id: which pair? (/pair?id=PAIR_ID)")
    level = p.choice("level", ("token", "word"), "token")
    specials = p.flag("specials", False)
    first = load_pair(page, app.run, pair_id)
    second = load_pair(page, app.run2, pair_id) if app.run2 is not None else None
    if first is None and second is None:
        quarantined = page.run("is it quarantined?", "select reason, detail from quarantine where pair_id = $id",
                               {"id": pair_id})  # fmt: skip
        why = f" (quarantined: {quarantined[0][0]}: {quarantined[0][1]})" if quarantined else ""
        raise NotFound(f"no pair with pair_id {pair_id!r} in the run{' or run2' if app.run2 else ''}{why}")
    sides = []
    for pair in (first, second):
        if pair is None:
            sides.append(None)
            continue
        values, rows, cols = views(pair, level, specials)
        sides.append({"pair": pair, "run": pair.run, "heatmap": Heatmap(pair.run.flag[2:], rows, cols, values),
                      "top": top_cells(values, rows, cols)})  # fmt: skip
    difference, why_not = None, None
    if first is not None and second is not None:
        (v1, r1, c1), (v2, r2, c2) = views(first, level, specials), views(second, level, specials)
        if (r1, c1) == (r2, c2):
            diff = v2 - v1
            difference = {"heatmap": Heatmap("run2 − run", r1, c1, diff, "difference"), "top": top_cells(diff, r1, c1)}
        else:
            why_not = ("the two runs split the texts into different tokens (different tokenizers): their cells do not "
                       "correspond, so there is no difference matrix")  # fmt: skip
    elif app.run2 is not None:
        why_not = f"the pair is only in {'run' if second is None else 'run2'}"
    main = first or second
    return {"pair_id": pair_id, "sides": sides, "difference": difference, "why_not": why_not, "level": level,
            "specials": specials, "pair": main.row, "fields": PAIR_FIELDS}  # fmt: skip


def _wait_same_tokens(app: App) -> dict[str, Any] | None:
    """None when the same-token table is there; else what the page says while it is built."""
    app.same_tokens.wait(0.5)
    if not app.same_tokens.is_set():
        return {"building": True, "since": time.time() - app.started}
    if app.same_tokens_error:
        raise RuntimeError(f"the same-token cells could not be read: {app.same_tokens_error}")
    return None


def page_tokens(app: App, page: Page, p: Params) -> dict[str, Any]:
    min_count = p.integer("min_count", 30, 1)
    include_special = p.flag("include_special", True)
    q = p.text("q").strip()
    sort = p.choice("sort", TOKEN_SORTS, "rank")
    order = p.choice("order", ("asc", "desc"), "asc" if sort in ("rank", "token") else "desc")
    size = p.integer("size", app.page_size, 1, MAX_PAGE_SIZE)
    number = p.integer("page", 1, 1)
    out: dict[str, Any] = {"min_count": min_count, "include_special": include_special, "q": q, "sort": sort,
                           "order": order, "sorts": TOKEN_SORTS, "number": number, "size": size}  # fmt: skip
    building = _wait_same_tokens(app)
    if building:
        return {**out, **building, "items": [], "total": 0, "pages": 1}
    args = {"min_count": min_count, "include_special": include_special, "q": q.lower(), "limit": size,
            "offset": (number - 1) * size}  # fmt: skip
    ranked = """
        with kept as (
            select token, n, mean, std from token_stats
            where ($include_special or not is_special) and n >= $min_count
        ),
        ranked as (select *, rank() over (order by mean desc) as rank from kept)"""
    filt = "where $q = '' or contains(lower(token), $q)"
    total = page.run("how many tokens", f"{ranked}\nselect count(*) from ranked {filt}", args,
                     view_sql=f"-- xsbert sql --run {shlex.quote(str(app.run.path))} -f lexical_ranks "
                              f"--var min_count={min_count} --var include_special={str(include_special).lower()}",
                     note="over token_stats, built at start: " + " ".join(App.TOKEN_STATS_SQL.split()))[0][0]  # fmt: skip
    rows = page.run("the page of tokens", f"""{ranked}
        select token, n, mean, std, rank from ranked {filt}
        order by {TOKEN_SORTS[sort]} {order} nulls last, token
        limit $limit offset $offset""", args,
        view_sql=f"-- the rows of: xsbert sql --run {shlex.quote(str(app.run.path))} -f lexical_ranks "
                 f"--var min_count={min_count} --var include_special={str(include_special).lower()}")  # fmt: skip
    items = [dict(zip(("token", "n", "mean", "std", "rank"), r)) for r in rows]
    return {**out, "items": items, "total": total, "pages": max(1, math.ceil(total / size)), "building": False}


def page_token(app: App, page: Page, p: Params) -> dict[str, Any]:
    token = p.text("t")
    if not token:
        raise BadRequest("t: which token? (/token?t=TOKEN)")
    order = p.choice("order", ("asc", "desc"), "desc")
    size = p.integer("size", app.page_size, 1, MAX_PAGE_SIZE)
    number = p.integer("page", 1, 1)
    out: dict[str, Any] = {"token": token, "order": order, "number": number, "size": size}
    building = _wait_same_tokens(app)
    if building:
        return {**out, **building, "items": [], "total": 0, "pages": 1, "stats": None}
    args = {"t": token, "limit": size, "offset": (number - 1) * size}
    stats = page.run("the token's same-token cells", """
        select count(*) as n, avg(value) as mean, stddev_samp(value) as std, count(distinct pair_id) as n_pairs
        from same_token_cells where token = $t""", args,
        view_sql="""select count(*) as n, avg(value) as mean, stddev_samp(value) as std,
                    count(distinct pair_id) as n_pairs from cells where token_a = $t and token_b = $t""")[0]  # fmt: skip
    if not stats[0]:
        raise NotFound(f"no same-token cell of the token {token!r} (token_a = token_b) in the run")
    rows = page.run("the page of cells, with their pairs", f"""
        with page as (
            select pair_id, i, j, value from same_token_cells where token = $t
            order by value {order}, pair_id, i, j limit $limit offset $offset
        )
        select page.pair_id, page.i, page.j, page.value, p.score, p.text_a, p.text_b
        from page join pairs_memory p using (pair_id)
        order by page.value {order}, page.pair_id, page.i, page.j""", args,
        view_sql=f"""select c.pair_id, c.i, c.j, c.value, p.score, p.text_a, p.text_b
                     from cells c join pairs p using (pair_id) where c.token_a = $t and c.token_b = $t
                     order by c.value {order}, c.pair_id, c.i, c.j limit $limit offset $offset""")  # fmt: skip
    items = [dict(zip(("pair_id", "i", "j", "value", "score", "text_a", "text_b"), r)) for r in rows]
    return {**out, "items": items, "total": stats[0], "pages": max(1, math.ceil(stats[0] / size)),
            "stats": dict(zip(("n", "mean", "std", "n_pairs"), stats)), "building": False}  # fmt: skip


ROUTES: dict[str, tuple[str, Callable[[App, Page, Params], dict[str, Any]]]] = {
    "/": ("serve_pairs.html", page_pairs),
    "/pairs": ("serve_pairs.html", page_pairs),
    "/pair": ("serve_pair.html", page_pair),
    "/tokens": ("serve_tokens.html", page_tokens),
    "/token": ("serve_token.html", page_token),
}
# No script may run on a page; styles are inline; nothing is loaded from elsewhere.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


# --------------------------------------------------------------------------- rendering and HTTP
def environment():
    from .pages import environment as report_environment

    env = report_environment()
    env.filters["signed"] = lambda x, d=4: "" if x is None else f"{x:+.{d}f}"
    env.filters["num"] = lambda x, d=4: "" if x is None else (f"{x:,}" if isinstance(x, int) else f"{x:.{d}g}")
    return env


class Renderer:
    def __init__(self, app: App) -> None:
        self.app = app
        self.env = environment()

    def render(self, template: str, page: Page | None, p: Params | None, path: str, **context: Any) -> str:
        return self.env.get_template(template).render(
            app=self.app, runs=self.app.runs(), queries=page.queries if page else [], params=p, path=path,
            link=(p.link if p is not None else (lambda **_: "")), **context)  # fmt: skip


def make_handler(app: App, renderer: Renderer, log: Callable[[str], None] | None = None):
    class Handler(BaseHTTPRequestHandler):
        server_version = "xsbert-serve"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            if log is not None:
                log(f"{self.address_string()} {format % args}")

        def _send(self, status: int, body: str, content_type: str = "text/html; charset=utf-8",
                  head: bool = False) -> None:  # fmt: skip
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in HEADERS.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def _error(self, status: HTTPStatus, message: str, head: bool) -> None:
            body = renderer.render("serve_error.html", None, None, "", status=int(status), phrase=status.phrase,
                                   message=message)  # fmt: skip
            self._send(int(status), body, head=head)

        def _get(self, head: bool) -> None:
            url = urllib.parse.urlsplit(self.path)
            route = ROUTES.get(url.path)
            if route is None:
                return self._error(HTTPStatus.NOT_FOUND, f"no page {url.path} (pages: /pairs, /pair, /tokens, "
                                   "/token)", head)  # fmt: skip
            template, fn = route
            page = Page(app.con, app.command)
            try:
                p = Params(url.query)
                context = fn(app, page, p)
                body = renderer.render(template, page, p, url.path, **context)
            except BadRequest as exc:
                return self._error(HTTPStatus.BAD_REQUEST, str(exc), head)
            except NotFound as exc:
                return self._error(HTTPStatus.NOT_FOUND, str(exc), head)
            except Busy as exc:
                return self._error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc), head)
            except Exception as exc:  # noqa: BLE001 - one line to the browser, the traceback to the log
                if log is not None:
                    log(traceback.format_exc())
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {first}", head)
            finally:
                page.close()
            self._send(200, body, head=head)

        def do_GET(self) -> None:
            self._get(head=False)

        def do_HEAD(self) -> None:
            self._get(head=True)

        def _read_only(self) -> None:
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "read-only: GET and HEAD only", False)

        do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(app: App, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                log: Callable[[str], None] | None = None) -> Server:  # fmt: skip
    """The HTTP server (not started: call serve_forever); port 0 picks a free one."""
    try:
        return Server((host, port), make_handler(app, Renderer(app), log))
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


# --------------------------------------------------------------------------- `xsbert serve`, `xsbert show`
def add_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "serve",
        help="browse a run in a local web app (pairs, heatmaps, tokens)",
        description="A local read-only web app over a run: the pairs (search, filters, sort, pages), each pair's "
        "token and word heatmaps and top cells (with --run2: both runs and their difference), and the lexical ranks "
        "with their pairs. Every page shows its SQL. DuckDB over the run's Parquet; nothing is written.",
    )
    s.add_argument("--run", required=True, metavar="DIR", help="the run directory, local or s3://... / gs://...")
    s.add_argument("--run2", metavar="DIR2", help="a second run of the same pairs: pair pages show both and the difference")  # fmt: skip
    s.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only; anything else lets others "
                        "read the run)")  # fmt: skip
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: a free one)")
    s.add_argument("--page-size", type=int, default=PAGE_SIZE, help=f"rows per page of a list (default {PAGE_SIZE})")
    s.add_argument("-q", "--quiet", action="store_true", help="do not log each request")

    w = sub.add_parser(
        "show",
        help="print one stored pair as `xsbert explain` prints it (read from a run, not recomputed)",
        description="Print a pair of a run as `xsbert explain` prints a computed one: settings, texts, score, sums, "
        "reference terms, errors and the top token (and word) pairs, read from the store.",
    )
    w.add_argument("--run", required=True, metavar="DIR", help="the run directory, local or s3://... / gs://...")
    w.add_argument("--pair", required=True, metavar="ID", help="the pair's pair_id")
    w.add_argument("--words", action="store_true", help="also the top word pairs (word_cells)")
    w.add_argument("--top", type=int, default=5, help="how many top cells to print (default 5)")
    w.add_argument("--png", metavar="OUT.png", help="write the token heatmap, as xsbert explain --plot draws it")


def serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port {args.port}: not a port (0..65535)")
    if args.page_size < 1 or args.page_size > MAX_PAGE_SIZE:
        raise InputError(f"--page-size {args.page_size}: use 1..{MAX_PAGE_SIZE}")
    app = App(args.run, args.run2, args.page_size)
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    server = make_server(app, args.host, args.port, log)
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host
    for info in app.runs():
        print(f"{info.flag[2:]}: {info.path} ({info.counts['pairs']:,} pairs, {info.label()})", flush=True)
        if info.note:
            print(f"note: {info.note}", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host}: anyone who can reach this machine's port {port} can read the run",
              file=sys.stderr, flush=True)  # fmt: skip
    print(f"serving http://{shown}:{port}/ (read-only; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.server_close()
    return 0


def stored_attribution(pair: StoredPair, words: bool):
    """The stored pair as xsbert_core's PairAttribution (what `xsbert explain` computes), settings from the manifest."""
    from xsbert_core.explainer import PairAttribution

    r = pair.row

    def f(key: str, default: float = float("nan")) -> float:
        value = r.get(key)
        return default if value is None else float(value)

    return PairAttribution(
        tokens_a=pair.tokens_a, tokens_b=pair.tokens_b, matrix=pair.matrix, score=f("score"),
        attribution_sum=f("attribution_sum"), positive_sum=f("positive_sum"), negative_sum=f("negative_sum"),
        ref_sim_a=f("ref_sim_a"), ref_sim_b=f("ref_sim_b"), ref_term=f("ref_term"), target=f("target"),
        error=f("completeness_error"), factor_error_a=f("factor_error_a"), factor_error_b=f("factor_error_b"),
        steps_a=int(r.get("steps_a") or 0), steps_b=int(r.get("steps_b") or 0),
        truncated_a=bool(r.get("truncated_a")), truncated_b=bool(r.get("truncated_b")),
        words_a=pair.words_a if words else None, words_b=pair.words_b if words else None,
        word_matrix=pair.word_matrix if words else None, settings=pair.run.settings,
    )  # fmt: skip


def show(args: argparse.Namespace, out=None) -> int:
    """`xsbert show`: the pair as `xsbert explain` prints it, from the store."""
    from xsbert_core.cli import format_view

    out = out or sys.stdout
    if args.top < 1:
        raise InputError(f"--top must be >= 1, got {args.top}")
    con = _sql.connect(_sql.check_run(args.run))
    info = open_run(con, args.run, "--run", "")
    page = Page(con, lambda sql, run2: sql)
    try:
        pair = load_pair(page, info, args.pair)
    finally:
        page.close()
    if pair is None:
        why = con.execute("select reason, detail from quarantine where pair_id = $id", {"id": args.pair}).fetchall()
        raise InputError(f"--pair {args.pair}: no such pair in {args.run}"
                         + (f" (quarantined: {why[0][0]}: {why[0][1]})" if why else ""))  # fmt: skip
    min_abs = (info.manifest.get("config") or {}).get("min_abs")
    res = stored_attribution(pair, args.words)
    print(format_view(res, pair.row["text_a"], pair.row["text_b"], args.top), file=out)
    if min_abs:
        print(f"(cells with |value| < {min_abs} are not stored: --min-abs {min_abs}; they count as 0 here)", file=out)
    if args.png:
        from xsbert_core.cli import _display
        from xsbert_core.plots import plot_attributions

        title = (f"f(a,b) = {res.score:.3f}   ΣA = {res.attribution_sum:.3f}   layer {res.settings.get('layer')}, "
                 f"{res.settings.get('mode')}   (pair {args.pair})")  # fmt: skip
        plot_attributions(res.matrix, [_display(t) for t in res.tokens_a], [_display(t) for t in res.tokens_b],
                          args.png, title)  # fmt: skip
        print(f"wrote {args.png}", file=out)
    return 0
