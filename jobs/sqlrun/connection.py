"""A DuckDB connection over runs (`connect`): one view per table, the variables set, and every read of a run's table
by a sql/ file taking the parts committed when the connection was made (`committed_sql`); the checks that what a
query reads is there (`check_inputs`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import duckdb

from xsbert_core import InputError

from ..store import REMOTE_SCHEMES, retried_fsspec
from .runs import (
    TABLES,
    as_run,
    check_run,
    committed,
    glob_escape,
    glob_unescape,
    has_table,
    is_file,
    join,
    missing_table_message,
    object_store,
    run_location,
)

# Variables that name a run directory (`pairs_of`: reference_terms.sql and pos_neg_sums.sql keep the pairs that run
# holds too): checked as --run is, and an object-store one's filesystem registered beside the runs'.
RUN_VARIABLES = frozenset({"pairs_of"})
# Variables that name a list of run directories (`other_runs`: negation_signs.sql reads the same pairs at other N):
# a list, or one string of them comma-separated (`--var other_runs=runs/a,runs/b`); each checked as --run is.
RUN_LIST_VARIABLES = frozenset({"other_runs"})
# `getvariable('run') || '/cells/*.parquet'` or `... || '/manifest.json'` in a sql/ file.
_INPUT_RE = re.compile(r"getvariable\('(run2?)'\)\s*\|\|\s*'/([A-Za-z_]+)(/\*\.parquet|\.json)'")
# A table macro's input: `run || '/cells/*.parquet'` (a parameter, not getvariable(...)), read for every run variable
# the file names (the macro is called with getvariable('run') and getvariable('run2')).
_MACRO_INPUT_RE = re.compile(r"(?<![)\w])(?!getvariable\b)[A-Za-z_]\w*\s*\|\|\s*'/([A-Za-z_]+)(/\*\.parquet|\.json)'")
_RUN_VARIABLE_RE = re.compile(r"getvariable\('(run2?)'\)")
# The committed parts of each table of the connection's runs (connect): a DuckDB variable (a map from the glob a sql/
# file writes, `<run>/<table>/*.parquet`, to the parts) and the macro that reads it (committed_sql puts it in).
PARTS_VARIABLE = "committed_parts"
# A list of globs (`read_parquet(list_transform(runs, lambda r: r || '/pairs/*.parquet'))`, as negation_signs.sql
# reads several runs) takes the committed parts of each, flattened (committed_parts_list).
PARTS_MACRO = ("create or replace temp macro committed_parts(pattern) as "
               f"coalesce(getvariable('{PARTS_VARIABLE}')[pattern], [pattern])")  # fmt: skip
PARTS_LIST_MACRO = ("create or replace temp macro committed_parts_list(patterns) as "
                    f"flatten(list_transform(patterns, lambda p: coalesce(getvariable('{PARTS_VARIABLE}')[p], [p])))")  # fmt: skip
_LIST_ARGUMENT_RE = re.compile(r"\s*(list_transform\s*\(|\[)", re.IGNORECASE)
_READ_PARQUET_RE = re.compile(r"read_parquet\s*\(", re.IGNORECASE)
_TABLE_GLOB_RE = re.compile(r"'/(?:" + "|".join(TABLES) + r")/\*\.parquet'\s*\)*\s*$")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def literal(value: Any) -> str:
    """A SQL literal for a variable's value (str, int, float, bool, None)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]::varchar[]" if value else "[]::varchar[]"
    return "'" + str(value).replace("'", "''") + "'"


def _duckdb_filesystem(location: str):
    """The pyarrow filesystem of an object-store URI as an fsspec filesystem for DuckDB
    (`con.register_filesystem`), under every URI scheme of its family (s3:// and s3a://, gs:// and gcs://); its
    calls retried as the store's are (jobs/store/reading.py)."""
    family = run_location(location).family
    protocols = tuple(s for s, f in REMOTE_SCHEMES.items() if f == family)  # DuckDB routes these to it
    return retried_fsspec(location, object_store(location)[0], protocols)


def connect(
    run: str | os.PathLike, run2: str | os.PathLike | None = None, variables: Mapping[str, Any] | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's tables as views and the variables set."""
    first = check_run(run)
    second = check_run(run2, "--run2") if run2 is not None else None
    # Run variables hold the path glob-escaped: the sql/ files glob under them (`getvariable('run') || '/...'`).
    settings = {"run": glob_escape(str(first)), **({"run2": glob_escape(str(second))} if second is not None else {})}
    runs = [first, second]
    for name, value in (variables or {}).items():
        if name in ("run", "run2"):
            raise InputError(f"variable {name!r} is set from the run directories (--run / --run2)")
        if name in RUN_VARIABLES and value is not None:  # a run directory too: checked and reachable as --run is
            runs.append(check_run(value, f"--var {name}"))
            value = glob_escape(str(runs[-1]))
        if name in RUN_LIST_VARIABLES and value is not None:  # run directories, each checked as --run is
            items = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
            checked = [check_run(v, f"--var {name}") for v in items if str(v)]
            runs += checked
            value = [glob_escape(str(v)) for v in checked]
        settings[name] = value
    con = duckdb.connect()
    families: dict[str, str] = {}  # one registered filesystem per scheme family (s3, gcs) the runs use
    for path in runs:
        if isinstance(path, str):
            families.setdefault(run_location(path).family, path)
    for location in families.values():
        con.register_filesystem(_duckdb_filesystem(location))
    # The runs' committed parts, once: every view and every sql/ file of this connection reads exactly these files
    # (a snapshot, as a Delta reader reads the files its log lists), never a part a commit did not make visible.
    snapshot: dict[str, list[str]] = {}  # `<run>/<table>/*.parquet` as the sql/ files write it -> the parts
    for path in dict.fromkeys(p for p in runs if p is not None):
        for table, parts in committed(path).items():
            snapshot[f"{glob_escape(str(path))}/{table}/*.parquet"] = [glob_escape(p) for p in parts]
    keys = "[" + ", ".join(map(literal, snapshot)) + "]::varchar[]"
    values = "[" + ", ".join(_list_literal(v) for v in snapshot.values()) + "]::varchar[][]"
    con.execute(f"set variable {PARTS_VARIABLE} = map({keys}, {values})")
    con.execute(PARTS_MACRO)
    con.execute(PARTS_LIST_MACRO)
    for path, suffix in ((first, ""), (second, "_2")):
        if path is None:
            continue
        for table in TABLES:
            parts = snapshot.get(f"{glob_escape(str(path))}/{table}/*.parquet")
            if parts:
                try:
                    con.execute(f"create view {table}{suffix} as select * from read_parquet({_list_literal(parts)})")
                except duckdb.Error as exc:  # its first part's footer cannot be read
                    raise InputError(f"{'--run2' if suffix else '--run'} {path}: its {table} table cannot be read "
                                     f"({one_line(exc)}): a damaged or half-copied run") from None  # fmt: skip
    for name, value in settings.items():
        if not NAME_RE.match(name):
            raise InputError(f"variable name {name!r}: use letters, digits and _")
        con.execute(f"set variable {name} = {literal(value)}")
    return con


def _list_literal(values: list[str]) -> str:
    return "[" + ", ".join(map(literal, values)) + "]"


def snapshot(con: duckdb.DuckDBPyConnection, run: str | os.PathLike) -> dict[str, list[str]]:
    """The committed parts of `run`'s tables that the connection reads (connect's snapshot): table -> parts, as
    read_parquet takes them (glob-escaped)."""
    prefix = f"{glob_escape(str(as_run(run)))}/"
    found = con.execute(f"select unnest(map_keys(m)), unnest(map_values(m)) from "
                        f"(select getvariable('{PARTS_VARIABLE}') as m)").fetchall()  # fmt: skip
    return {key[len(prefix) : -len("/*.parquet")]: list(parts) for key, parts in found
            if key.startswith(prefix) and key.endswith("/*.parquet") and "/" not in key[len(prefix) : -len("/*.parquet")]}  # fmt: skip


def committed_sql(sql: str) -> str:
    """`sql` with each `read_parquet(<run> || '/<table>/*.parquet', ...)` reading the committed parts of that table
    instead of what the glob matches (`committed_parts(<run> || '/<table>/*.parquet')`: the connection's snapshot,
    else the glob itself): the sql/ files, written for the duckdb CLI, read exactly what the runs' commits made
    visible here. Text in strings and comments is left alone."""
    out, k, n = [], 0, len(sql)
    while k < n:
        c = sql[k]
        if c == "'":  # a string: up to its closing quote ('' inside is a quote)
            end = k + 1
            while end < n and not (sql[end] == "'" and sql[end + 1 : end + 2] != "'"):
                end += 2 if sql[end : end + 2] == "''" else 1
            out.append(sql[k : end + 1])
            k = end + 1
        elif sql.startswith("--", k):
            end = sql.find("\n", k)
            end = n if end < 0 else end
            out.append(sql[k:end])
            k = end
        elif sql.startswith("/*", k):
            end = sql.find("*/", k + 2)
            end = n if end < 0 else end + 2
            out.append(sql[k:end])
            k = end
        elif (m := _READ_PARQUET_RE.match(sql, k)) and (k == 0 or not (sql[k - 1].isalnum() or sql[k - 1] == "_")):
            first_end = _first_argument_end(sql, m.end())
            argument = sql[m.end() : first_end]
            if _TABLE_GLOB_RE.search(argument):
                macro = "committed_parts_list" if _LIST_ARGUMENT_RE.match(argument) else "committed_parts"
                out.append(f"{m.group(0)}{macro}({committed_sql(argument)})")
                k = first_end
            else:
                out.append(m.group(0))
                k = m.end()
        else:
            out.append(c)
            k += 1
    return "".join(out)


def _first_argument_end(sql: str, start: int) -> int:
    """Where the first argument of a call whose arguments begin at `start` ends (its comma or closing parenthesis
    at depth 0; strings skipped)."""
    depth, k = 0, start
    while k < len(sql):
        c = sql[k]
        if c == "'":
            k += 1
            while k < len(sql) and not (sql[k] == "'" and sql[k + 1 : k + 2] != "'"):
                k += 2 if sql[k : k + 2] == "''" else 1
        elif c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                return k
            depth -= 1
        elif c == "," and depth == 0:
            return k
        k += 1
    return len(sql)


def one_line(exc: BaseException) -> str:
    """A DuckDB error (or any) as one line. An error raised in Python under DuckDB (a store read through the
    registered filesystem) carries its whole traceback in the text: its last line is the error itself."""
    text = str(exc).strip()
    if "Traceback (most recent call last)" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", ln)), lines[-1])
        return re.sub(r"^jobs\.store\.StoreError: ", "", last)
    return text.splitlines()[0] if text else type(exc).__name__


def variable(con: duckdb.DuckDBPyConnection, name: str) -> str | None:
    """The value of the connection's variable `name` (None when unset); a run variable's path unescaped."""
    value = con.sql(f"select getvariable('{name}')").fetchall()[0][0]
    return glob_unescape(value) if isinstance(value, str) and name in ("run", "run2", *RUN_VARIABLES) else value


def check_inputs(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Every run the SQL text reads through getvariable('run'/'run2') is given, and every table and manifest it
    reads there is there."""
    found = set(_INPUT_RE.findall(sql))
    for table, kind in set(_MACRO_INPUT_RE.findall(sql)):
        found |= {(var, table, kind) for var in _RUN_VARIABLE_RE.findall(sql)}
    inputs = sorted(found)
    for var in dict.fromkeys(var for var, _, _ in inputs):
        if variable(con, var) is None:
            which = "a second run: pass --run2 DIR" if var == "run2" else "a run: pass --run DIR"
            raise InputError(f"this analysis reads {which} (DuckDB variable {var!r})")
    for var, table, kind in inputs:
        run = as_run(variable(con, var))
        there = is_file(join(run, f"{table}.json")) if kind == ".json" else has_table(run, table)
        if not there:
            raise InputError(missing_table_message(run, table))
