"""What every analysis is made of: its spec (`Analysis`: check, summarize, plot, empty), the `Context` it reads
(the connection with the runs' views, their facts, the output folder), the `Finding`s and `Section` it returns, and
the applicability checks several analyses share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from .. import sqlfiles, sqlrun
from ..config import SERVE_URL  # noqa: F401 - where `xsbert serve` answers by default (--serve-url's default)

# Bars per list in the ranked charts (top and bottom tokens, relation pairs).
TOP_K = 15
# Queries the report runs besides the analyses (the agreement pre-check, the reference norms): sql/report/.
REPORT_SQL = sqlfiles.SQL_DIR / "report"
# A report's findings with their numbers, beside its index.html (jobs.analyses.page.write_json); the study page reads it.
REPORT_JSON = "report.json"


@dataclass(frozen=True)
class Headline:
    """A finding's number as the study page's headline table shows it: what is measured, and our value."""

    what: str  # "Spearman × 100, score vs gold label"
    ours: str  # "77.9"


@dataclass
class Finding:
    """One plain sentence; `values` are its numbers (report.json); `paper` the paper's number with its setting, if
    any (jobs.paper.beside: 'like-for-like', or the settings that differ); `like_for_like` whether they are equal;
    `paper_key` the jobs.paper value and `differs` the settings that differ from its ('' when like for like);
    `headline` the number the study page's table shows for the analysis (None: the finding is not a headline)."""

    text: str
    values: dict[str, Any] = field(default_factory=dict)
    paper: str | None = None
    like_for_like: bool | None = None
    paper_key: str | None = None
    differs: list[str] = field(default_factory=list)
    headline: Headline | None = None


@dataclass
class Section:
    name: str
    title: str
    paper: str
    status: str = "ok"  # ok | skipped | failed
    reason: str | None = None
    findings: list[Finding] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    files: list[str] = field(default_factory=list)
    frame: pl.DataFrame | None = None
    key_figure: str | None = None  # the figure of `figures` the study page shows


@dataclass
class Context:
    """The connection (views of run and run2, variables set), the runs' facts, the output folder."""

    con: duckdb.DuckDBPyConnection
    run: sqlrun.Run  # a local directory, or an object-store URI (s3://..., gs://...)
    run2: sqlrun.Run | None
    out: Path
    facts: dict[str, Any]
    facts2: dict[str, Any] | None
    results: dict[str, pl.DataFrame] = field(default_factory=dict)
    note: str | None = None
    serve_url: str | None = SERVE_URL  # links into `xsbert serve` (None: no links)
    study: str | None = None  # the study whose page (the folder above) lists this report (None: made on its own)

    def scalar(self, sql: str) -> Any:
        row = first_row(self.con, sql)
        return None if row is None else row[0]

    def frame(self, sql: str) -> pl.DataFrame:
        return self.con.sql(sql).pl()

    def var(self, name: str, default: Any) -> Any:
        value = self.scalar(f"select getvariable('{name}')")
        return default if value is None else value

    def columns(self, view: str) -> set[str]:
        return {r[0] for r in self.con.sql(f"describe {view}").fetchall()}

    @contextmanager
    def variable(self, name: str, value: Any) -> Iterator[None]:
        """The SQL variable `name` set to `value` inside the block, as it was (or unset) after it."""
        before = self.var(name, None)
        self.con.execute(f"set variable {name} = {sqlrun.literal(value)}")
        try:
            yield
        finally:
            if before is None:
                self.con.execute(f"reset variable {name}")
            else:
                self.con.execute(f"set variable {name} = {sqlrun.literal(before)}")


@dataclass
class Analysis:
    """One analysis of sql/<name>.sql: `check` gives a reason to skip it (from the data) or None, `summarize` its
    findings, `plot` its figures (written into ctx.out; [(file name, caption)]), `empty` a reason when its result
    has no rows to speak of."""

    name: str
    title: str
    paper: str
    check: Callable[[Context], str | None] | None
    summarize: Callable[[pl.DataFrame, Context], list[Finding]]
    plot: Callable[[pl.DataFrame, Context], list[tuple[str, str]]]
    empty: Callable[[pl.DataFrame, Context], str | None] | None = None
    serve_page: str | None = None  # the `xsbert serve` page (path and query) that shows the pairs behind it
    key_figure: str | None = None  # the figure (file name) the study page shows for it


def quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def first_row(con: duckdb.DuckDBPyConnection, sql: str) -> tuple | None:
    """The first row of a query's result, or None."""
    rows = con.sql(sql).limit(1).fetchall()
    return rows[0] if rows else None


def needs_pairs(ctx: Context) -> str | None:
    return None if ctx.facts["n_pairs"] else "the run has no pairs"


def needs_two_runs(ctx: Context) -> str | None:
    if ctx.run2 is None:
        return "needs a second run: pass --run2 DIR (e.g. the same pairs in another mode, layer or model)"
    if not ctx.facts["n_pairs"] or not ctx.facts2["n_pairs"]:
        return "one of the two runs has no pairs"
    return None


def needs_cells(ctx: Context, which: str = "all", both: bool = False) -> str | None:
    """A reason to skip when the run (both: and run2) does not store the cells an analysis reads: `all` (every
    cell) or `same-token` (every cell, or the same-token ones: jobs.attribute --cells)."""
    for facts in (ctx.facts, ctx.facts2) if both else (ctx.facts,):
        cells = (facts or {}).get("cells", "all")
        if cells != "all" and not (which == "same-token" and cells == "same-token"):
            need = "every cell" if which == "all" else "the same-token cells"
            fix = "all" if which == "all" else "same-token or all"
            return f"run {facts['path']} stores --cells {cells}; this analysis needs {need} (--cells {fix})"
    return None
