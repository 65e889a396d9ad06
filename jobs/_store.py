"""The Parquet store: one directory per run (docs/STORE.md).

    <out>/<run_id>/manifest.json
    <out>/<run_id>/{pairs,cells,word_cells,sentences,quarantine}/part-<seq>.parquet

run_id = sha256(canonical JSON of the run config)[:16]; the config holds everything that changes
the numbers, and not which rows were selected (--limit/--sample), so a grown dataset or a larger
sample maps to the same run and only its new pairs are computed.

Writes are atomic: a wave's part files are written and fsynced under `_staging/`, then moved into
the table folders with os.replace, `pairs` last: a pairs part is the commit point of its wave.
Readers globbing `<table>/*.parquet` never see a half-written file. On open, the staging folder and
any cells/word_cells/sentences part without its pairs part (a commit cut short) are removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from xsbert_core.errors import XsbertError

logger = logging.getLogger(__name__)

STORE_VERSION = 3
TABLES: tuple[str, ...] = ("pairs", "cells", "word_cells", "sentences", "quarantine")
# Parts of these tables belong to the wave whose pairs part has the same name.
WAVE_TABLES: tuple[str, ...] = ("cells", "word_cells", "sentences")
# Tables that later jobs derive from a run (jobs.parse writes `parses`). Not in TABLES: `open` does not
# create their folders and `commit_missing_tables` gives them no empty part, so a run that was never
# parsed (no `parses/` folder) stays distinguishable from a parsed run without rows (an empty part).
DERIVED_TABLES: tuple[str, ...] = ("parses",)
# part-<seq>.parquet (written by the driver), or part-<seq>-<first ord>.parquet (a wave's cells or word cells,
# written by the stage-2 task that computed them, named by the first pair of its batch).
PART_RE = re.compile(r"^part-(\d{6})(?:-(\d{7}))?\.parquet$")
STAGING = "_staging"

_str, _i32, _i64, _f32, _f64, _bool = pa.string(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.bool_()
_ij = pa.list_(pa.struct([("i", _i32), ("j", _i32)]))  # cells by row and column
_uv = pa.list_(pa.struct([("u", _i32), ("v", _i32)]))  # word cells
# The tables' columns (docs/STORE.md); every part is cast to these, so all parts of a table agree.
SCHEMAS: dict[str, pa.Schema] = {
    "pairs": pa.schema(
        [("pair_id", _str), ("row", _i64), ("split", _str), ("label", _f64), ("text_a", _str), ("text_b", _str),
         ("sentence_id_a", _str), ("sentence_id_b", _str), ("n_tokens_a", _i32), ("n_tokens_b", _i32),
         ("score", _f64), ("attribution_sum", _f64), ("positive_sum", _f64), ("negative_sum", _f64),
         ("ref_sim_a", _f64), ("ref_sim_b", _f64), ("ref_term", _f64), ("target", _f64),
         ("completeness_error", _f64), ("factor_error_a", _f64), ("factor_error_b", _f64),
         ("steps_a", _i32), ("steps_b", _i32), ("truncated_a", _bool), ("truncated_b", _bool),
         ("n_cells", _i32), ("n_word_cells", _i32), ("top10_abs", _ij), ("top10_value", _ij),
         ("content_top10_abs", _ij), ("content_top10_value", _ij), ("word_top10_abs", _uv), ("word_top10_value", _uv)]
    ),
    "cells": pa.schema(
        [("pair_id", _str), ("i", _i32), ("j", _i32), ("token_a", _str), ("token_b", _str), ("value", _f64),
         ("value_rank", _f32), ("content_rank", _f32)]
    ),
    "word_cells": pa.schema(
        [("pair_id", _str), ("u", _i32), ("v", _i32), ("word_a", _str), ("word_b", _str), ("value", _f64),
         ("value_rank", _f32)]
    ),
    "sentences": pa.schema(
        [("sentence_id", _str), ("text", _str), ("n_tokens", _i32), ("n_words", _i32),
         ("tokens", pa.list_(_str)), ("word_ids", pa.list_(_i32)), ("token_start", pa.list_(_i32)),
         ("token_end", pa.list_(_i32)), ("words", pa.list_(_str)), ("factor_error", _f64), ("n_steps", _i32),
         ("truncated", _bool), ("embedding_norm", _f64), ("embedding", pa.list_(pa.float32())),
         ("reference_embedding", pa.list_(pa.float32()))]
    ),
    "quarantine": pa.schema(
        [("row", _i64), ("pair_id", _str), ("reason", _str), ("detail", _str), ("text_a", _str), ("text_b", _str),
         ("label", _str)]
    ),
    # One row per (sentence_id, u): the UD parse of sentences.words[u] (jobs.parse, docs/STORE.md).
    "parses": pa.schema(
        [("sentence_id", _str), ("u", _i32), ("word", _str), ("upos", _str), ("deprel", _str), ("deprel_raw", _str),
         ("head", _i32), ("aligned", _bool), ("alignment", _str), ("parser", _str), ("parser_version", _str),
         ("parser_model", _str)]
    ),
}  # fmt: skip

# Parquet settings, fixed so that the same rows always give the same bytes.
PARQUET_OPTIONS = dict(compression="zstd", use_dictionary=True, write_statistics=True, row_group_size=1 << 20)
# Where a row is large (a `sentences` row holds the sentence's tokens, words and two D-float vectors, ~3.6 KB at
# D = 384): row groups of 4,096 rows, since pyarrow encodes a row group whole before writing it, and the vectors as
# BYTE_STREAM_SPLIT floats without a dictionary (a dictionary of distinct floats only falls back, per row group).
# On the 404k rehearsal's largest part (29,612 sentences, system allocator): the write took +95 MB above the table
# and 46.1 MB on disk with one group and dictionaries everywhere, +25 MB and 43.2 MB with these settings
# (bench/driver_peaks.py parquet-write, bench/results/scale.md).
ROW_GROUP_ROWS = {"sentences": 4096}
VECTOR_COLUMNS = {"sentences": ("embedding", "reference_embedding")}


def _leaf(field: pa.Field) -> str:
    return f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name


def parquet_options(table: str | None = None, schema: pa.Schema | None = None) -> dict[str, Any]:
    """The fixed Parquet settings for a part of `table` with columns `schema` (default: the table's schema)."""
    options = {**PARQUET_OPTIONS, "row_group_size": ROW_GROUP_ROWS.get(table or "", PARQUET_OPTIONS["row_group_size"])}
    vectors = VECTOR_COLUMNS.get(table or "", ())
    if vectors:
        fields = list(schema if schema is not None else SCHEMAS[table])  # type: ignore[index]
        options["use_dictionary"] = [_leaf(f) for f in fields if f.name not in vectors]
        options["column_encoding"] = {_leaf(f): "BYTE_STREAM_SPLIT" for f in fields if f.name in vectors}
    return options


def part_seq(name: str) -> int | None:
    """The wave (commit sequence number) a part file belongs to; None for a name that is not a part."""
    m = PART_RE.match(name)
    return int(m.group(1)) if m else None


def part_name(seq: int, first: int | None = None) -> str:
    return f"part-{seq:06d}.parquet" if first is None else f"part-{seq:06d}-{first:07d}.parquet"


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def run_id(config: dict[str, Any]) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of the run config."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_parquet(data: pa.Table, where: str | Path, table: str | None, filesystem: Any = None) -> None:
    """Write `data`, a part of `table` (None: not a store table), to `where` (a local path, or a path on
    `filesystem`) with the store's fixed Parquet settings for that table."""
    pq.write_table(data, where, filesystem=filesystem, **parquet_options(table, data.schema))


def write_parquet_synced(data: pa.Table, path: Path, table: str | None) -> None:
    """`write_parquet` to the local file `path`, and fsync it."""
    write_parquet(data, path, table)
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True, allow_nan=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def disk_failure(path: str | os.PathLike, exc: OSError, doing: str = "cannot write") -> StoreError:
    """One line for a failed local write: the path and the errno (pyarrow's own errors often name neither)."""
    num = exc.errno
    if num is None:
        m = re.search(r"errno[ :]*(\d+)", str(exc), re.I)
        num = int(m.group(1)) if m else None
    why = f"[Errno {num}] {os.strerror(num)}" if num else " ".join(str(exc).split())[:300]
    hint = {28: "; free space there and rerun the same command", 30: "; the store is read-only",
            13: "; the store is not writable by this user"}.get(num or 0, "")  # fmt: skip
    return StoreError(f"{doing} {path}: {why}{hint}")


# Pair ids per pair_keys() call: bounds the Python strings alive at once while hashing.
KEY_SLICE = 65_536


def pair_keys(ids: Any) -> np.ndarray:
    """64-bit keys of pair ids (SipHash-2-4 of the string, pandas' hash_array), one per id, nulls included.

    How the driver of a large run holds pair ids (8 bytes each instead of a Python string: ~100): to find
    duplicates and the pairs a store holds already. Two different ids share a key with probability ~n^2 / 2^65
    (4e-9 for 404k pairs)."""
    import pandas as pd

    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks != 1 else ids.chunk(0)
    if not isinstance(ids, pa.Array):
        ids = pa.array(list(ids), pa.string())
    out = np.empty(len(ids), np.uint64)
    for start in range(0, len(ids), KEY_SLICE):
        values = ids.slice(start, KEY_SLICE).to_numpy(zero_copy_only=False).astype(object)
        out[start : start + len(values)] = pd.util.hash_array(values, categorize=False)
    return out


class RunStore:
    """One run directory: its tables, its manifest, and a lock so that one writer works on it at a time."""

    def __init__(self, root: str | os.PathLike, rid: str, extra_pair_columns: tuple[str, ...] = ()) -> None:
        self.root = Path(root)
        self.run_id = rid
        self.path = self.root / rid
        self.extra_pair_columns = tuple(extra_pair_columns)  # pass-through columns (strings) after SCHEMAS' own
        self._lock_fh = None
        self.read_only: StoreError | None = None  # why nothing can be written, when opened on a read-only store

    def schema(self, table: str) -> pa.Schema:
        """The table's schema in this run: SCHEMAS[table], and for `pairs` the pass-through string columns."""
        schema = SCHEMAS[table]
        if table == "pairs":
            for name in self.extra_pair_columns:
                schema = schema.append(pa.field(name, pa.string()))
        return schema

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> RunStore:
        """Create the folders, take the writer lock, clean up what an interrupted run left.

        On a read-only file system (or one this user cannot write) the run opens read-only when it exists: a rerun
        with nothing to do answers as usual, and the first write says why it cannot be made."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for table in TABLES:
                (self.path / table).mkdir(exist_ok=True)
            self._lock_fh = open(self.path / ".lock", "w")
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not self.path.is_dir():
                raise disk_failure(self.path, exc, "cannot open the store") from None
            self.read_only = disk_failure(self.path, exc)
            self._lock_fh = open(self.path / ".lock") if (self.path / ".lock").exists() else None
        if self._lock_fh is not None:
            try:
                fcntl.flock(self._lock_fh, (fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except OSError as exc:
                self._lock_fh.close()
                self._lock_fh = None
                raise StoreError(f"another run is writing {self.path} (lock held)") from exc
        self.recover()
        return self

    def check_writable(self) -> None:
        """Raise the StoreError that says why this run cannot be written (opened on a read-only store), if so."""
        if self.read_only is not None:
            raise self.read_only

    def close(self) -> None:
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def __enter__(self) -> RunStore:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def recover(self) -> list[Path]:
        """Remove the staging folder and wave parts whose pairs part never landed; return what was removed."""
        removed: list[Path] = []
        staging = self.path / STAGING
        if staging.exists():
            removed.append(staging)
        committed = {part_seq(p.name) for p in self.parts("pairs")}
        for table in WAVE_TABLES:
            removed += [part for part in self.parts(table) if part_seq(part.name) not in committed]
            folder = self.path / table
            removed += sorted(folder.glob(".part-*.tmp")) if folder.exists() else []  # a worker's write cut short
        if removed:
            self.check_writable()  # a read-only store with a commit cut short: say so rather than read around it
        try:
            for path in removed:
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        except OSError as exc:
            raise disk_failure(exc.filename or self.path, exc, "cannot clean up") from None
        return removed

    # ------------------------------------------------------------------ reading
    def parts(self, table: str) -> list[Path]:
        folder = self.path / table
        if not folder.exists():
            return []
        return sorted(p for p in folder.iterdir() if PART_RE.match(p.name))

    def read_column(self, table: str, column: str) -> list[Any]:
        values: list[Any] = []
        for part in self.parts(table):
            values.extend(pq.read_table(part, columns=[column]).column(column).to_pylist())
        return values

    def read_table(self, table: str, columns: list[str] | None = None) -> pa.Table | None:
        parts = self.parts(table)
        if not parts:
            return None
        return pa.concat_tables([pq.read_table(p, columns=columns) for p in parts])

    def _read(self, part: Any, columns: list[str] | None = None) -> pa.Table:
        return pq.read_table(part, columns=columns)

    def column(self, table: str, column: str) -> pa.ChunkedArray:
        """One column of every part, as Arrow (no Python object per value)."""
        type_ = SCHEMAS[table].field(column).type
        chunks = [c.cast(type_) for part in self.parts(table) for c in self._read(part, [column]).column(column).chunks]
        return pa.chunked_array(chunks, type_)

    def done_pair_ids(self) -> set[str]:
        return set(self.read_column("pairs", "pair_id"))

    def done_pair_keys(self) -> np.ndarray:
        """The stored pairs' ids as sorted 64-bit keys (pair_keys): what a large run's driver holds of them."""
        return np.unique(pair_keys(self.column("pairs", "pair_id")))

    def quarantine_keys(self) -> set[tuple[int, str | None, str]]:
        t = self.read_table("quarantine", ["row", "pair_id", "reason"])
        if t is None:
            return set()
        return set(zip(t.column("row").to_pylist(), t.column("pair_id").to_pylist(), t.column("reason").to_pylist()))

    def next_seq(self) -> int:
        parts = [p for t in TABLES + DERIVED_TABLES for p in self.parts(t)]
        return max((part_seq(p.name) for p in parts), default=-1) + 1  # type: ignore[type-var]

    def wave_parts(self, table: str, seq: int) -> list[str]:
        """Names of the parts of wave `seq` in `table` (the driver's and the workers')."""
        return [p.name for p in self.parts(table) if part_seq(p.name) == seq]

    def settle(self, seq: int, expected: dict[str, set[str]]) -> None:
        """Before wave `seq` commits: every part its tasks reported is there, and no other part of the wave is
        (a task attempt that a retry replaced with other batches would have left one); the extras are deleted."""
        for table, names in expected.items():
            present = set(self.wave_parts(table, seq))
            missing = names - present
            if missing:
                raise StoreError(f"{self.path}: {len(missing)} {table} part(s) of wave {seq} reported written "
                                 f"but not in the store (first: {sorted(missing)[0]})")  # fmt: skip
            for extra in sorted(present - names):
                self._delete(table, extra)

    def _delete(self, table: str, name: str) -> None:
        (self.path / table / name).unlink(missing_ok=True)

    def sink(self) -> PartSink:
        """What a stage-2 task needs to write this run's parts itself (picklable; no credentials)."""
        self.check_writable()
        return PartSink(root=str(self.path), remote=False)

    # ------------------------------------------------------------------ writing
    def commit(self, seq: int, tables: dict[str, pa.Table], keep_empty: bool = False) -> list[Path]:
        """Write `tables` (cast to `schema(table)`) as part-<seq> of each table, atomically per file, `pairs` last.

        Empty tables are skipped unless `keep_empty`. Returns the final paths.
        """
        self.check_writable()
        name = part_name(seq)
        staging = self.path / STAGING / f"{seq:06d}"
        staged: list[tuple[Path, Path]] = []
        order = sorted(tables, key=lambda t: (t == "pairs", (TABLES + DERIVED_TABLES).index(t)))
        where = staging
        try:
            staging.mkdir(parents=True, exist_ok=True)
            for table in order:
                data = tables[table]
                if data is None or (data.num_rows == 0 and not keep_empty):
                    continue
                data = data.select(self.schema(table).names).cast(self.schema(table))
                where = tmp = staging / f"{table}.parquet"
                write_parquet_synced(data, tmp, table)
                staged.append((tmp, self.path / table / name))
            for tmp, final in staged:  # `pairs` last: the wave is committed once its pairs part is in place
                where = final
                os.replace(tmp, final)
                _fsync_dir(final.parent)
        except OSError as exc:  # a full disk: nothing of the wave is committed unless its pairs part landed
            shutil.rmtree(staging, ignore_errors=True)  # give the space back at once (the next open would too)
            raise disk_failure(where, exc) from None
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.path / STAGING).rmdir()
        return [final for _, final in staged]

    def commit_missing_tables(self) -> list[Path]:
        """Give every table without a part an empty one, so that `read_parquet('<table>/*.parquet')` works
        on any run (no quarantined row, or every pair quarantined). A wave table's empty part comes with
        an empty `pairs` part of the same name, its commit point."""
        missing = [t for t in TABLES if not self.parts(t)]
        if not missing:
            return []
        if any(t in WAVE_TABLES for t in missing) and "pairs" not in missing:
            missing.append("pairs")
        return self.commit(self.next_seq(), {t: self.schema(t).empty_table() for t in missing}, keep_empty=True)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self.check_writable()
        try:
            write_json_atomic(self.path / "manifest.json", manifest)
        except OSError as exc:
            (self.path / ".manifest.json.tmp").unlink(missing_ok=True)
            raise disk_failure(self.path / "manifest.json", exc) from None

    def read_manifest(self) -> dict[str, Any] | None:
        path = self.path / "manifest.json"
        if not path.exists():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def counts(self) -> dict[str, int]:
        """Rows per table (from the Parquet footers, no data read)."""
        return {t: sum(pq.ParquetFile(p).metadata.num_rows for p in self.parts(t)) for t in TABLES}

    def files(self) -> Iterator[Path]:
        yield from sorted(p for p in self.path.rglob("*") if p.is_file() and p.name != ".lock")


# --------------------------------------------------------------------------- object storage
# On S3 and GCS there is no rename and no lock, but every upload is atomic (an object is visible whole or not at
# all) and an upload can be conditional: S3's If-None-Match: * and GCS's ifGenerationMatch=0 create only if absent.
# The protocol (docs/STORE.md, "On object storage"):
# - writer lock: <run>/_lock.json created only if absent; it names its owner (host, pid, a random token) and an
#   expiry that a heartbeat thread pushes forward; a lock whose owner is a dead process on this host, or whose
#   expiry has passed, is taken over (deleted, then created again only if absent, so of two writers racing for it
#   one wins); before each commit the writer checks the lock is still its own.
# - commit: each table's part is one upload of its final name, `pairs` last: the pairs part is the commit point.
# - recovery on open: cells/word_cells/sentences parts without their pairs part are deleted.
LOCK_NAME = "_lock.json"
LOCK_TTL_S = float(os.environ.get("XSBERT_LOCK_TTL_S", "120"))
LOCK_READ_TRIES = 4  # reads of the lock by a part writer before an unreadable body counts as "not this run's"
# How long pyarrow's GCS client retries a failing request, in seconds (XSBERT_GCS_RETRY_S; pyarrow's own default is
# 15 minutes: an unreachable endpoint would hang the job that long before it says so).
GCS_RETRY_S = 30.0
# Object-store URI schemes -> their family (pyarrow's filesystem type); jobs/_sql.py reads runs under all of them.
REMOTE_SCHEMES: dict[str, str] = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
# Where a run can be written: both families have the conditional create the writer lock needs (S3 through boto3,
# GCS through google-cloud-storage; pyarrow exposes neither).
WRITABLE_FAMILIES = ("s3", "gcs")
# How long one object-store call is retried when the store answers 5xx / 429 or the connection fails (a loaded
# store, a network blip), in seconds: backoff doubling from RETRY_FIRST_S up to RETRY_MAX_SLEEP_S, each sleep drawn
# uniformly below it (full jitter, so that many workers do not retry in step). `--store-retry-s` of jobs.attribute,
# XSBERT_STORE_RETRY_S for every job. After that the job stops in one line (exit 2); the same command resumes.
STORE_RETRY_S = 120.0
RETRY_FIRST_S = 0.2
RETRY_MAX_SLEEP_S = 10.0


def store_retry_s() -> float:
    """The deadline of one store call's retries: XSBERT_STORE_RETRY_S, else STORE_RETRY_S."""
    text = os.environ.get("XSBERT_STORE_RETRY_S", "").strip()
    try:
        return max(0.0, float(text)) if text else STORE_RETRY_S
    except ValueError:
        raise StoreError(f"XSBERT_STORE_RETRY_S={text!r} is not a number of seconds") from None


# What a store's answer or a dropped connection looks like in the clients' errors: pyarrow's S3 filesystem ("AWS
# Error SLOW_DOWN during PutObject operation", "(HTTP status 503)", curl's codes), boto3 (status and code in
# ClientError.response, ConnectionClosedError / EndpointConnectionError), pyarrow's GCS filesystem and
# google-cloud-storage (status names, api_core exceptions with .code).
_AWS_CODES = {"SLOW_DOWN": 503, "SERVICE_UNAVAILABLE": 503, "INTERNAL_FAILURE": 500, "THROTTLING": 429,
              "ACCESS_DENIED": 403, "INVALID_ACCESS_KEY_ID": 403, "SIGNATURE_DOES_NOT_MATCH": 403,
              "NO_SUCH_BUCKET": 404, "REQUEST_TIMEOUT": 408}  # fmt: skip
_TRANSIENT_TEXT = ("network_connection", "curlcode", "connection reset", "connection was closed", "connection aborted",
                   "broken pipe", "timed out", "timeout", "could not connect", "couldn't connect", "connection refused",
                   "unavailable", "deadline_exceeded", "slowdown", "slow down", "internalerror", "internal error",
                   "try again", "temporarily")  # fmt: skip


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed store call, None when no response came (or none is named)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    code = getattr(exc, "code", None)  # google.api_core exceptions
    if isinstance(code, int) and 100 <= code < 600:
        return code
    text = str(exc)
    m = re.search(r"HTTP status (\d{3})", text) or re.search(r"\bstatus(?: code)?[ :=]+(\d{3})\b", text, re.I)
    if m:
        return int(m.group(1))
    m = re.search(r"AWS Error ([A-Z_]+)", text)
    if m and m.group(1) in _AWS_CODES:
        return _AWS_CODES[m.group(1)]
    return None


def transient(exc: BaseException) -> bool:
    """A failure worth retrying: 5xx, 408, 429, or no answer at all (reset, refused, timed out)."""
    if isinstance(exc, StoreError):
        return False
    low = str(exc).lower()
    if "nosuchupload" in low or "no_such_upload" in low:  # a multipart upload whose completion's answer was lost:
        return True  # the whole upload is tried again (same name, same bytes)
    status = http_status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    name = type(exc).__name__
    if name in ("ConnectionClosedError", "EndpointConnectionError", "ReadTimeoutError", "ConnectTimeoutError",
                "ConnectionError", "ProtocolError", "ConnectionResetError", "TimeoutError"):  # fmt: skip
        return True
    return any(k in low for k in _TRANSIENT_TEXT)


class GaveUp(Exception):
    """A store call failed for good: `error` after `tries` tries in `waited` seconds."""

    def __init__(self, error: BaseException, tries: int, waited: float) -> None:
        super().__init__(str(error))
        self.error, self.tries, self.waited = error, tries, waited


def retried(fn, deadline_s: float, sleep=None):
    """fn(), tried again on transient failures (backoff with full jitter) for up to `deadline_s` seconds; GaveUp
    with the last error when a failure is not transient or the deadline would pass."""
    import random
    import time as _time

    sleep = sleep or _time.sleep
    start = _time.monotonic()
    tries = 0
    while True:
        tries += 1
        try:
            return fn()
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below; anything else is re-raised as GaveUp
            waited = _time.monotonic() - start
            pause = random.uniform(0, min(RETRY_MAX_SLEEP_S, RETRY_FIRST_S * 2 ** (tries - 1)))
            if not transient(exc) or waited + pause > deadline_s:
                raise GaveUp(exc, tries, waited) from exc
            logger.info("store call failed (%s), try %d again in %.2f s", " ".join(str(exc).split())[:200], tries + 1,
                        pause)  # fmt: skip
            sleep(pause)


def describe_failure(exc: BaseException) -> str:
    """What came back: `HTTP 503 (SlowDown)`, `no response (connection reset)`, ..."""
    status = http_status(exc)
    text = " ".join(str(exc).split())
    code = None
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
    if code is None:
        m = re.search(r"AWS Error ([A-Z_]+)", text)
        code = m.group(1) if m and m.group(1) != "UNKNOWN" else None
    if status is not None:
        return f"HTTP {status}" + (f" ({code})" if code else "")
    low = text.lower()
    if "refused" in low or "couldn't connect" in low or "could not connect" in low or "curlcode: 7," in low:
        return "no response (connection refused)"
    if "reset" in low or "closed" in low or "curlcode: 56" in low or "curlcode: 52" in low:
        return "no response (connection reset)"
    if "timed out" in low or "timeout" in low:
        return "no response (timed out)"
    return type(exc).__name__


class StoreError(XsbertError, RuntimeError):
    """The store cannot be reached or written (endpoint, bucket, credentials, a lock held by another writer)."""


_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def uri_scheme(location: str | os.PathLike, error: type[Exception] = StoreError) -> str | None:
    """The object-store scheme of `location` ('s3', 's3a', 'gs', 'gcs'), None for a local path; `error` for any
    other `scheme://` (az://, http://, file://, ...): never taken for a local folder. The one parser of store
    locations (jobs/_sql.py raises its InputError through it)."""
    m = _SCHEME_RE.match(str(location))
    if m is None:
        return None
    name = m.group(1).lower()
    if name not in REMOTE_SCHEMES:
        raise error(f"{location}: unsupported location (a local path, or {', '.join(s + '://' for s in REMOTE_SCHEMES)})")
    return name


def is_remote(root: str | os.PathLike) -> bool:
    """`root` is an object-storage URI (s3://, gs://), not a local path; StoreError for a scheme without a backend."""
    return uri_scheme(root) is not None


def redact(uri: str) -> str:
    """The URI without user info or query (never write credentials into a manifest or a log)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    host = parts.hostname or ""
    return urlunsplit((parts.scheme, host + (f":{parts.port}" if parts.port else ""), parts.path, "", ""))


def gcs_emulator() -> str | None:
    """STORAGE_EMULATOR_HOST (google-cloud-storage's variable for a GCS endpoint other than Google's), or None."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def fs_settings(uri: str) -> dict[str, str]:
    """The non-secret connection settings of `uri`'s store, from this process's environment: for S3 the endpoint
    (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL) and region, for GCS the endpoint of STORAGE_EMULATOR_HOST. They
    travel to the workers that write parts, as a pyarrow filesystem pickled by Ray Data would carry them;
    credentials never do (workers use their own: the node's instance role or profile, a Kubernetes Secret or
    service account, the node's environment; never a job's runtime_env, which Ray shows with the job)."""
    from urllib.parse import urlsplit

    scheme = urlsplit(uri).scheme.lower()
    out: dict[str, str] = {}
    if scheme in ("gs", "gcs"):
        emulator = gcs_emulator()
        if emulator:  # an emulator checks no credentials; Google's endpoint is pyarrow's default
            ep = urlsplit(emulator)
            out.update(endpoint_override=ep.netloc, scheme=ep.scheme or "http", anonymous="true")
        return out
    if scheme not in ("s3", "s3a"):
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        ep = urlsplit(endpoint)
        out.update(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        out["region"] = region
    return out


def filesystem(uri: str, settings: dict[str, str] | None = None):
    """(pyarrow FileSystem, path inside it) for an s3:// or gs:// URI. S3 credentials, region and endpoint come
    the standard way: AWS_* variables (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 for S3-compatible stores), the
    shared config files, instance roles; GCS credentials from Google's application default credentials
    (GOOGLE_APPLICATION_CREDENTIALS, the node's service account), STORAGE_EMULATOR_HOST for another endpoint;
    `settings` (fs_settings of the driver) overrides endpoint and region."""
    from datetime import timedelta
    from urllib.parse import urlsplit

    import pyarrow.fs as pafs

    parts = urlsplit(uri)
    if parts.query or parts.username or parts.password:
        raise StoreError(f"{redact(uri)}: put credentials and options in the environment (AWS_*, "
                         "GOOGLE_APPLICATION_CREDENTIALS), not in the URI")  # fmt: skip
    scheme = parts.scheme.lower()
    path = (parts.netloc + parts.path).rstrip("/")
    chosen = fs_settings(uri) if settings is None else dict(settings)
    if scheme in ("s3", "s3a"):
        return pafs.S3FileSystem(**chosen), path
    if scheme in ("gs", "gcs"):
        anonymous = chosen.pop("anonymous", "") == "true"
        return pafs.GcsFileSystem(anonymous=anonymous, retry_time_limit=timedelta(seconds=float(os.environ.get("XSBERT_GCS_RETRY_S", GCS_RETRY_S))),
                                  **chosen), path  # fmt: skip
    raise StoreError(f"{redact(uri)}: unsupported scheme {scheme!r} (use a local path, s3:// or gs://)")


def store_failure(root: str, exc: BaseException, doing: str, key: str | None = None,
                  gave_up: GaveUp | None = None) -> StoreError:
    """One line for a failed store call: what was being done, on which object, what came back (the HTTP status, or
    that no response came), after how many tries; the credentials hint only for 401/403."""
    text = " ".join(str(exc).split())
    low = text.lower()
    status = http_status(exc)
    gcs = REMOTE_SCHEMES.get(str(root).split("://", 1)[0].lower()) == "gcs"
    got = describe_failure(exc)
    if "nosuchbucket" in low or "bucket does not exist" in low or "the specified bucket does not exist" in low:
        why = "the bucket does not exist"
    elif gcs and ("404" in low or "notfound" in low) and "bucket" in low:
        why = "the bucket does not exist"
    elif status in (401, 403) or (gcs and ("default credentials" in low or "defaultcredentialserror" in low
                                           or "unauthenticated" in low or "permission_denied" in low)):  # fmt: skip
        where = ("GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`" if gcs
                 else "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE")  # fmt: skip
        why = (f"access denied ({got}): check the credentials ({where}; on a cluster the node's role / instance "
               "profile or service account, or a Kubernetes Secret)")  # fmt: skip
    elif status is None and transient(exc) and ("refused" in got or "resolve" in low or "connect" in low):
        why = ("cannot reach the storage endpoint "
               + ("(STORAGE_EMULATOR_HOST / network)" if gcs else "(AWS_ENDPOINT_URL / network)") + f": {got}")  # fmt: skip
    elif transient(exc):
        why = f"the store did not answer ({got})"
    else:
        why = f"{got}: {text[:300]}" if got != type(exc).__name__ else text[:300]
    where = f" {key}" if key else ""
    tries = ""
    if gave_up is not None and transient(exc):
        n = gave_up.tries
        tries = (f", given up after {n} tr{'y' if n == 1 else 'ies'} in {gave_up.waited:.0f} s "
                 "(--store-retry-s / XSBERT_STORE_RETRY_S)")  # fmt: skip
    return StoreError(f"{redact(str(root))}: {doing}{where}: {why}{tries}")


def lock_expiry() -> int:
    """When a lock written now expires: whole seconds, so that every body of one writer's lock has the same
    length (a reader that sizes the object first, as pyarrow does, and races a renewal still reads a whole body)."""
    import math
    import time as _time

    return math.ceil(_time.time() + LOCK_TTL_S)


def _s3_client(settings: dict[str, str] | None = None):
    """A boto3 S3 client from a fresh session: credentials as the environment says now (boto3's default session
    would keep the first ones it resolved for the life of the process); `settings` (fs_settings) override the
    endpoint and region. Short timeouts and few retries of its own: the store's calls are retried by `retried`."""
    import boto3
    from botocore.config import Config

    kwargs: dict[str, Any] = {}
    if settings and settings.get("endpoint_override"):
        kwargs["endpoint_url"] = f"{settings.get('scheme', 'https')}://{settings['endpoint_override']}"
    if settings and settings.get("region"):
        kwargs["region_name"] = settings["region"]
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"})
    return boto3.session.Session().client("s3", config=config, **kwargs)


class LockObject:
    """The run's writer-lock object, through the storage's own client (pyarrow has no conditional writes):
    read it, create it only if absent, overwrite it (heartbeat), delete it. S3: boto3, If-None-Match: *.
    GCS: google-cloud-storage, ifGenerationMatch=0."""

    def __init__(self, family: str, bucket: str, key: str) -> None:
        self.family, self.bucket, self.key = family, bucket, key

    def _blob(self):
        from google.cloud import storage

        emulator = gcs_emulator()
        if emulator:
            from google.auth.credentials import AnonymousCredentials

            client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "emulator",
                                    credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator})
        else:
            client = storage.Client()
        return client.bucket(self.bucket).blob(self.key)

    def read(self) -> bytes | None:
        """The lock's body, None when there is none."""
        if self.family == "gcs":
            from google.api_core.exceptions import NotFound

            try:
                return self._blob().download_as_bytes()
            except NotFound:
                return None
        client = _s3_client()
        try:
            return client.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        except client.exceptions.NoSuchKey:
            return None

    def create(self, body: bytes) -> bool:
        """Create the object only if absent; False when it exists (another writer has the lock)."""
        if self.family == "gcs":
            from google.api_core.exceptions import PreconditionFailed

            try:
                self._blob().upload_from_string(body, content_type="application/json", if_generation_match=0)
            except PreconditionFailed:
                return False
            return True
        from botocore.exceptions import ClientError

        try:
            _s3_client().put_object(Bucket=self.bucket, Key=self.key, Body=body, IfNoneMatch="*",
                                    ContentType="application/json")  # fmt: skip
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return False
            raise
        return True

    def put(self, body: bytes) -> None:
        if self.family == "gcs":
            self._blob().upload_from_string(body, content_type="application/json")
        else:
            _s3_client().put_object(Bucket=self.bucket, Key=self.key, Body=body, ContentType="application/json")

    def delete(self) -> None:
        if self.family == "gcs":
            from google.api_core.exceptions import NotFound

            try:
                self._blob().delete()
            except NotFound:
                pass
        else:
            _s3_client().delete_object(Bucket=self.bucket, Key=self.key)


class ObjectRunStore(RunStore):
    """A run on object storage (s3://bucket/prefix/<run id>), with the guarantees of the local store."""

    def __init__(self, root: str, rid: str, extra_pair_columns: tuple[str, ...] = (),
                 retry_s: float | None = None) -> None:  # fmt: skip
        self.root = root.rstrip("/")
        self.retry_s = store_retry_s() if retry_s is None else retry_s
        self.read_only = None
        self.run_id = rid
        self.extra_pair_columns = tuple(extra_pair_columns)
        from urllib.parse import urlsplit

        parts = urlsplit(self.root)
        self._fs = None  # made on first use: constructing a GCS filesystem may wait for a metadata server
        self.base = f"{(parts.netloc + parts.path).rstrip('/')}/{rid}"
        self.scheme = self.root.split("://", 1)[0].lower()
        self.path = f"{self.scheme}://{self.base}"  # type: ignore[assignment]  # a URI, not a Path
        self._lock_fh = None
        self._lock: dict[str, Any] | None = None
        self._beat: Any = None

    # ------------------------------------------------------------------ access and errors
    @property
    def fs(self):
        if self._fs is None:
            self._fs, _ = filesystem(self.root)
        return self._fs

    def _key(self, *parts: str) -> str:
        return "/".join((self.base, *parts))

    def _bucket_key(self, *parts: str) -> tuple[str, str]:
        bucket, _, key = self._key(*parts).partition("/")
        return bucket, key

    def _fail(self, exc: BaseException, doing: str, key: str | None = None) -> StoreError:
        return store_failure(self.root, exc, doing, key)

    def _call(self, doing: str, key: str | None, fn, deadline_s: float | None = None):
        """fn() retried on transient failures for up to the store's deadline; a StoreError saying what failed."""
        try:
            return retried(fn, self.retry_s if deadline_s is None else deadline_s)
        except GaveUp as g:
            raise store_failure(self.root, g.error, doing, key, g) from None

    def check(self) -> None:
        """Reach the bucket before anything is computed (a missing bucket, denied credentials, no endpoint)."""
        import pyarrow.fs as pafs

        bucket = self.base.split("/", 1)[0]
        info = self._call("cannot open the store", f"(HEAD of the bucket {bucket!r})",
                          lambda: self.fs.get_file_info(bucket))  # fmt: skip
        if info.type == pafs.FileType.NotFound:
            raise StoreError(f"{redact(self.root)}: cannot open the store: the bucket {bucket!r} does not exist")

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> ObjectRunStore:
        if REMOTE_SCHEMES[self.scheme] not in WRITABLE_FAMILIES:
            raise StoreError(f"{redact(self.root)}: writing a run to {self.scheme}:// is not supported")
        self.check()
        self._acquire()
        try:
            self.recover()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._beat is not None:
            self._beat[0].set()
            self._beat[1].join(timeout=5)
            self._beat = None
        if self._lock is not None:
            try:  # a short deadline: a lock left behind is taken over by the next run (dead pid, or expired)
                if self._lock_is_mine(deadline_s=min(self.retry_s, 10.0)):
                    # every write of this writer is over: an upload that a client's own retry left unfinished goes
                    abort_uploads(self.root, self._key(), min(self.retry_s, 10.0))
                    self._call("cannot remove the writer lock", LOCK_NAME, self._lock_object().delete,
                               deadline_s=min(self.retry_s, 10.0))  # fmt: skip
            except Exception:  # noqa: BLE001 - the lock expires by itself
                logger.warning("could not remove the writer lock of %s; it expires in %.0f s", self.path, LOCK_TTL_S)
            self._lock = None

    # ------------------------------------------------------------------ the writer lock
    def _lock_object(self) -> LockObject:
        return LockObject(REMOTE_SCHEMES[self.scheme], *self._bucket_key(LOCK_NAME))

    def _read_lock(self, deadline_s: float | None = None) -> dict[str, Any] | None:
        """The lock's owner record; None when no lock exists, {} when it cannot be read as one."""
        body = self._call("cannot read the writer lock", LOCK_NAME, self._lock_object().read, deadline_s)
        if body is None:
            return None
        try:
            held = json.loads(body)
        except ValueError:
            return {}
        return held if isinstance(held, dict) else {}

    def _lock_is_mine(self, deadline_s: float | None = None) -> bool:
        held = self._read_lock(deadline_s)
        return bool(held) and self._lock is not None and held.get("token") == self._lock["token"]

    def _put_lock(self, body: dict[str, Any]) -> bool:
        """Create the lock object only if absent; False when it exists already (whoever created it)."""
        data = canonical_json(body).encode()
        return self._call("cannot take the writer lock", LOCK_NAME, lambda: self._lock_object().create(data))

    def _stale(self, held: dict[str, Any]) -> str | None:
        """Why a held lock is dead (its owner's process on this host is gone, or it expired), else None."""
        import socket
        import time as _time

        if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int):
            try:
                os.kill(held["pid"], 0)
            except ProcessLookupError:
                return f"its writer (pid {held['pid']} on this host) is gone"
            except PermissionError:
                pass
        if float(held.get("expires", 0)) < _time.time():
            return "it expired (its writer stopped renewing it)"
        return None

    def _acquire(self) -> None:
        import secrets
        import socket
        import threading
        import time as _time

        body = {"host": socket.gethostname(), "pid": os.getpid(), "token": secrets.token_hex(8),
                "since": int(_time.time()), "expires": lock_expiry()}  # fmt: skip
        for _attempt in range(3):
            if self._put_lock(body):
                break
            held = self._read_lock()
            if held is None:
                continue  # released in between: try again
            if held.get("token") == body["token"]:
                break  # our own create: it landed, but its answer was lost and the retried PUT found it there
            why = self._stale(held)
            if why is None:
                left = float(held.get("expires", 0)) - _time.time()
                raise StoreError(
                    f"another run is writing {self.path} (lock held by pid {held.get('pid')} on "
                    f"{held.get('host')}, renewed until {left:.0f} s from now); try again when it has finished"
                )
            logger.warning("taking over the writer lock of %s: %s", self.path, why)
            self._call("cannot take over the writer lock", LOCK_NAME, self._lock_object().delete)
        else:
            raise StoreError(f"{self.path}: could not take the writer lock (contended)")
        self._lock = body
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(LOCK_TTL_S / 3):
                if self._lock is None:
                    return
                try:
                    self.renew_lock()
                except Exception:  # noqa: BLE001 - retried at the next beat; the commit check fences
                    logger.warning("could not renew the writer lock of %s", self.path)

        thread = threading.Thread(target=renew, name="xsbert-lock", daemon=True)
        thread.start()
        self._beat = (stop, thread)

    def renew_lock(self) -> None:
        """One heartbeat: push the lock's expiry LOCK_TTL_S ahead, if the lock is still this writer's."""
        if self._lock is None:
            return
        renewed = {**self._lock, "expires": lock_expiry()}
        if self._lock_is_mine(deadline_s=LOCK_TTL_S / 3):
            data = canonical_json(renewed).encode()
            self._call("cannot renew the writer lock", LOCK_NAME, lambda: self._lock_object().put(data),
                       deadline_s=LOCK_TTL_S / 3)  # fmt: skip
            self._lock = renewed

    def _fence(self) -> None:
        """Refuse to commit unless the lock is still this writer's."""
        if not self._lock_is_mine():
            raise StoreError(f"{self.path}: the writer lock is no longer this run's (taken over after it "
                             "expired): nothing more is committed; rerun to resume")  # fmt: skip

    # ------------------------------------------------------------------ reading
    def parts(self, table: str) -> list[PurePosixPath]:  # type: ignore[override]
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._key(table), allow_not_found=True)
        infos = self._call("cannot list", f"{table}/", lambda: self.fs.get_file_info(selector))
        return sorted(
            PurePosixPath(i.path) for i in infos if i.type == pafs.FileType.File and PART_RE.match(i.base_name)
        )

    def _rel(self, path: Any) -> str:
        return str(path)[len(self.base) + 1 :] if str(path).startswith(self.base + "/") else str(path)

    def _read(self, part: PurePosixPath, columns: list[str] | None = None) -> pa.Table:
        return self._call("cannot read", self._rel(part),
                          lambda: pq.read_table(str(part), columns=columns, filesystem=self.fs))  # fmt: skip

    def read_column(self, table: str, column: str) -> list[Any]:
        values: list[Any] = []
        for part in self.parts(table):
            values.extend(self._read(part, [column]).column(column).to_pylist())
        return values

    def read_table(self, table: str, columns: list[str] | None = None) -> pa.Table | None:
        parts = self.parts(table)
        if not parts:
            return None
        return pa.concat_tables([self._read(p, columns) for p in parts])

    def recover(self) -> list[PurePosixPath]:  # type: ignore[override]
        """Delete wave parts whose pairs part never landed (a commit cut short) and abort unfinished uploads."""
        committed = {part_seq(p.name) for p in self.parts("pairs")}
        removed = []
        for table in WAVE_TABLES:
            for part in self.parts(table):
                if part_seq(part.name) not in committed:
                    self._call("cannot delete", self._rel(part), lambda p=part: self.fs.delete_file(str(p)))
                    removed.append(part)
        removed += [PurePosixPath(k) for k in abort_uploads(self.root, self._key(), self.retry_s)]
        return removed

    def counts(self) -> dict[str, int]:
        def rows(part: PurePosixPath) -> int:
            return self._call("cannot read", self._rel(part),
                              lambda: pq.ParquetFile(self.fs.open_input_file(str(part))).metadata.num_rows)  # fmt: skip

        return {t: sum(rows(p) for p in self.parts(t)) for t in TABLES}

    def files(self) -> Iterator[PurePosixPath]:  # type: ignore[override]
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.base, recursive=True, allow_not_found=True)
        infos = self._call("cannot list", "the run", lambda: self.fs.get_file_info(selector))
        yield from sorted(
            PurePosixPath(i.path) for i in infos if i.type == pafs.FileType.File and i.base_name != LOCK_NAME
        )

    def read_manifest(self) -> dict[str, Any] | None:
        import pyarrow.fs as pafs

        key = self._key("manifest.json")

        def read() -> bytes | None:
            if self.fs.get_file_info(key).type == pafs.FileType.NotFound:
                return None
            with self.fs.open_input_stream(key) as fh:
                return fh.read()

        body = self._call("cannot read", "manifest.json", read)
        return None if body is None else json.loads(body.decode("utf-8"))

    # ------------------------------------------------------------------ writing
    def _put(self, rel: str, write) -> None:
        """One upload of `rel` (a key under the run) by write(), retried whole (the same bytes under the same name);
        an upload a failed try left unfinished is aborted."""
        key = self._key(rel)

        def attempt() -> None:
            try:
                write()
            except Exception:
                abort_uploads(self.root, key, min(self.retry_s, 10.0), exact=True)
                raise

        self._call("cannot write", rel, attempt)

    def commit(self, seq: int, tables: dict[str, pa.Table], keep_empty: bool = False) -> list[PurePosixPath]:  # type: ignore[override]
        """Each table's part-<seq> as one PUT (atomic per object), `pairs` last: the wave's commit point."""
        self._fence()
        name = part_name(seq)
        order = sorted(tables, key=lambda t: (t == "pairs", (TABLES + DERIVED_TABLES).index(t)))
        wrote = []
        for table in order:
            data = tables[table]
            if data is None or (data.num_rows == 0 and not keep_empty):
                continue
            data = data.select(self.schema(table).names).cast(self.schema(table))
            final = self._key(table, name)
            self._put(f"{table}/{name}", lambda d=data, f=final, t=table: write_parquet(d, f, t, self.fs))
            wrote.append(PurePosixPath(final))
        return wrote

    def _delete(self, table: str, name: str) -> None:
        self._call("cannot delete", f"{table}/{name}", lambda: self.fs.delete_file(self._key(table, name)))

    def sink(self) -> PartSink:
        self._fence()
        return PartSink(root=self.path, remote=True, settings=fs_settings(self.root),  # type: ignore[arg-type]
                        lock_token=self._lock["token"] if self._lock else None, retry_s=self.retry_s)  # fmt: skip

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self._fence()
        data = (json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")

        def write() -> None:
            with self.fs.open_output_stream(self._key("manifest.json")) as fh:
                fh.write(data)

        self._put("manifest.json", write)


def abort_uploads(root: str, key: str, deadline_s: float, exact: bool = False) -> list[str]:
    """Abort the unfinished multipart uploads of `key` (a bucket/key path; `exact`: that object only, else every key
    under it), which a failed or killed upload leaves behind (invisible, but stored and billed); S3 only (GCS's
    resumable uploads expire by themselves). Best effort: the keys aborted, [] when the store cannot say."""
    if REMOTE_SCHEMES.get(str(root).split("://", 1)[0].lower()) != "s3":
        return []
    bucket, _, prefix = key.partition("/")
    if not exact:
        prefix = prefix.rstrip("/") + "/"
    client = _s3_client(fs_settings(str(root)))
    aborted = []
    try:
        listing = retried(lambda: client.list_multipart_uploads(Bucket=bucket, Prefix=prefix), deadline_s)
        for upload in listing.get("Uploads", []):
            if exact and upload["Key"] != prefix:
                continue
            retried(lambda u=upload: client.abort_multipart_upload(Bucket=bucket, Key=u["Key"],
                                                                   UploadId=u["UploadId"]), deadline_s)  # fmt: skip
            aborted.append(f"{bucket}/{upload['Key']}")
    except GaveUp as g:
        logger.warning("could not abort unfinished uploads under %s/%s: %s", bucket, prefix, g.error)
    return aborted


def open_store(root: str | os.PathLike, rid: str, extra_pair_columns: tuple[str, ...] = (),
               retry_s: float | None = None) -> RunStore:  # fmt: skip
    """The run `rid` under `root`: a local directory, or a prefix on object storage (whose calls are retried for
    up to `retry_s` seconds, default store_retry_s())."""
    if is_remote(root):
        return ObjectRunStore(str(root), rid, extra_pair_columns, retry_s)
    return RunStore(root, rid, extra_pair_columns)


class PartSink:
    """A run's place for parts written by a stage-2 task (cells and word cells of one batch), picklable.

    Local: written beside the final name (`.part-*.tmp`), fsynced, renamed into place (the path must be one the
    worker sees: the driver only hands a sink out on a one-node cluster or for object storage). Object storage:
    one PUT of the final name, after checking that the run's writer lock still holds the driver's token (a
    driver whose lock was taken over has its tasks fenced too). A retried task writes the same name with the
    same bytes. Nothing written here is visible as data until the driver commits the wave's `pairs` part."""

    def __init__(self, root: str, remote: bool, settings: dict[str, str] | None = None,
                 lock_token: str | None = None, retry_s: float | None = None) -> None:  # fmt: skip
        self.root, self.remote, self.settings, self.lock_token = root, remote, settings or {}, lock_token
        self.retry_s = store_retry_s() if retry_s is None else retry_s

    def write(self, table: str, seq: int, first: int, data: pa.Table) -> str:
        """Write `data` (cast to SCHEMAS[table]) as part `seq`-`first` of `table`; return the part's name."""
        name = part_name(seq, first)
        data = data.select(SCHEMAS[table].names).cast(SCHEMAS[table])
        if not self.remote:
            folder = Path(self.root) / table
            tmp = folder / f".{name}.{os.getpid()}.tmp"
            try:
                write_parquet_synced(data, tmp, table)
                os.replace(tmp, folder / name)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
                raise disk_failure(folder / name, exc, "a worker cannot write") from None
            return name
        fs, base = filesystem(self.root, self.settings)
        if self.lock_token is not None:
            held = self._held_lock(fs, f"{base}/{LOCK_NAME}")
            if held.get("token") != self.lock_token:
                raise StoreError(f"{redact(self.root)}: the writer lock is no longer this run's: {table}/{name} "
                                 "not written")  # fmt: skip
        key = f"{base}/{table}/{name}"

        def attempt() -> None:
            try:
                write_parquet(data, key, table, fs)
            except Exception:
                abort_uploads(self.root, key, min(self.retry_s, 10.0), exact=True)
                raise

        try:
            retried(attempt, self.retry_s)
        except GaveUp as g:
            raise store_failure(self.root, g.error, "a worker cannot write", f"{table}/{name}", g) from None
        return name

    def _held_lock(self, fs, path: str, tries: int = LOCK_READ_TRIES) -> dict[str, Any]:
        """The lock's owner record ({} when there is no lock). A body that does not parse is read again: a read
        that overlaps the driver's heartbeat can see a mix of two bodies (the size from one, bytes of another)."""
        import time as _time

        def read() -> bytes | None:
            try:
                with fs.open_input_stream(path) as fh:
                    return fh.read()
            except FileNotFoundError:
                return None

        for attempt in range(tries):
            try:
                body = retried(read, self.retry_s)
            except GaveUp as g:
                raise store_failure(self.root, g.error, "a worker cannot read", LOCK_NAME, g) from None
            if body is None:
                return {}
            try:
                held = json.loads(body.decode("utf-8"))
                return held if isinstance(held, dict) else {}
            except ValueError:
                if attempt == tries - 1:
                    return {}
                _time.sleep(0.05 * (attempt + 1))
        return {}
