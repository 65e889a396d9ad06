"""DuckDB over a run directory: the views, the variables, and the sql/ files (docs/ANALYSES.md).

    con = connect("runs/<id>", run2="runs/<id2>", variables={"min_count": 10})
    con = connect("s3://bucket/prefix/<id>")         # a run on object storage (s3://, gs://)
    run_file(con, "sql/lexical_ranks.sql")           # -> polars.DataFrame

The connection has one view per table of the run (pairs, cells, word_cells, sentences, quarantine,
and parses once `python -m jobs.parse` wrote it), those of run2 suffixed `_2`, and the DuckDB
variables `run`, `run2` and `variables` set, so a sql/ file (which reads
`getvariable('run') || '/<table>/*.parquet'`) runs unchanged here and in the duckdb CLI. Here every view and
every such read takes the run's committed parts as listed once at connect (`committed`, `committed_sql`;
docs/STORE.md, "Reading"), never a part of a wave that did not commit.

A run is a local directory (a Path) or an object-store URI (a str: s3://bucket/prefix/<id>, gs://...). The
Python duckdb cannot load httpfs offline, so object storage goes through pyarrow's filesystems (S3 and GCS are
built into pyarrow): the existence checks here use them directly and DuckDB reads through them as an fsspec
filesystem (fsspec's ArrowFSWrapper, registered on the connection). Credentials, region and endpoint come the
standard way (AWS_* variables incl. AWS_ENDPOINT_URL, ~/.aws, instance roles; GOOGLE_APPLICATION_CREDENTIALS);
they are never printed. A missing bucket, an endpoint that cannot be reached or a denied request is one
InputError line. The duckdb CLI reads s3:// through httpfs: jobs/_duckdb_cli.py.
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
import pyarrow as pa
import pyarrow.fs as pafs

from xsbert_core import InputError
from xsbert_core.errors import not_utf8

from . import sqlfiles
from .sqlfiles import SQL_DIR
from .store import (  # scheme -> family; DuckDB: all
    CREDENTIALS,
    REMOTE_SCHEMES,
    GaveUp,
    Location,
    committed_parts,
    committed_waves,
    endpoint_name,
    filesystem,
    retried,
    retried_fsspec,
    store_retry_s,
    transient,
)

# Variables that name a run directory (`pairs_of`: reference_terms.sql and pos_neg_sums.sql keep the pairs that run
# holds too): checked as --run is, and an object-store one's filesystem registered beside the runs'.
RUN_VARIABLES = frozenset({"pairs_of"})
# Variables that name a list of run directories (`other_runs`: negation_signs.sql reads the same pairs at other N):
# a list, or one string of them comma-separated (`--var other_runs=runs/a,runs/b`); each checked as --run is.
RUN_LIST_VARIABLES = frozenset({"other_runs"})

TABLES: tuple[str, ...] = ("pairs", "cells", "word_cells", "sentences", "quarantine", "parses")
# What to run when a table is missing (the attribution job writes every other table).
MAKES = {"parses": "python -m jobs.parse --run {run}"}
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
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A run: a local directory, or an object-store URI (str, no trailing slash).
Run = Path | str


def glob_escape(path: str) -> str:
    """`path` with DuckDB's glob characters taken literally (`[` -> `[[]`, `*` -> `[*]`, `?` -> `[?]`), so that
    `read_parquet(<path> || '/pairs/*.parquet')` reads a run whose folder is named like `runs[1]`."""
    return re.sub(r"([\[*?])", r"[\1]", path)


def glob_unescape(path: str) -> str:
    return re.sub(r"\[([\[*?])\]", r"\1", path)


def _literal(value: Any) -> str:
    """A SQL literal for a variable's value (str, int, float, bool, None)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]::varchar[]" if value else "[]::varchar[]"
    return "'" + str(value).replace("'", "''") + "'"


# --------------------------------------------------------------------------- runs: local or on object storage
def run_location(place: str | os.PathLike | Location) -> Location:
    """A run (or a file in one) parsed by the store's one parser (jobs.store.Location), its errors as InputError: a
    scheme without a backend (http://, file://, ...), a URI with credentials in it."""
    return Location.parse(place, InputError)


def as_run(run: str | os.PathLike) -> Run:
    """A run (or a file in one) as given: an object-store URI as a str without a trailing slash, else a Path."""
    loc = run_location(run)
    return loc.uri if loc.is_remote else Path(run)


def join(run: str | os.PathLike, *parts: str) -> Run:
    """`run / part / ...` for a local directory or an object-store URI."""
    run = as_run(run)
    return run.joinpath(*parts) if isinstance(run, Path) else "/".join([run, *parts])


def run_name(run: str | os.PathLike) -> str:
    """The last component of a run's path (its run id)."""
    run = as_run(run)
    return run.name if isinstance(run, Path) else run.rsplit("/", 1)[-1]


def _store_error(exc: Exception, location: str, flag: str | None = None) -> InputError:
    """An object-store failure as one line: unreachable, denied, no such bucket, else its first line."""
    where = f"{flag} {location}" if flag else str(location)
    text = " ".join(str(exc).split())
    endpoint = endpoint_name(location)
    if re.search(r"NETWORK_CONNECTION|curlCode|[Cc]ould not (?:connect|resolve)|Couldn't (?:connect|resolve)|"
                 r"Connection refused|timed out|Timeout", text):  # fmt: skip
        reason = re.search(r"(Could not resolve[^;.]*|Could not connect to server|Couldn't [^;.]*|Connection refused|"
                           r"[Tt]imed out|Timeout[^;.]*)", text)  # fmt: skip
        return InputError(f"{where}: cannot reach the object store at {endpoint}"
                          + (f" ({reason.group(1).strip()})" if reason else ""))  # fmt: skip
    if re.search(r"ACCESS_DENIED|AccessDenied|InvalidAccessKeyId|INVALID_ACCESS_KEY|SignatureDoesNotMatch|"
                 r"SIGNATURE_DOES_NOT_MATCH|ExpiredToken|EXPIRED_TOKEN|Forbidden|\b403\b|"
                 r"[Uu]nable to (?:load|find) credentials|[Nn]o credentials|Could not find default credentials|"
                 r"PERMISSION_DENIED|UNAUTHENTICATED", text):  # fmt: skip
        how = CREDENTIALS[run_location(location).family or ""]
        return InputError(f"{where}: access denied by the object store at {endpoint} (check the credentials: {how})")
    if re.search(r"NoSuchBucket|NO_SUCH_BUCKET|[Bb]ucket .* (?:not found|does not exist)", text):
        return InputError(f"{where}: no such bucket {Location.parse(location).bucket!r}")
    return InputError(f"{where}: {text[:300] or type(exc).__name__}")


_FILESYSTEMS: dict[tuple, pafs.FileSystem] = {}


def _object_store(location: str, flag: str | None = None) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem for an object-store URI and the path in it ('bucket/prefix/...'). One filesystem per
    (scheme family, bucket) as long as the environment's settings stay the same."""
    loc = run_location(location)
    family, rest = loc.family, loc.path.strip("/")
    if not rest:
        raise InputError(f"{flag + ' ' if flag else ''}{location}: no bucket")
    bucket = loc.bucket
    # The settings that make a different filesystem; hashed, so that no secret is kept in the key.
    env = hash(tuple((k, v) for k, v in sorted(os.environ.items()) if k.startswith(("AWS_", "GOOGLE_", "GCE_", "STORAGE_EMULATOR_HOST"))))
    key = (family, bucket, env)
    if key not in _FILESYSTEMS:
        try:  # the store's own constructor: one way to reach object storage (endpoint, region from AWS_*)
            _FILESYSTEMS[key] = filesystem(Location(loc.scheme, bucket), caller_retries=True)[0]  # calls: _remote
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise _store_error(exc, str(location), flag) from exc
    return _FILESYSTEMS[key], rest


def _remote(location: str, flag: str | None, fn):
    """fn(), a call to the object store, retried as the store's calls are (jobs/store/retry.py: 5xx, 429, no answer,
    with backoff, for up to XSBERT_STORE_RETRY_S seconds); a failure for good is one InputError line."""
    try:
        return retried(fn, store_retry_s())
    except GaveUp as g:
        error = _store_error(g.error, location, flag)
        if transient(g.error):
            n = g.tries
            error = InputError(f"{error}, given up after {n} tr{'y' if n == 1 else 'ies'} in {g.waited:.0f} s "
                               "(XSBERT_STORE_RETRY_S)")  # fmt: skip
        raise error from g.error


def _info(location: str | os.PathLike, flag: str | None = None) -> pafs.FileInfo:
    """What is at a local path or object-store URI (type NotFound when nothing)."""
    location = as_run(location)
    if isinstance(location, Path):
        return pafs.LocalFileSystem().get_file_info(str(location))
    fs, path = _object_store(location, flag)
    return _remote(location, flag, lambda: fs.get_file_info(path))


def _list(location: str | os.PathLike, flag: str | None = None) -> list[pafs.FileInfo]:
    """The entries of a directory (local or object store), [] when there is none."""
    location = as_run(location)
    if isinstance(location, Path):
        return list(pafs.LocalFileSystem().get_file_info(pafs.FileSelector(str(location), allow_not_found=True)))
    fs, path = _object_store(location, flag)
    return _remote(location, flag, lambda: list(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))))


def is_file(location: str | os.PathLike) -> bool:
    """A file (object) is there."""
    return _info(location).type == pafs.FileType.File


def read_text(location: str | os.PathLike) -> str | None:
    """The text of a file (local or object store), None when there is none."""
    location = as_run(location)
    if isinstance(location, Path):
        return location.read_text(encoding="utf-8") if location.is_file() else None
    fs, path = _object_store(location)

    def read() -> bytes | None:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as fh:
            return fh.read()

    body = _remote(location, None, read)
    return None if body is None else body.decode("utf-8")


def _part_names(run: Run, table: str, flag: str | None = None) -> list[str]:
    """The names of the files in the run's `table` folder ([] when there is none)."""
    return [e.base_name for e in _list(join(run, table), flag) if e.type == pafs.FileType.File]


def committed(run: str | os.PathLike, flag: str | None = None, tables: tuple[str, ...] = TABLES) -> dict[str, list[str]]:
    """The run's committed parts, table -> their paths or URIs (sorted; tables without one left out): what its
    commits made visible (jobs.store.committed_parts), never a part of a wave that is being written or that a job
    stopped part-way left behind. Read as a whole once: the connection's snapshot of the run."""
    run = as_run(run)
    names = {t: _part_names(run, t, flag) for t in dict.fromkeys(("pairs", *tables))}
    waves = committed_waves(names["pairs"])
    out = {t: [str(join(run, t, n)) for n in committed_parts(t, names[t], waves)] for t in tables}
    return {t: parts for t, parts in out.items() if parts}


def has_table(run: str | os.PathLike, table: str) -> bool:
    """The run has at least one committed Parquet part of `table` (a local directory or an object-store URI)."""
    return table in committed(run, tables=(table,))


def check_run(run: str | os.PathLike, flag: str = "--run") -> Run:
    """The run directory (a Path, or an s3:// / gs:// URI), or an InputError saying what is wrong with it
    (missing, a store root, a missing bucket, an object store that cannot be reached or denies access, ...)."""
    try:
        loc = run_location(run)
    except InputError as exc:
        raise InputError(f"{flag} {exc}") from None
    if not loc.is_remote:
        path = Path(run)
        if not path.exists():
            raise InputError(f"{flag} {run}: no such directory")
        if not path.is_dir():
            raise InputError(f"{flag} {run}: not a directory")
        if not has_table(path, "pairs"):
            inner = sorted(p.name for p in path.iterdir() if p.is_dir() and has_table(p, "pairs"))
            raise InputError(f"{flag} {run}: not a run directory (no pairs/*.parquet){_runs_hint(inner)}")
        return path
    uri = loc.uri
    info = _info(uri, flag)
    if info.type == pafs.FileType.NotFound:
        bucket = loc.bucket
        root = Location(loc.scheme, bucket).uri
        if uri == root or _info(root, flag).type == pafs.FileType.NotFound:
            raise InputError(f"{flag} {run}: no such bucket {bucket!r}")
        raise InputError(f"{flag} {run}: no such directory")
    if info.type != pafs.FileType.Directory:
        raise InputError(f"{flag} {run}: not a directory")
    if not has_table(uri, "pairs"):
        entries = [e for e in _list(uri, flag) if e.type == pafs.FileType.Directory][:200]
        inner = sorted(e.base_name for e in entries if has_table(join(uri, e.base_name), "pairs"))
        raise InputError(f"{flag} {run}: not a run directory (no pairs/*.parquet){_runs_hint(inner)}")
    return uri


def _runs_hint(inner: list[str]) -> str:
    return f"; it holds the runs {', '.join(inner[:5])}{' ...' if len(inner) > 5 else ''}" if inner else ""


def missing_table_message(run: str | os.PathLike, table: str) -> str:
    """One line: the run lacks `table`, and what makes it."""
    make = MAKES.get(table)
    if table == "manifest":
        return f"run {run} has no manifest.json (written by python -m jobs.attribute)"
    return f"run {run} has no {table} table" + (f": run {make.format(run=run)}" if make else "")


def _duckdb_filesystem(location: str):
    """The pyarrow filesystem of an object-store URI as an fsspec filesystem for DuckDB
    (`con.register_filesystem`), under every URI scheme of its family (s3:// and s3a://, gs:// and gcs://); its
    calls retried as the store's are (jobs/store/reading.py)."""
    family = run_location(location).family
    protocols = tuple(s for s, f in REMOTE_SCHEMES.items() if f == family)  # DuckDB routes these to it
    return retried_fsspec(location, _object_store(location)[0], protocols)


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
    keys = "[" + ", ".join(map(_literal, snapshot)) + "]::varchar[]"
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
        if not _NAME_RE.match(name):
            raise InputError(f"variable name {name!r}: use letters, digits and _")
        con.execute(f"set variable {name} = {_literal(value)}")
    return con


def _list_literal(values: list[str]) -> str:
    return "[" + ", ".join(map(_literal, values)) + "]"


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


def _variable(con: duckdb.DuckDBPyConnection, name: str) -> str | None:
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
        if _variable(con, var) is None:
            which = "a second run: pass --run2 DIR" if var == "run2" else "a run: pass --run DIR"
            raise InputError(f"this analysis reads {which} (DuckDB variable {var!r})")
    for var, table, kind in inputs:
        run = as_run(_variable(con, var))
        there = is_file(join(run, f"{table}.json")) if kind == ".json" else has_table(run, table)
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


_GETVARIABLE_RE = re.compile(r"getvariable\(\s*'(\w+)'\s*\)", re.IGNORECASE)


def check_vars(name: str, sql: str, variables: dict[str, Any]) -> None:
    """An InputError naming every --var the file (with what it `.read`s) never reads, and those it does."""
    reads = set(_GETVARIABLE_RE.findall(sql)) - {"run", "run2"}
    unknown = sorted(set(variables) - reads)
    if unknown:
        known = ", ".join(sorted(reads)) or "none"
        raise InputError(f"--var {', '.join(unknown)}: {name} reads no such variable (it reads: {known})")


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
    first = one_line(exc)
    match = re.search(r"Table with name (\w+) does not exist", first)
    if match:
        name = match.group(1)
        second = name.endswith("_2")
        base = name[:-2] if second else name
        if base in TABLES:
            run = _variable(con, "run2" if second else "run")
            if run is None:
                return f"no view {name}: the second run's views ({base}_2, ...) need --run2 DIR"
            return missing_table_message(as_run(run), base)
    return first


def format_table(df: pl.DataFrame, max_rows: int) -> str:
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
    variables = parse_vars(args.var)
    sql = file_sql(args.file) if args.file else args.query
    if not sql.strip():
        raise InputError("the query is empty")
    if args.file:  # a misspelt --var would leave the file at its default without a word
        check_vars(args.file, sql, variables)
    con = connect(args.run, args.run2, variables)
    try:
        df = query(con, sql)
    except duckdb.Error as exc:
        raise InputError(error_line(exc, con)) from exc
    if args.csv:
        write_csv(df, out)
    else:
        print(format_table(df, args.max_rows), file=out)
    return 0
