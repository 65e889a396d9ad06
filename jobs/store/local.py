"""A run in a local directory: atomic commits by rename, a flock writer lock (docs/STORE.md)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..processes import held_by, lock_file
from .layout import (
    DERIVED_TABLES,
    MANIFEST,
    MARKER_PREFIX,
    PART_RE,
    SCHEMAS,
    STAGING,
    TABLES,
    WAVE_TABLES,
    committed_parts,
    committed_waves,
    disk_failure,
    fsync_dir,
    manifest_json,
    pair_content_keys,
    pair_keys,
    part_name,
    part_seq,
    write_json_atomic,
    write_parquet_synced,
)
from .sink import LocalPartSink
from .uri import Location, StoreError

logger = logging.getLogger("jobs.store")

# renameat2(2)'s flag and the "current directory" descriptor (linux/fcntl.h, linux/fs.h)
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def exchange(a: Path, b: Path) -> bool:
    """Swap the two existing paths `a` and `b` in one step (Linux's renameat2 with RENAME_EXCHANGE): no instant
    without either. False where the system or the file system has no such call (the caller renames twice)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it (glibc < 2.28, musl)
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


class RunStore:
    """One run directory: its tables, its manifest, and a lock so that one writer works on it at a time."""

    def __init__(self, root: str | os.PathLike | Location, rid: str, extra_pair_columns: tuple[str, ...] = ()) -> None:
        self.location = Location.parse(root).join(rid)  # the run's own folder
        self.root = Path(self.location.parent.path)
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
    def check(self) -> None:
        """Reach the store before anything is computed: nothing to do for a local directory (its errors come when
        it opens); ObjectRunStore's reaches the bucket."""

    def open(self) -> RunStore:
        """Create the folders, take the writer lock, clean up what an interrupted run left.

        On a read-only file system (or one this user cannot write) the run opens read-only when it exists: a rerun
        with nothing to do answers as usual, and the first write says why it cannot be made."""
        lock = self.path / ".lock"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for table in TABLES:
                (self.path / table).mkdir(exist_ok=True)
            self._lock_fh = lock_file(lock)
            held = self._lock_fh is None
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not self.path.is_dir():
                raise disk_failure(self.path, exc, "cannot open the store") from None
            self.read_only = disk_failure(self.path, exc)
            self._lock_fh = lock_file(lock, shared=True) if lock.exists() else None
            held = lock.exists() and self._lock_fh is None
        if held:
            raise StoreError(f"another run is writing {self.path} (lock held by {held_by(lock)}); try again when it "
                             "has finished: the same command then resumes the run, or finds it up to date")  # fmt: skip
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
        """Remove the staging folder, wave parts whose pairs part never landed and the node-check markers of jobs
        that did not end; return what was removed."""
        removed: list[Path] = []
        for marker in sorted(self.path.glob(f"{MARKER_PREFIX}*")):  # one writer at a time: no live job's marker
            with contextlib.suppress(OSError):  # (not data: a read-only store keeps it, and opens as before)
                marker.unlink()
                removed.append(marker)
        staging = self.path / STAGING
        if staging.exists():
            removed.append(staging)
        for table in WAVE_TABLES:
            removed += self.uncommitted(table)
            folder = self.path / table
            removed += sorted(folder.glob(".part-*.tmp")) if folder.exists() else []  # a worker's write cut short
        if any(not p.name.startswith(MARKER_PREFIX) for p in removed):
            self.check_writable()  # a read-only store with a commit cut short: say so rather than read around it
        try:
            for path in removed:
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        except OSError as exc:
            raise disk_failure(exc.filename or self.path, exc, "cannot clean up") from None
        return removed

    def abandon(self) -> None:
        """After a job failed part-way: remove what its failed wave left (parts of a wave without its pairs part, the
        staging folder), at once rather than at the next open. Best effort: readers never read such parts anyway
        (committed), so a failure here is logged, never raised over the error that stopped the job."""
        try:
            self.recover()
        except Exception as exc:  # noqa: BLE001 - the next writer's open removes them
            logger.info("could not remove the parts of the failed wave in %s now (the next run does): %s", self.path,
                        " ".join(str(exc).split())[:300])  # fmt: skip

    # ------------------------------------------------------------------ reading
    def parts(self, table: str) -> list[Path]:
        """Every part file of `table`, committed or not (what the writer works with; readers: `committed`)."""
        folder = self.path / table
        if not folder.exists():
            return []
        return sorted(p for p in folder.iterdir() if PART_RE.match(p.name))

    def committed(self, table: str) -> list[Any]:
        """The parts of `table` a reader reads (layout.committed_parts): of a wave table only the parts whose wave's
        pairs part is there, never what a wave in progress or a job that stopped part-way left."""
        parts = self.parts(table)
        if table not in WAVE_TABLES:
            return parts
        keep = set(committed_parts(table, [p.name for p in parts], committed_waves(p.name for p in self.parts("pairs"))))
        return [p for p in parts if p.name in keep]

    def uncommitted(self, table: str) -> list[Any]:
        """The parts of `table` whose wave never committed (what recover() removes)."""
        keep = {p.name for p in self.committed(table)}
        return [p for p in self.parts(table) if p.name not in keep]

    def read_schema(self, part: Any) -> pa.Schema:
        """The columns of one part (its footer only)."""
        return pq.read_schema(part)

    def require(self, table: str, columns: tuple[str, ...] | list[str]) -> None:
        """A StoreError unless the run exists and `table` has a part with `columns` (what a job that reads the run,
        jobs.parse, checks before it takes the lock)."""
        if not self.path.exists():
            raise StoreError(f"run directory {self.path} does not exist")
        if not self.path.is_dir():
            raise StoreError(f"{self.path} is not a directory")
        self._require_columns(table, columns, "a run directory")

    def _require_columns(self, table: str, columns: tuple[str, ...] | list[str], what: str) -> None:
        parts = self.committed(table)
        if not parts:
            raise StoreError(f"{self.path} has no {table} table ({self.path}/{table}/*.parquet): pass {what} "
                             "written by jobs.attribute")  # fmt: skip
        names = self.read_schema(parts[0]).names
        missing = [c for c in columns if c not in names]
        if missing:
            raise StoreError(f"{self.path}/{table} lacks the columns {missing}")

    def read_column(self, table: str, column: str) -> list[Any]:
        values: list[Any] = []
        for part in self.committed(table):
            values.extend(self._read(part, [column]).column(column).to_pylist())
        return values

    def read_table(self, table: str, columns: list[str] | None = None) -> pa.Table | None:
        parts = self.committed(table)
        if not parts:
            return None
        return pa.concat_tables([self._read(p, columns) for p in parts])

    def _read(self, part: Any, columns: list[str] | None = None) -> pa.Table:
        """One part (object storage: its reads retried, ObjectRunStore)."""
        return pq.read_table(part, columns=columns)

    def column(self, table: str, column: str) -> pa.ChunkedArray:
        """One column of every part, as Arrow (no Python object per value)."""
        return self.columns(table, [column])[0]

    def columns(self, table: str, names: list[str]) -> list[pa.ChunkedArray]:
        """Some columns of every part, each part read once, as Arrow (each in its SCHEMAS type)."""
        parts = [self._read(part, names) for part in self.committed(table)]
        types = [SCHEMAS[table].field(name).type for name in names]
        return [pa.chunked_array([c.cast(type_) for p in parts for c in p.column(name).chunks], type_)
                for name, type_ in zip(names, types)]  # fmt: skip

    def done_pair_ids(self) -> set[str]:
        return set(self.read_column("pairs", "pair_id"))

    def done_pair_keys(self) -> np.ndarray:
        """The stored pairs' ids as sorted 64-bit keys (pair_keys): what a large run's driver holds of them."""
        return np.unique(pair_keys(self.column("pairs", "pair_id")))

    def done_pair_keys_with_content(self) -> tuple[np.ndarray, np.ndarray]:
        """done_pair_keys, and the stored pairs with their texts' sentence ids and their labels as sorted 64-bit
        keys (pair_content_keys), from one read of each part."""
        ids, a, b, labels = self.columns("pairs", ["pair_id", "sentence_id_a", "sentence_id_b", "label"])
        return np.unique(pair_keys(ids)), np.unique(pair_content_keys(ids, a, b, labels))

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

    def sink(self) -> LocalPartSink:
        """What a stage-2 task needs to write this run's parts itself (picklable; no credentials)."""
        self.check_writable()
        return LocalPartSink(str(self.path))

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
                (self.path / table).mkdir(exist_ok=True)  # a derived table (parses) has no folder until written
                where = tmp = staging / f"{table}.parquet"
                write_parquet_synced(data, tmp, table)
                staged.append((tmp, self.path / table / name))
            for tmp, final in staged:  # `pairs` last: the wave is committed once its pairs part is in place
                where = final
                os.replace(tmp, final)
                fsync_dir(final.parent)
        except OSError as exc:  # a full disk: nothing of the wave is committed unless its pairs part landed
            shutil.rmtree(staging, ignore_errors=True)  # give the space back at once (the next open would too)
            raise disk_failure(where, exc) from None
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.path / STAGING).rmdir()
        return [final for _, final in staged]

    def append(self, table: str, data: Iterable[pa.Table]) -> list[Path]:
        """Add each non-empty table of `data` as the next part of `table`, each committed atomically as it comes (a
        job stopped part-way keeps what it committed). A first write without rows still leaves an empty part."""
        wrote: list[Path] = []
        for rows in data:
            if rows.num_rows:
                wrote += self.commit(self.next_seq(), {table: rows})
        if not wrote and not self.parts(table):
            wrote = self.commit(self.next_seq(), {table: self.schema(table).empty_table()}, keep_empty=True)
        return wrote

    def replace(self, table: str, data: Iterable[pa.Table]) -> list[Path]:
        """Swap the whole `table` folder for one holding the tables of `data`, one part each: staged, fsynced, then
        exchanged with the old folder in one step (two renames where the system cannot, when a reader in between
        finds the folder missing). The new parts are numbered after every part the run has, so no name a reader
        listed before the swap ever names other rows: a reader that started before reads the old parts, or fails
        to find them, never a mix of old and new rows."""
        self.check_writable()
        schema = self.schema(table)
        staging = self.path / STAGING / f"{table}-new"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        first = self.next_seq()
        staged: list[Path] = []
        for rows in data:
            if rows.num_rows:
                staged.append(staging / part_name(first + len(staged)))
                write_parquet_synced(rows.select(schema.names).cast(schema), staged[-1], table)
        if not staged:
            staged.append(staging / part_name(first))
            write_parquet_synced(schema.empty_table(), staged[-1], table)
        target = self.path / table
        if not (target.exists() and exchange(staging, target)):  # else the old parts are in `staging` now
            old = self.path / STAGING / f"{table}-old"
            shutil.rmtree(old, ignore_errors=True)
            if target.exists():
                os.replace(target, old)
            os.replace(staging, target)
        fsync_dir(self.path)
        shutil.rmtree(self.path / STAGING, ignore_errors=True)
        return [target / part.name for part in staged]

    def commit_missing_tables(self) -> list[Path]:
        """Give every table without a part an empty one, so that `read_parquet('<table>/*.parquet')` works
        on any run (no quarantined row, or every pair quarantined). A wave table's empty part comes with
        an empty `pairs` part of the same name, its commit point."""
        missing = [t for t in TABLES if not self.committed(t)]
        if not missing:
            return []
        if any(t in WAVE_TABLES for t in missing) and "pairs" not in missing:
            missing.append("pairs")
        return self.commit(self.next_seq(), {t: self.schema(t).empty_table() for t in missing}, keep_empty=True)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self.check_writable()
        try:
            write_json_atomic(self.path / MANIFEST, manifest)
        except OSError as exc:
            raise disk_failure(self.path / MANIFEST, exc) from None

    def read_manifest(self) -> dict[str, Any] | None:
        path = self.path / MANIFEST
        if not path.exists():
            return None
        return manifest_json(path.read_bytes(), str(path))

    def counts(self) -> dict[str, int]:
        """Rows per table (from the Parquet footers, no data read)."""
        return {t: sum(pq.ParquetFile(p).metadata.num_rows for p in self.committed(t)) for t in TABLES}

    def files(self) -> Iterator[Path]:
        yield from sorted(p for p in self.path.rglob("*") if p.is_file() and p.name != ".lock")
