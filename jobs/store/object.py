"""A run on object storage (S3, GCS).

On S3 and GCS there is no rename and no lock, but every upload is atomic (an object is visible whole or not at
all) and an upload can be conditional: S3's If-None-Match: * and GCS's ifGenerationMatch=0 create only if absent.
The protocol (docs/STORE.md, "On object storage"):
- writer lock: <run>/_lock.json created only if absent; it names its owner (host, pid, a random token) and an
  expiry that a heartbeat thread pushes forward; a lock whose owner is a dead process on this host, or whose
  expiry has passed, is taken over (deleted, then created again only if absent, so of two writers racing for it
  one wins); before each commit the writer checks the lock is still its own.
- commit: each table's part is one upload of its final name, `pairs` last: the pairs part is the commit point.
- recovery on open: cells/word_cells/sentences parts without their pairs part are deleted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..processes import process_gone, this_process
from .clients import abort_uploads
from .layout import (
    DERIVED_TABLES,
    MANIFEST,
    PART_RE,
    TABLES,
    WAVE_TABLES,
    canonical_json,
    manifest_json,
    part_name,
    write_parquet,
)
from .local import RunStore
from .lock import LOCK_NAME, LockObject, lock_expiry, lock_ttl_s
from .retry import GaveUp, retried, store_failure, store_retry_s
from .sink import ObjectPartSink
from .uri import WRITABLE_FAMILIES, Location, StoreError, fs_settings, redact

logger = logging.getLogger("jobs.store")


class ObjectRunStore(RunStore):
    """A run on object storage (s3://bucket/prefix/<run id>), with the guarantees of the local store."""

    def __init__(self, root: str | Location, rid: str, extra_pair_columns: tuple[str, ...] = (),
                 retry_s: float | None = None) -> None:  # fmt: skip
        self.location = Location.parse(root).join(rid)  # the run's own prefix
        self.root = self.location.parent.uri
        self.retry_s = store_retry_s() if retry_s is None else retry_s
        self.read_only = None
        self.run_id = rid
        self.extra_pair_columns = tuple(extra_pair_columns)
        self._fs = None  # made on first use: constructing a GCS filesystem may wait for a metadata server
        self.base = self.location.path
        self.scheme = self.location.scheme
        self.path = self.location.uri  # type: ignore[assignment]  # a URI, not a Path
        self._lock_fh = None
        self._lock: dict[str, Any] | None = None
        self._beat: Any = None

    # ------------------------------------------------------------------ access and errors
    @property
    def fs(self):
        if self._fs is None:
            self._fs, _ = self.location.parent.filesystem()
        return self._fs

    def _key(self, *parts: str) -> str:
        return "/".join((self.base, *parts))

    def _bucket_key(self, *parts: str) -> tuple[str, str]:
        bucket, _, key = self._key(*parts).partition("/")
        return bucket, key

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
        if self.location.family not in WRITABLE_FAMILIES:
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
                logger.warning("could not remove the writer lock of %s; it expires in %.0f s", self.path, lock_ttl_s())
            self._lock = None

    # ------------------------------------------------------------------ the writer lock
    def _lock_object(self) -> LockObject:
        return LockObject(self.location.family, *self._bucket_key(LOCK_NAME))  # type: ignore[arg-type]

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
        import time as _time

        if process_gone(held.get("host"), held.get("pid")):
            return f"its writer (pid {held['pid']} on this host) is gone"
        if float(held.get("expires", 0)) < _time.time():
            return "it expired (its writer stopped renewing it)"
        return None

    def _acquire(self) -> None:
        import secrets
        import threading
        import time as _time

        host, pid = this_process()
        body = {"host": host, "pid": pid, "token": secrets.token_hex(8),
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
            while not stop.wait(lock_ttl_s() / 3):
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
        """One heartbeat: push the lock's expiry lock_ttl_s() ahead, if the lock is still this writer's."""
        if self._lock is None:
            return
        renewed = {**self._lock, "expires": lock_expiry()}
        if self._lock_is_mine(deadline_s=lock_ttl_s() / 3):
            data = canonical_json(renewed).encode()
            self._call("cannot renew the writer lock", LOCK_NAME, lambda: self._lock_object().put(data),
                       deadline_s=lock_ttl_s() / 3)  # fmt: skip
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

    def read_schema(self, part: Any) -> pa.Schema:
        return self._call("cannot read", self._rel(part), lambda: pq.read_schema(str(part), filesystem=self.fs))

    def require(self, table: str, columns: tuple[str, ...] | list[str]) -> None:
        self._require_columns(table, columns, "a run")

    def recover(self) -> list[PurePosixPath]:  # type: ignore[override]
        """Delete wave parts whose pairs part never landed (a commit cut short) and abort unfinished uploads."""
        removed = []
        for table in WAVE_TABLES:
            for part in self.uncommitted(table):
                self._call("cannot delete", self._rel(part), lambda p=part: self.fs.delete_file(str(p)))
                removed.append(part)
        removed += [PurePosixPath(k) for k in abort_uploads(self.root, self._key(), self.retry_s)]
        return removed

    def abandon(self) -> None:
        """After a job failed part-way: the failed wave's parts deleted now, best effort with a short deadline (a
        store that stopped answering is what stopped the job: the next writer's open deletes them instead)."""
        saved, self.retry_s = self.retry_s, min(self.retry_s, 10.0)
        try:
            self.recover()
        except Exception as exc:  # noqa: BLE001 - readers never read them (committed); the next open removes them
            logger.info("could not delete the parts of the failed wave under %s now (the next run does): %s",
                        self.path, " ".join(str(exc).split())[:300])  # fmt: skip
        finally:
            self.retry_s = saved

    def counts(self) -> dict[str, int]:
        def rows(part: PurePosixPath) -> int:
            return self._call("cannot read", self._rel(part),
                              lambda: pq.ParquetFile(self.fs.open_input_file(str(part))).metadata.num_rows)  # fmt: skip

        return {t: sum(rows(p) for p in self.committed(t)) for t in TABLES}

    def files(self) -> Iterator[PurePosixPath]:  # type: ignore[override]
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.base, recursive=True, allow_not_found=True)
        infos = self._call("cannot list", "the run", lambda: self.fs.get_file_info(selector))
        yield from sorted(
            PurePosixPath(i.path) for i in infos if i.type == pafs.FileType.File and i.base_name != LOCK_NAME
        )

    def read_manifest(self) -> dict[str, Any] | None:
        import pyarrow.fs as pafs

        key = self._key(MANIFEST)

        def read() -> bytes | None:
            if self.fs.get_file_info(key).type == pafs.FileType.NotFound:
                return None
            with self.fs.open_input_stream(key) as fh:
                return fh.read()

        body = self._call("cannot read", MANIFEST, read)
        return None if body is None else manifest_json(body, f"{self.path}/{MANIFEST}")

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

    def replace(self, table: str, data: Iterable[pa.Table]) -> list[PurePosixPath]:  # type: ignore[override]
        """The new rows of `table` committed as new parts, then its older parts deleted (no rename on object
        storage): a reader in between sees both the old and the new rows."""
        old = self.parts(table)
        wrote: list[PurePosixPath] = []
        for rows in data:
            if rows.num_rows:
                wrote += self.commit(self.next_seq(), {table: rows})
        if not wrote:
            wrote = self.commit(self.next_seq(), {table: self.schema(table).empty_table()}, keep_empty=True)
        for part in old:
            self._call("cannot delete", self._rel(part), lambda p=part: self.fs.delete_file(str(p)))
        return wrote

    def _delete(self, table: str, name: str) -> None:
        self._call("cannot delete", f"{table}/{name}", lambda: self.fs.delete_file(self._key(table, name)))

    def sink(self) -> ObjectPartSink:
        self._fence()
        return ObjectPartSink(self.location, settings=fs_settings(self.location),
                              lock_token=self._lock["token"] if self._lock else None, retry_s=self.retry_s)  # fmt: skip

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self._fence()
        data = (json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")

        def write() -> None:
            with self.fs.open_output_stream(self._key(MANIFEST)) as fh:
                fh.write(data)

        self._put(MANIFEST, write)
