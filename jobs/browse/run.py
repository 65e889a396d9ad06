"""Opening a run for `xsbert serve` / `xsbert show`: the connection and its views, the in-memory copies the pages
query (App), and every query run as a Page that records it (Shown) with its `xsbert sql` command."""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb

from xsbert_core import InputError, XsbertError

from .. import sqlrun
from ..store import MANIFEST, part_seq

# Requests answered at once (a thread each; DuckDB does the work); WAITING_PER_WORKER more per worker wait for a free
# one, and beyond those a request is answered 503 with Retry-After at once (never a silent queue that times out).
DEFAULT_WORKERS = 8
WAITING_PER_WORKER = 2
RETRY_AFTER_S = 1
# Connections the kernel holds before they are accepted (the listen backlog).
LISTEN_BACKLOG = 128
# A request whose client sends nothing for this long frees its worker (a stalled or slow client holds none).
REQUEST_TIMEOUT_S = 30


PAGE_SIZE = 50  # rows per page of a list


MAX_PAGE_SIZE = 500


# The largest whole number a page takes (page, min_count, ...): with a page of MAX_PAGE_SIZE rows, DuckDB's OFFSET
# (page - 1) * size stays far inside int64; a larger value is a 400, never an overflow in the query (a 500).
MAX_INTEGER = 10**12


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


_PARAM_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


SEARCH_SEPARATOR = "\x1f"  # between the two texts in pairs_memory.search_text (never searched for)


class BadRequest(XsbertError):
    """A query parameter that is not what the page takes (400)."""


class NotFound(XsbertError):
    """No such page, pair or token (404)."""


class Busy(XsbertError):
    """What the page needs is still being read at start (503: reload in a moment)."""


@dataclass
class RunInfo:
    """One run as the pages see it: where it is, its manifest, its counts and the parts of each table by wave."""

    path: sqlrun.Run
    flag: str  # --run / --run2
    suffix: str  # '' / '_2': the views' suffix
    manifest: dict[str, Any]
    counts: dict[str, int]
    columns: set[str]  # of `pairs`
    note: str | None = None
    parts: dict[str, list[str]] = field(default_factory=dict)  # table -> its committed parts the connection reads

    @property
    def settings(self) -> dict[str, Any]:
        return {**(self.manifest.get("config") or {}), **(self.manifest.get("settings") or {})}

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or sqlrun.run_name(self.path))

    def label(self) -> str:
        s = self.settings
        return f"{s.get('model')} · layer {s.get('layer')} · {s.get('mode')} · {s.get('similarity')}"

    def parts_of(self, table: str, wave: int | None = None) -> list[str]:
        """The committed parts of `table` that the views read (of wave `wave` only: part-<wave>*.parquet)."""
        parts = self.parts.get(table, [])
        if wave is None:
            return parts
        return [p for p in parts if part_seq(sqlrun.glob_unescape(p).rsplit("/", 1)[-1]) == wave]


def open_run(con: duckdb.DuckDBPyConnection, run: str, flag: str, suffix: str) -> RunInfo:
    """Check that `run` is a whole, readable run (InputError in one line when it is missing or half-written) and
    read its manifest and counts (Parquet footers only)."""
    path = sqlrun.check_run(run, flag)
    text = sqlrun.read_text(sqlrun.join(path, MANIFEST))
    if text is None:
        raise sqlrun.no_manifest(run, flag)
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{flag} {run}: manifest.json is not readable JSON ({exc}): a half-written run?") from exc
    counts: dict[str, int] = {}
    for table in REQUIRED:
        if not sqlrun.has_table(path, table):
            raise InputError(f"{flag} {run}: no {table}/*.parquet: a half-written run (jobs.attribute writes every "
                             "table of a wave before its pairs part) or not a run of this store version")
        try:
            counts[table] = con.execute(f"select count(*) from {table}{suffix}").fetchone()[0]
        except duckdb.Error as exc:
            first = sqlrun.one_line(exc)
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
    return RunInfo(path, flag, suffix, manifest, counts, columns, note, sqlrun.snapshot(con, path))


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
    return sqlrun.literal(value)


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
        con_run = sqlrun.check_run(run)
        con_run2 = sqlrun.check_run(run2, "--run2") if run2 is not None else None
        try:
            self.con = sqlrun.connect(con_run, con_run2)
        except duckdb.Error as exc:  # a view over a part that is not Parquet (cut short, half-copied)
            first = sqlrun.one_line(exc)
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
        self._builder = self.con.cursor()
        threading.Thread(target=self._build_same_tokens, name="same-token-cells", daemon=True).start()

    def close(self) -> None:
        """Stop the background build if it still runs (DuckDB's interrupt; the thread ends at once) and close the
        connection: a process that exits with the build mid-query is aborted by DuckDB's native code."""
        if not self.same_tokens.is_set():
            self._builder.interrupt()
            self.same_tokens.wait(30)
        self.con.close()

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
    # every (token, sentence) of the run, the token lowercased and sorted (DuckDB skips the row groups of other
    # tokens): the token search of the pairs list, which ignores case
    SENTENCE_TOKENS_SQL = """
        create table sentence_tokens as
        select distinct lower(unnest(tokens)) as token, sentence_id from sentences order by token"""
    SPECIAL_SQL = """
        create table special_tokens as
        select distinct unnest([t for t, k in tokens if word_ids[k] is null]) as token from sentences"""

    def _build_same_tokens(self) -> None:
        t = time.perf_counter()
        con = self._builder
        try:
            con.execute(_dedent(self.SAME_TOKEN_SQL))
            con.execute(_dedent(self.SPECIAL_SQL))
            con.execute(_dedent(self.TOKEN_STATS_SQL))
            con.execute(_dedent(self.SENTENCE_TOKENS_SQL))
        except duckdb.Error as exc:
            self.same_tokens_error = sqlrun.one_line(exc)
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
