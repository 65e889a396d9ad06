"""Runs, local or on object storage: where a run is (a Path, or an s3:// / gs:// URI as a str), what is there, and
its committed parts (docs/STORE.md, "Reading"), read through pyarrow's filesystems with the store's retries; every
failure one InputError line (unreachable, denied, no such bucket, not a run)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from xsbert_core import InputError

from ..store import (  # scheme -> family; DuckDB: all
    CREDENTIALS,
    GaveUp,
    Location,
    committed_parts,
    committed_waves,
    endpoint_name,
    filesystem,
    retried,
    store_retry_s,
    transient,
)

TABLES: tuple[str, ...] = ("pairs", "cells", "word_cells", "sentences", "quarantine", "parses")
# What to run when a table is missing (the attribution job writes every other table).
MAKES = {"parses": "python -m jobs.parse --run {run}"}
# A run: a local directory, or an object-store URI (str, no trailing slash).
Run = Path | str


def glob_escape(path: str) -> str:
    """`path` with DuckDB's glob characters taken literally (`[` -> `[[]`, `*` -> `[*]`, `?` -> `[?]`), so that
    `read_parquet(<path> || '/pairs/*.parquet')` reads a run whose folder is named like `runs[1]`."""
    return re.sub(r"([\[*?])", r"[\1]", path)


def glob_unescape(path: str) -> str:
    return re.sub(r"\[([\[*?])\]", r"\1", path)


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


def object_store(location: str, flag: str | None = None) -> tuple[pafs.FileSystem, str]:
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
    fs, path = object_store(location, flag)
    return _remote(location, flag, lambda: fs.get_file_info(path))


def _list(location: str | os.PathLike, flag: str | None = None) -> list[pafs.FileInfo]:
    """The entries of a directory (local or object store), [] when there is none."""
    location = as_run(location)
    if isinstance(location, Path):
        return list(pafs.LocalFileSystem().get_file_info(pafs.FileSelector(str(location), allow_not_found=True)))
    fs, path = object_store(location, flag)
    return _remote(location, flag, lambda: list(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))))


def is_file(location: str | os.PathLike) -> bool:
    """A file (object) is there."""
    return _info(location).type == pafs.FileType.File


def read_text(location: str | os.PathLike) -> str | None:
    """The text of a file (local or object store), None when there is none."""
    location = as_run(location)
    if isinstance(location, Path):
        return location.read_text(encoding="utf-8") if location.is_file() else None
    fs, path = object_store(location)

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


def no_manifest(run: str | os.PathLike, flag: str = "--run") -> InputError:
    """What a reader says of a run without manifest.json (jobs.attribute writes it last): one line."""
    return InputError(f"{flag} {run}: no manifest.json: a half-written run (python -m jobs.attribute writes it when the "
                      "run ends: still running, or killed before its end; rerun the same command to finish it)")


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
