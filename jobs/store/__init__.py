"""The Parquet store (docs/STORE.md) and its backends (a local directory, S3, GCS): which backend a location is on, and
what each backend needs, is decided here.

- uri: the one parser of store locations (`Location`: scheme, path, filesystem; the scheme table), redaction,
  StoreError
- layout: the tables' schemas, part names, run ids, Parquet settings, synced local writes
- local / object: one interface (`RunStore`) on a local directory and on S3 / GCS (`ObjectRunStore`)
- lock, retry, clients: the object store's writer lock, retried calls and one-line failures, its own clients
- sink: where a stage-2 task writes its parts
- files: plain files at a location of either kind (the pipeline's report root and run listings)
- reading: an object store for DuckDB's readers, every call retried (xsbert sql, serve, jobs.report)
- upgrade: a local run of an older store version copied as the current one (`python -m jobs.store.upgrade`; not
  imported here)
"""

from __future__ import annotations

import os

from .layout import (
    DERIVED_TABLES,
    MANIFEST,
    MARKER_PREFIX,
    PARQUET_OPTIONS,
    PART_RE,
    SCHEMAS,
    STAGING,
    STORE_VERSION,
    TABLES,
    WAVE_TABLES,
    canonical_json,
    committed_parts,
    committed_waves,
    disk_failure,
    fsync_dir,
    pair_content_keys,
    pair_keys,
    parquet_options,
    part_name,
    part_seq,
    run_id,
    selections,
    short_hash,
    write_json_atomic,
    write_parquet,
    write_parquet_synced,
)
from .local import RunStore
from .lock import LOCK_NAME, LOCK_TTL_S, LockObject
from .object import ObjectRunStore
from .reading import retried_fsspec
from .retry import STORE_RETRY_S, GaveUp, retried, store_failure, store_retry_s, transient
from .sink import LocalPartSink, ObjectPartSink, PartSink
from .uri import (
    CREDENTIALS,
    REMOTE_SCHEMES,
    Location,
    StoreError,
    endpoint_name,
    filesystem,
    fs_settings,
    gcs_emulator,
    redact,
    resolve,
)

__all__ = [
    "CREDENTIALS",
    "DERIVED_TABLES",
    "LOCK_NAME",
    "LOCK_TTL_S",
    "MANIFEST",
    "MARKER_PREFIX",
    "PARQUET_OPTIONS",
    "PART_RE",
    "REMOTE_SCHEMES",
    "SCHEMAS",
    "STAGING",
    "STORE_RETRY_S",
    "STORE_VERSION",
    "TABLES",
    "WAVE_TABLES",
    "GaveUp",
    "Location",
    "LockObject",
    "ObjectRunStore",
    "LocalPartSink",
    "ObjectPartSink",
    "PartSink",
    "RunStore",
    "StoreError",
    "canonical_json",
    "committed_parts",
    "committed_waves",
    "disk_failure",
    "endpoint_name",
    "filesystem",
    "fs_settings",
    "fsync_dir",
    "gcs_emulator",
    "open_store",
    "pair_keys",
    "pair_content_keys",
    "parquet_options",
    "part_name",
    "part_seq",
    "redact",
    "resolve",
    "retried",
    "retried_fsspec",
    "run_at",
    "run_id",
    "selections",
    "short_hash",
    "store_failure",
    "store_retry_s",
    "transient",
    "write_json_atomic",
    "write_parquet",
    "write_parquet_synced",
]  # fmt: skip


def open_store(root: str | os.PathLike | Location, rid: str, extra_pair_columns: tuple[str, ...] = (),
               retry_s: float | None = None) -> RunStore:  # fmt: skip
    """The run `rid` under `root`: a local directory, or a prefix on object storage (whose calls are retried for
    up to `retry_s` seconds, default store_retry_s())."""
    location = Location.parse(root)
    if location.is_remote:
        return ObjectRunStore(location, rid, extra_pair_columns, retry_s)
    return RunStore(location, rid, extra_pair_columns)


def run_at(location: str | os.PathLike | Location, retry_s: float | None = None) -> RunStore:
    """The run whose own folder or prefix is `location` (<root>/<run id>), not yet opened (no lock taken)."""
    run = Location.parse(location)
    return open_store(run.parent, run.name, retry_s=retry_s)
