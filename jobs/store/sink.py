"""Where a stage-2 task writes its parts: a picklable handle on a run, one kind per backend (a local folder, object
storage), each made by its store."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from .clients import abort_uploads
from .layout import SCHEMAS, disk_failure, part_name, write_parquet, write_parquet_synced
from .lock import LOCK_NAME, LOCK_READ_TRIES
from .retry import GaveUp, retried, store_failure, store_retry_s
from .uri import Location, StoreError, redact


class PartSink:
    """A run's place for parts written by a stage-2 task (cells and word cells of one batch), picklable; the store
    hands out its own kind (RunStore.sink, ObjectRunStore.sink). A retried task writes the same name with the same
    bytes. Nothing written here is visible as data until the driver commits the wave's `pairs` part."""

    def write(self, table: str, seq: int, first: int, data: pa.Table) -> str:
        """Write `data` (cast to SCHEMAS[table]) as part `seq`-`first` of `table`; return the part's name."""
        raise NotImplementedError


class LocalPartSink(PartSink):
    """A local run folder: written beside the final name (`.part-*.tmp`), fsynced, renamed into place (the path must
    be one the worker sees: the driver only hands a sink out on a one-node cluster, or where every node sees the
    folder: jobs/attribution/placement.py)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def write(self, table: str, seq: int, first: int, data: pa.Table) -> str:
        name = part_name(seq, first)
        data = data.select(SCHEMAS[table].names).cast(SCHEMAS[table])
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


class ObjectPartSink(PartSink):
    """A run on object storage: one PUT of the final name, after checking that the run's writer lock still holds the
    driver's token (a driver whose lock was taken over has its tasks fenced too). `settings`: the driver's
    non-secret connection settings (uri.fs_settings); the worker's own credentials."""

    def __init__(self, location: Location, settings: dict[str, str] | None = None, lock_token: str | None = None,
                 retry_s: float | None = None) -> None:  # fmt: skip
        self.location, self.settings, self.lock_token = location, settings or {}, lock_token
        self.root = location.uri
        self.retry_s = store_retry_s() if retry_s is None else retry_s

    def write(self, table: str, seq: int, first: int, data: pa.Table) -> str:
        name = part_name(seq, first)
        data = data.select(SCHEMAS[table].names).cast(SCHEMAS[table])
        fs, base = self.location.filesystem(self.settings)
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
