"""The Parquet store: one directory per run (docs/STORE.md).

    <out>/<run_id>/manifest.json
    <out>/<run_id>/{pairs,cells,word_cells,sentences,quarantine}/part-<seq>.parquet

run_id = sha256(canonical JSON of the run config)[:16]; the config holds everything that changes
the numbers, and not which rows were selected (--limit/--sample), so a grown dataset or a larger
sample maps to the same run and only its new pairs are computed.

Writes are atomic: a wave's part files are written and fsynced under `_staging/`, then moved into
the table folders with os.replace, `pairs` last: a pairs part is the commit point of its wave.
Readers read only committed parts (committed_parts: a wave table's parts once their wave's pairs part
is there), never a half-written file. On open, the staging folder and any cells/word_cells/sentences
part without its pairs part (a commit cut short) are removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .uri import StoreError

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
MANIFEST = "manifest.json"  # a run's settings, versions, runs and counts (docs/STORE.md)
# A local run's marker of the per-wave node check (jobs/attribution/placement.py): `.node-check-<token>` in the run
# folder while a Ray job runs; a killed job's is removed by the next writer's open (RunStore.recover).
MARKER_PREFIX = ".node-check-"

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


def committed_waves(pair_parts: Iterable[str]) -> set[int]:
    """The waves (commit sequence numbers) that committed: those with their `pairs` part, the commit point."""
    return {seq for seq in map(part_seq, pair_parts) if seq is not None}


def committed_parts(table: str, names: Iterable[str], waves: set[int]) -> list[str]:
    """Of the Parquet file names `names` in the folder of `table`, those a reader may read (sorted), as Delta and
    Iceberg readers read only what their log lists: a part of a wave table (cells, word_cells, sentences) only when
    its wave committed (`waves`: committed_waves of the `pairs` parts; a task writes its cells before the commit,
    and a job that stops part-way leaves them behind until the next writer's open removes them); a part of any
    other table (pairs, quarantine, parses: each part its own atomic commit) always. A `.parquet` file not named as
    a part (a store laid out by other means) is read as it is; anything else (an unfinished `.tmp`) never."""
    out = []
    for name in names:
        seq = part_seq(name)
        if seq is None:
            if name.endswith(".parquet") and not name.startswith("."):
                out.append(name)
        elif table not in WAVE_TABLES or seq in waves:
            out.append(name)
    return sorted(out)


def part_name(seq: int, first: int | None = None) -> str:
    return f"part-{seq:06d}.parquet" if first is None else f"part-{seq:06d}-{first:07d}.parquet"


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def selections(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The distinct selections of rows the jobs.attribute invocations recorded in manifest.json wrote into the run
    (dataset, split, sample, seed, limit, the source's row count), each with its pairs in (n_in) and how many
    invocations made it; a run folder grown by several selections holds the union of their pairs."""
    out: dict[tuple, dict[str, Any]] = {}
    for entry in manifest.get("runs") or []:
        selection = entry.get("selection") if isinstance(entry, dict) else None
        if not isinstance(selection, dict):
            continue
        key = tuple(selection.get(k) for k in ("dataset", "split", "sample", "seed", "limit"))
        n_in = (entry.get("counts") or {}).get("n_in")
        seen = out.setdefault(key, {**selection, "n_in": n_in, "invocations": 0})
        seen["invocations"] += 1
        seen["n_in"] = n_in if n_in is not None else seen["n_in"]
    return list(out.values())


def manifest_json(body: str | bytes, where: str) -> dict[str, Any]:
    """A run's manifest.json as read (`where`: its path or URI): a StoreError in one line when it is not a JSON object
    (the job writes it whole, temp file then rename: one that does not parse was changed by something else)."""
    try:
        manifest = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StoreError(f"{where}: not readable JSON ({exc}); the job writes it whole, so something else changed it: "
                         "restore it, or remove the run's folder and run the job again") from None  # fmt: skip
    if not isinstance(manifest, dict):
        raise StoreError(f"{where}: not a JSON object; restore it, or remove the run's folder and run the job again")
    return manifest


def short_hash(obj: Any) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of `obj`: a run id, a training's recipe id, a stage's
    inputs."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


def run_id(config: dict[str, Any]) -> str:
    """The run id: short_hash of the run config."""
    return short_hash(config)


def fsync_dir(path: Path) -> None:
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
    """`obj` as JSON at `path`, written to a temporary file beside it, fsynced and moved into place: `path` is the old
    file or the new one, never half of one; a write that fails removes its temporary file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=1, sort_keys=True, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def disk_failure(path: str | os.PathLike, exc: OSError, doing: str = "cannot write") -> StoreError:
    """One line for a failed local write: the path and the errno (pyarrow's own errors often name neither)."""
    num = exc.errno
    if num is None:
        m = re.search(r"errno[ :]*(\d+)", str(exc), re.IGNORECASE)
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


def pair_content_keys(ids: Any, sentence_ids_a: Any, sentence_ids_b: Any, labels: Any) -> np.ndarray:
    """64-bit keys of (pair id, sentence_id_a, sentence_id_b, label): a pair with the texts and the label it was
    stored with (pair_keys of the four joined by U+001F; the label as float64 text, "" for none: NaN and null are
    the same), so that a rerun finds a stored pair whose texts or label the dataset has changed since."""
    import pyarrow.compute as pc

    if isinstance(labels, pa.ChunkedArray):
        labels = labels.to_numpy()  # nulls -> NaN
    label_text = pc.fill_null(pc.cast(pa.array(np.asarray(labels, np.float64), from_pandas=True), pa.string()), "")
    columns = [c if isinstance(c, (pa.Array, pa.ChunkedArray)) else pa.array(list(c), pa.string())
               for c in (ids, sentence_ids_a, sentence_ids_b)]  # fmt: skip
    return pair_keys(pc.binary_join_element_wise(*columns, label_text, "\x1f"))
