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
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

STORE_VERSION = 1
TABLES: tuple[str, ...] = ("pairs", "cells", "word_cells", "sentences", "quarantine")
# Parts of these tables belong to the wave whose pairs part has the same name.
WAVE_TABLES: tuple[str, ...] = ("cells", "word_cells", "sentences")
# Tables that later jobs derive from a run (jobs.parse writes `parses`). Not in TABLES: `open` does not
# create their folders and `commit_missing_tables` gives them no empty part, so a run that was never
# parsed (no `parses/` folder) stays distinguishable from a parsed run without rows (an empty part).
DERIVED_TABLES: tuple[str, ...] = ("parses",)
PART_RE = re.compile(r"^part-(\d{6})\.parquet$")
STAGING = "_staging"

_str, _i32, _i64, _f64, _bool = pa.string(), pa.int32(), pa.int64(), pa.float64(), pa.bool_()
# The tables' columns (docs/STORE.md); every part is cast to these, so all parts of a table agree.
SCHEMAS: dict[str, pa.Schema] = {
    "pairs": pa.schema(
        [("pair_id", _str), ("row", _i64), ("split", _str), ("label", _f64), ("text_a", _str), ("text_b", _str),
         ("sentence_id_a", _str), ("sentence_id_b", _str), ("n_tokens_a", _i32), ("n_tokens_b", _i32),
         ("score", _f64), ("attribution_sum", _f64), ("positive_sum", _f64), ("negative_sum", _f64),
         ("ref_sim_a", _f64), ("ref_sim_b", _f64), ("ref_term", _f64), ("target", _f64),
         ("completeness_error", _f64), ("factor_error_a", _f64), ("factor_error_b", _f64),
         ("steps_a", _i32), ("steps_b", _i32), ("truncated_a", _bool), ("truncated_b", _bool),
         ("n_cells", _i32), ("n_word_cells", _i32)]
    ),
    "cells": pa.schema(
        [("pair_id", _str), ("i", _i32), ("j", _i32), ("token_a", _str), ("token_b", _str), ("value", _f64)]
    ),
    "word_cells": pa.schema(
        [("pair_id", _str), ("u", _i32), ("v", _i32), ("word_a", _str), ("word_b", _str), ("value", _f64)]
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


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True, allow_nan=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class RunStore:
    """One run directory: its tables, its manifest, and a lock so that one writer works on it at a time."""

    def __init__(self, root: str | os.PathLike, rid: str, extra_pair_columns: tuple[str, ...] = ()) -> None:
        self.root = Path(root)
        self.run_id = rid
        self.path = self.root / rid
        self.extra_pair_columns = tuple(extra_pair_columns)  # pass-through columns (strings) after SCHEMAS' own
        self._lock_fh = None

    def schema(self, table: str) -> pa.Schema:
        """The table's schema in this run: SCHEMAS[table], and for `pairs` the pass-through string columns."""
        schema = SCHEMAS[table]
        if table == "pairs":
            for name in self.extra_pair_columns:
                schema = schema.append(pa.field(name, pa.string()))
        return schema

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> RunStore:
        """Create the folders, take the writer lock, clean up what an interrupted run left."""
        self.path.mkdir(parents=True, exist_ok=True)
        for table in TABLES:
            (self.path / table).mkdir(exist_ok=True)
        self._lock_fh = open(self.path / ".lock", "w")
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock_fh.close()
            self._lock_fh = None
            raise RuntimeError(f"another run is writing {self.path} (lock held)") from exc
        self.recover()
        return self

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
            shutil.rmtree(staging)
            removed.append(staging)
        committed = {p.name for p in self.parts("pairs")}
        for table in WAVE_TABLES:
            for part in self.parts(table):
                if part.name not in committed:
                    part.unlink()
                    removed.append(part)
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

    def done_pair_ids(self) -> set[str]:
        return set(self.read_column("pairs", "pair_id"))

    def sentence_ids(self) -> set[str]:
        return set(self.read_column("sentences", "sentence_id"))

    def quarantine_keys(self) -> set[tuple[int, str | None, str]]:
        t = self.read_table("quarantine", ["row", "pair_id", "reason"])
        if t is None:
            return set()
        return set(zip(t.column("row").to_pylist(), t.column("pair_id").to_pylist(), t.column("reason").to_pylist()))

    def next_seq(self) -> int:
        parts = [p for t in TABLES + DERIVED_TABLES for p in self.parts(t)]
        seqs = [int(PART_RE.match(p.name).group(1)) for p in parts]  # type: ignore[union-attr]
        return max(seqs, default=-1) + 1

    # ------------------------------------------------------------------ writing
    def commit(self, seq: int, tables: dict[str, pa.Table], keep_empty: bool = False) -> list[Path]:
        """Write `tables` (cast to `schema(table)`) as part-<seq> of each table, atomically per file, `pairs` last.

        Empty tables are skipped unless `keep_empty`. Returns the final paths.
        """
        name = f"part-{seq:06d}.parquet"
        staging = self.path / STAGING / f"{seq:06d}"
        staging.mkdir(parents=True, exist_ok=True)
        staged: list[tuple[Path, Path]] = []
        order = sorted(tables, key=lambda t: (t == "pairs", (TABLES + DERIVED_TABLES).index(t)))
        for table in order:
            data = tables[table]
            if data is None or (data.num_rows == 0 and not keep_empty):
                continue
            data = data.select(self.schema(table).names).cast(self.schema(table))
            tmp = staging / f"{table}.parquet"
            pq.write_table(data, tmp, **PARQUET_OPTIONS)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            staged.append((tmp, self.path / table / name))
        for tmp, final in staged:
            os.replace(tmp, final)
            _fsync_dir(final.parent)
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
        write_json_atomic(self.path / "manifest.json", manifest)

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
