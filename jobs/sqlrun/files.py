"""The sql/ files run on a connection: found by path or name, read with the macros they `.read` (jobs/sqlfiles.py),
their inputs checked, their reads made to take the committed parts."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import polars as pl

from xsbert_core import InputError
from xsbert_core.errors import not_utf8

from .. import sqlfiles
from ..sqlfiles import SQL_DIR
from .connection import check_inputs, committed_sql


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
    relation = con.sql(committed_sql(sql))
    return pl.DataFrame() if relation is None else relation.pl()


def file_sql(path: str | os.PathLike) -> str:
    """The SQL of a file by path or sql/ name, with the files it `.read`s (jobs/sqlfiles.py); InputError, one line,
    for a file that is missing, unreadable, not UTF-8, or `.read`s one that is, or itself."""
    found = resolve_file(path)
    try:
        return sqlfiles.text(found)
    except UnicodeDecodeError as exc:
        raise InputError(f"--file {path}: {not_utf8(exc)}") from None
    except OSError as exc:
        raise InputError(f"--file {path}: cannot read {exc.filename or found} ({exc.strerror or exc})") from None
    except ValueError as exc:  # a .read of itself
        raise InputError(f"--file {path}: {exc}") from None


def run_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike) -> pl.DataFrame:
    """Run a sql/ file (one statement, after the macros it `.read`s: jobs/sqlfiles.py) on the connection's run(s)."""
    return query(con, file_sql(path))
