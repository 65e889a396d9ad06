"""DuckDB over a run directory: the views, the variables, and the sql/ files (docs/ANALYSES.md).

    con = connect("runs/<id>", run2="runs/<id2>", variables={"min_count": 10})
    run_file(con, "sql/lexical_ranks.sql")           # -> polars.DataFrame

The connection has one view per table of the run (pairs, cells, word_cells, sentences, quarantine,
and parses once `python -m jobs.parse` wrote it), those of run2 suffixed `_2`, and the DuckDB
variables `run`, `run2` and `variables` set, so a sql/ file (which reads
`getvariable('run') || '/<table>/*.parquet'`) runs unchanged here and in the duckdb CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from xsbert_core import InputError

TABLES: tuple[str, ...] = ("pairs", "cells", "word_cells", "sentences", "quarantine", "parses")
SQL_DIR = Path(__file__).resolve().parents[1] / "sql"
# What to run when a table is missing (the attribution job writes every other table).
MAKES = {"parses": "python -m jobs.parse --run {run}"}
# `getvariable('run') || '/cells/*.parquet'` or `... || '/manifest.json'` in a sql/ file.
_INPUT_RE = re.compile(r"getvariable\('(run2?)'\)\s*\|\|\s*'/([A-Za-z_]+)(/\*\.parquet|\.json)'")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# `xsbert sql` prints at most this many rows as a table (all of them with --csv).
DEFAULT_MAX_ROWS = 100


def _literal(value: Any) -> str:
    """A SQL literal for a variable's value (str, int, float, bool, None)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def has_table(run: Path, table: str) -> bool:
    """The run has at least one Parquet part of `table`."""
    folder = run / table
    return folder.is_dir() and any(p.suffix == ".parquet" for p in folder.iterdir())


def check_run(run: str | os.PathLike, flag: str = "--run") -> Path:
    """The run directory, or an InputError saying what is wrong with it (missing, a store root, ...)."""
    path = Path(run)
    if not path.exists():
        raise InputError(f"{flag} {run}: no such directory")
    if not path.is_dir():
        raise InputError(f"{flag} {run}: not a directory")
    if not has_table(path, "pairs"):
        inner = sorted(p.name for p in path.iterdir() if p.is_dir() and has_table(p, "pairs"))
        hint = f"; it holds the runs {', '.join(inner[:5])}{' ...' if len(inner) > 5 else ''}" if inner else ""
        raise InputError(f"{flag} {run}: not a run directory (no pairs/*.parquet){hint}")
    return path


def missing_table_message(run: Path, table: str) -> str:
    """One line: the run lacks `table`, and what makes it."""
    make = MAKES.get(table)
    if table == "manifest":
        return f"run {run} has no manifest.json (written by python -m jobs.attribute)"
    return f"run {run} has no {table} table" + (f": run {make.format(run=run)}" if make else "")


def connect(
    run: str | os.PathLike, run2: str | os.PathLike | None = None, variables: Mapping[str, Any] | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's tables as views and the variables set."""
    first = check_run(run)
    second = check_run(run2, "--run2") if run2 is not None else None
    con = duckdb.connect()
    for path, suffix in ((first, ""), (second, "_2")):
        if path is None:
            continue
        for table in TABLES:
            if has_table(path, table):
                glob = _literal(str(path / table / "*.parquet"))
                con.execute(f"create view {table}{suffix} as select * from read_parquet({glob})")
    settings = {"run": str(first), **({"run2": str(second)} if second is not None else {})}
    for name, value in (variables or {}).items():
        if name in ("run", "run2"):
            raise InputError(f"variable {name!r} is set from the run directories (--run / --run2)")
        settings[name] = value
    for name, value in settings.items():
        if not _NAME_RE.match(name):
            raise InputError(f"variable name {name!r}: use letters, digits and _")
        con.execute(f"set variable {name} = {_literal(value)}")
    return con


def _variable(con: duckdb.DuckDBPyConnection, name: str) -> str | None:
    return con.sql(f"select getvariable('{name}')").fetchall()[0][0]


def check_inputs(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Every run table and manifest the SQL text reads through getvariable('run'/'run2') is there."""
    for var, table, kind in sorted(set(_INPUT_RE.findall(sql))):
        value = _variable(con, var)
        if value is None:
            which = "a second run: pass --run2 DIR" if var == "run2" else "a run: pass --run DIR"
            raise InputError(f"this analysis reads {which} (DuckDB variable {var!r})")
        run = Path(value)
        there = (run / f"{table}.json").is_file() if kind == ".json" else has_table(run, table)
        if not there:
            raise InputError(missing_table_message(run, table))


def resolve_file(path: str | os.PathLike) -> Path:
    """A SQL file by path, or by name from sql/ (`lexical_ranks` or `lexical_ranks.sql`)."""
    given = Path(path)
    for candidate in (given, SQL_DIR / given.name, SQL_DIR / f"{given.name}.sql"):
        if candidate.is_file():
            return candidate
    raise InputError(f"--file {path}: no such file (the analyses are in {SQL_DIR})")


def query(con: duckdb.DuckDBPyConnection, sql: str) -> pl.DataFrame:
    """Run SQL (one statement; of several, the last one's result); a polars DataFrame (empty when the statement
    returns nothing). DuckDB errors propagate (duckdb.Error)."""
    check_inputs(con, sql)
    relation = con.sql(sql)
    return pl.DataFrame() if relation is None else relation.pl()


def run_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike) -> pl.DataFrame:
    """Run a sql/ file (one statement) on the connection's run(s)."""
    return query(con, resolve_file(path).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- `xsbert sql`
def parse_value(text: str) -> Any:
    """A --var value: int, float, true/false, null, else a string ('quoted' for a string that looks like a number)."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] == "'":
        return t[1:-1]
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if t.lower() == "null":
        return None
    for kind in (int, float):
        try:
            return kind(t)
        except ValueError:
            pass
    return text


def parse_vars(items: list[str]) -> dict[str, Any]:
    """NAME=VALUE strings -> {name: typed value}."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _NAME_RE.match(name.strip()):
            raise InputError(f"--var {item!r}: use NAME=VALUE (NAME of letters, digits and _)")
        out[name.strip()] = parse_value(value)
    return out


def error_line(exc: duckdb.Error, con: duckdb.DuckDBPyConnection) -> str:
    """A DuckDB error as one line; a missing view of a table the run lacks says what makes it."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    match = re.search(r"Table with name (\w+) does not exist", first)
    if match:
        name = match.group(1)
        second = name.endswith("_2")
        base = name[:-2] if second else name
        if base in TABLES:
            run = _variable(con, "run2" if second else "run")
            if run is None:
                return f"no view {name}: the second run's views ({base}_2, ...) need --run2 DIR"
            return missing_table_message(Path(run), base)
    return first


def format_table(df: pl.DataFrame, max_rows: int = DEFAULT_MAX_ROWS) -> str:
    """The frame as a text table: every column, at most `max_rows` rows (then a note saying how many)."""
    shown = df.head(max_rows)
    with pl.Config(
        tbl_rows=-1, tbl_cols=-1, tbl_width_chars=10_000, fmt_str_lengths=60, fmt_table_cell_list_len=8,
        tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
    ):  # fmt: skip
        text = str(shown)
    note = f"{df.height} row{'s' if df.height != 1 else ''}"
    if df.height > max_rows:
        note = f"showing {max_rows} of {df.height} rows (--max-rows N, or --csv for all)"
    return f"{text}\n{note}"


def write_csv(df: pl.DataFrame, out) -> None:
    """CSV with a header; nested values (lists, structs) as JSON text."""
    nested = [c for c, t in df.schema.items() if t.is_nested()]
    if nested:
        df = df.with_columns(
            pl.Series(c, [None if v is None else json.dumps(v, default=str) for v in df[c].to_list()], pl.String)
            for c in nested
        )
    out.write(df.write_csv())


def cli(args: argparse.Namespace, out=None) -> int:
    """`xsbert sql`: run QUERY or --file on --run (and --run2); print a table or CSV. InputError on bad input."""
    out = out or sys.stdout
    if (args.query is None) == (args.file is None):
        raise InputError("give a QUERY or --file F (one of the two)")
    if args.max_rows < 1:
        raise InputError(f"--max-rows must be >= 1, got {args.max_rows}")
    con = connect(args.run, args.run2, parse_vars(args.var))
    sql = resolve_file(args.file).read_text(encoding="utf-8") if args.file else args.query
    if not sql.strip():
        raise InputError("the query is empty")
    try:
        df = query(con, sql)
    except duckdb.Error as exc:
        raise InputError(error_line(exc, con)) from exc
    if args.csv:
        write_csv(df, out)
    else:
        print(format_table(df, args.max_rows), file=out)
    return 0
