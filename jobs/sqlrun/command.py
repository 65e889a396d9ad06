"""`xsbert sql` (jobs/cli.py reads its flags): --var values, the query's answer as a text table or CSV, and a DuckDB
error as one line that says what makes a missing table."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import duckdb
import polars as pl

from xsbert_core import InputError

from ..sqlfiles import check_kinds, parse_value, variables_read
from .connection import NAME_RE, connect, one_line, variable
from .files import file_sql, query
from .runs import TABLES, as_run, missing_table_message


def check_vars(name: str, sql: str, variables: dict[str, Any]) -> None:
    """An InputError naming every --var the file (with what it `.read`s) never reads, and those it does."""
    reads = variables_read(sql)
    unknown = sorted(set(variables) - reads)
    if unknown:
        known = ", ".join(sorted(reads)) or "none"
        raise InputError(f"--var {', '.join(unknown)}: {name} reads no such variable (it reads: {known})")


def parse_vars(items: list[str]) -> dict[str, Any]:
    """NAME=VALUE strings -> {name: typed value}."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not NAME_RE.match(name.strip()):
            raise InputError(f"--var {item!r}: use NAME=VALUE (NAME of letters, digits and _)")
        out[name.strip()] = parse_value(value)
    return out


def error_line(exc: duckdb.Error, con: duckdb.DuckDBPyConnection) -> str:
    """A DuckDB error as one line; a missing view of a table the run lacks says what makes it, and a part listed when
    the connection opened and gone since says that the run changed under the reader."""
    first = one_line(exc)
    gone = re.search(r'No files found that match the pattern "([^"]+)"', first)
    if gone:
        return (f"{gone.group(1)} was part of the run when this began and is gone: the run's files changed while "
                "they were read (e.g. jobs.parse --replace); run it again")
    match = re.search(r"Table with name (\w+) does not exist", first)
    if match:
        name = match.group(1)
        second = name.endswith("_2")
        base = name[:-2] if second else name
        if base in TABLES:
            run = variable(con, "run2" if second else "run")
            if run is None:
                return f"no view {name}: the second run's views ({base}_2, ...) need --run2 DIR"
            return missing_table_message(as_run(run), base)
    return first


def draws_boxes(stream: Any) -> bool:
    """Whether `stream`'s encoding has the box-drawing characters of a table (not in ASCII, PYTHONIOENCODING=ascii)."""
    try:
        "┌─┬┐│╞═╡└┘┆".encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def format_table(df: pl.DataFrame, max_rows: int, boxes: bool = True) -> str:
    """The frame as a text table: every column, at most `max_rows` rows (then a note saying how many); drawn in
    ASCII (+---+) where not `boxes`."""
    shown = df.head(max_rows)
    with pl.Config(
        tbl_rows=-1, tbl_cols=-1, tbl_width_chars=10_000, fmt_str_lengths=60, fmt_table_cell_list_len=8,
        tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
        **({} if boxes else {"tbl_formatting": "ASCII_FULL_CONDENSED"}),
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
    variables = parse_vars(args.var)
    sql = file_sql(args.file) if args.file else args.query
    if not sql.strip():
        raise InputError("the query is empty")
    if args.file:  # a misspelt --var would leave the file at its default without a word
        check_vars(args.file, sql, variables)
        check_kinds(sql, variables)
    con = connect(args.run, args.run2, variables)
    try:
        df = query(con, sql)
    except duckdb.Error as exc:
        raise InputError(error_line(exc, con)) from exc
    if args.csv:
        write_csv(df, out)
    else:
        print(format_table(df, args.max_rows, boxes=draws_boxes(out)), file=out)
    return 0
