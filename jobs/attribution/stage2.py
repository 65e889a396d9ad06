"""Stage 2 of an attribution run, per wave: the pair numbers, cells and word cells from the wave's sentence factors
(Ray tasks of `pair_cells`, `compute_cells`), made exactly-once (`exactly_once`), and the wave's tables
(`wave_tables`) and failures."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from xsbert_core import XsbertError

from ..store import SCHEMAS, StoreError
from .actors import CELL_LISTS, NOT_CONVERGED, TOP_CELLS, WORD_LISTS
from .hooks import Hooks
from .inputs import KEEP_PREFIX
from .validate import quarantine_frame
from .worklist import SentenceKeys

logger = logging.getLogger("jobs.attribute")
# Pairs per PairCells call (stage 2 is ~1 ms per pair).
PAIR_BATCH = 256


class JobFailedError(XsbertError, RuntimeError):
    """The run stopped part-way (a batch that kept killing its workers, retried copies that disagree): the
    waves before are committed, nothing of the failing wave is; the same command resumes the run."""


def arrow(column: pd.Series, type_: pa.DataType = pa.string()) -> pa.Array | pa.ChunkedArray:
    """A pandas column as Arrow: an Arrow-backed one (compact) as it is, zero-copy; others converted."""
    if isinstance(column.dtype, pd.ArrowDtype):
        return column.array.__arrow_array__().cast(type_)
    return pa.array(column.tolist(), type_)


# --------------------------------------------------------------------------- stage 2, per wave
@dataclass(frozen=True)
class CellSettings:
    """What stage 2 computes the pairs with (either executor): the run's similarity (resolved), --min-abs, --cells;
    a Ray run's retries of a task and the hooks."""

    similarity: str
    min_abs: float = 0.0
    cells: str = "all"
    max_retries: int = 0
    hooks: Hooks = Hooks()


_REMOTES: dict[Any, Any] = {}


def _remote(ray, fn: Callable) -> Any:
    """`fn` as a Ray remote function, made once per driver process and Ray session: each wave submits tasks of the
    same function (a Ray Data dataset per wave left ~0.2 MB and ~108 Python objects in the driver for the rest of the
    run, bench/driver_peaks.py ray-data; plain tasks leave nothing)."""
    key = (fn, ray.get_runtime_context().get_job_id())
    if key not in _REMOTES:
        _REMOTES.clear()
        _REMOTES[key] = ray.remote(fn)
    return _REMOTES[key]


def compute_cells(
    ray,
    wave: pd.DataFrame,
    factor_refs: list[Any],
    cells: CellSettings,
    res: dict[str, Any],
    sink: Any = None,
    seq: int | None = None,
) -> tuple[pa.Table, dict[str, Any]]:
    """Stage 2 for the wave's pairs from its factor blocks: (PAIR_SCHEMA rows, timings).

    One Ray task (`pair_cells`) per PAIR_BATCH pairs, spread over the cluster, each retried up to --max-retries times
    when its worker dies (a retry's copies are dropped by `exactly_once`). With a `sink` the stage-2 tasks write
    the cells and word cells as parts of wave `seq` themselves and the rows name those parts; without, the rows
    carry the cells as lists for the driver to write."""
    from .actors import pair_cells

    t0 = time.perf_counter()
    pair_in = pair_input(wave)
    task = _remote(ray, pair_cells).options(num_cpus=res["cells_cpus"], max_retries=cells.max_retries,
                                            scheduling_strategy="SPREAD")  # fmt: skip
    kwargs = dict(factor_refs=factor_refs, similarity=cells.similarity, min_abs=cells.min_abs, sink=sink, seq=seq,
                  cells=cells.cells, hooks=cells.hooks)  # fmt: skip
    refs: list[Any] = []
    try:
        refs = [task.remote(pair_in.slice(k, PAIR_BATCH), **kwargs) for k in range(0, len(wave), PAIR_BATCH)]
        out, duplicates = exactly_once(pa.concat_tables(ray.get(refs)))
    except BaseException as exc:
        if sink is not None:  # the wave's other tasks stop before the job removes what they wrote (run.attribute)
            _stop(ray, refs)
        if isinstance(exc, JobFailedError) or not isinstance(exc, Exception):
            raise
        why = _write_failure(exc) if sink is not None else None
        if why is None:
            raise
        hint = ""
        if "access denied" in why:  # 401/403 only: the workers need credentials of their own, where a node gets them
            hint = ("; the Ray workers reach the store with credentials of their own: the node's role / instance "
                    "profile, or a Kubernetes Secret or service account")  # fmt: skip
        raise StoreError(f"a stage-2 task could not write its part of the store ({why}){hint}") from None
    return out, {"cells_s": time.perf_counter() - t0, "duplicates_dropped": duplicates}


def _stop(ray, refs: list[Any], wait_s: float = 30.0) -> None:
    """Cancel the tasks of a failed wave that are still running and wait (up to `wait_s`) until they have ended, so
    that no part is written after the job removed the wave's parts. Best effort."""
    if not refs:
        return
    try:
        _, running = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in running:
            ray.cancel(ref)
        if running:
            ray.wait(running, num_returns=len(running), timeout=wait_s)
    except Exception:  # noqa: BLE001 - a task that writes later leaves a part readers never read (not committed)
        pass


def pair_input(wave: pd.DataFrame) -> pa.Table:
    """Stage 2's input: the wave's pairs as (ord, pair_id, sentence_id_a, sentence_id_b), ord = position in the wave."""
    return pa.table(
        {
            "ord": np.arange(len(wave), dtype=np.int64),
            **{name: arrow(wave[name]) for name in ("pair_id", "sentence_id_a", "sentence_id_b")},
        }
    )


def _write_failure(exc: BaseException) -> str | None:
    """Why a stage-2 task failed to write its parts (StoreError or an OSError of the filesystem), else None.
    Ray and Ray Data wrap a task's exception (RayTaskError, UserCodeException) and keep the original only as text
    of the remote traceback, so the cause is found in that text."""
    import re

    text = str(exc)
    for pattern in (r"jobs\.store\.StoreError: ([^\n]+)", r"((?:OSError|FileNotFoundError|PermissionError): [^\n]+)"):
        found = re.findall(pattern, text)
        if found:
            return " ".join(found[-1].split())[:300]
    return None


def exactly_once(out: pa.Table) -> tuple[pa.Table, int]:
    """(one row per `ord`, in ord order; the number of extra copies dropped).

    A retried stage-2 batch can only add copies of rows it had already returned. Copies must be equal
    (the same factors, the same arithmetic): copies that differ raise JobFailedError, never pick one."""
    ords = out.column("ord").to_numpy()
    _, first = np.unique(ords, return_index=True)
    dropped = len(ords) - len(first)
    if dropped:
        kept_at = {int(ords[k]): int(k) for k in first}
        for k in sorted(set(range(len(ords))) - set(first.tolist())):
            copy, kept = out.slice(k, 1).to_pylist()[0], out.slice(kept_at[int(ords[k])], 1).to_pylist()[0]
            if copy != kept:
                raise JobFailedError(
                    f"pair {kept['pair_id']!r} came back twice from stage 2 with different values (a retried batch "
                    "is not deterministic); nothing of this wave was written"
                )
    return out.take(pa.array(np.sort(first))).sort_by("ord"), dropped


def _explode(out: pa.Table, names: dict[str, str]) -> pa.Table:
    """Per-pair list columns (names: list column -> store column) -> one row per cell, pair_id first, in pair
    then list order."""
    first = out.column(next(iter(names))).combine_chunks()
    parents = pc.list_parent_indices(first)
    cols = {"pair_id": out.column("pair_id").combine_chunks().take(parents)}
    for src, dst in names.items():
        cols[dst] = pc.list_flatten(out.column(src).combine_chunks())
    return pa.table(cols)


def written_parts(out: pa.Table) -> dict[str, set[str]]:
    """The parts the stage-2 tasks of a wave wrote themselves (empty when the driver writes the cells)."""
    return {table: set(pc.unique(out.column(f"{table}_part")).drop_null().to_pylist())
            for table in ("cells", "word_cells")}  # fmt: skip


def float_lists(column: pa.ChunkedArray | pa.Array) -> pa.ListArray:
    """A binary column of float32 vectors (the actors' bytes) as list<float32>, zero-copy: the list offsets are the
    byte offsets / 4 and the values are a float32 view of the data buffer (no Python object per row)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.null_count:
        raise ValueError("a float vector is missing (null)")
    _, offsets_buf, data_buf = arr.buffers()
    off_type = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.zeros(1, off_type)
    if len(arr):
        offsets = np.frombuffer(offsets_buf, off_type)[arr.offset : arr.offset + len(arr) + 1]
    if np.any(offsets % 4):
        raise ValueError("a float vector's byte length is not a multiple of 4")
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    values = data[offsets[0] : offsets[-1]].view(np.float32)
    return pa.ListArray.from_arrays(pa.array((offsets - offsets[0]) // 4, pa.int32()), pa.array(values, pa.float32()))


def vector_norms(lists: pa.ListArray) -> np.ndarray:
    """‖v‖₂ of each list<float32> row, in float64: sqrt of the per-row sums of squares over the flat values."""
    offsets = lists.offsets.to_numpy()
    values = lists.flatten().to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets)
    if len(lists) and lengths[0] > 0 and np.all(lengths == lengths[0]):  # one size (D): no float64 copy of them all
        rows = values[: len(lists) * lengths[0]].reshape(len(lists), lengths[0])
        return np.sqrt(np.einsum("ij,ij->i", rows, rows, dtype=np.float64))
    values = values.astype(np.float64)
    sums = np.zeros(len(lists))
    filled = offsets[1:] > offsets[:-1]  # reduceat over the non-empty rows' starts: each sums up to the next
    if filled.any():
        sums[filled] = np.add.reduceat(values * values, offsets[:-1][filled] - offsets[0])
    return np.sqrt(sums)


def wave_tables(
    wave: pd.DataFrame, meta: pa.Table, out: pa.Table, split: str | None, known_sentences: SentenceKeys
) -> tuple[dict[str, pa.Table], pd.DataFrame]:
    """The wave's part tables for the driver to commit (pairs, sentences, and cells and word_cells unless the
    stage-2 tasks wrote them) and its failed pairs."""
    out, _ = exactly_once(out)  # compute_cells already dropped and counted copies: then a no-op
    missing = np.setdiff1d(np.arange(len(wave)), out.column("ord").to_numpy())
    if len(missing):
        raise RuntimeError(f"{len(missing)} pairs of the wave came back from no actor")
    failed_mask = out.column("failure").is_valid()
    ok = out.filter(pc.invert(failed_mask))
    failed = out.filter(failed_mask)
    sel = wave.iloc[ok.column("ord").to_numpy()] if ok.num_rows else wave.iloc[[]]

    n_cells, n_words = ok.column("n_cells"), ok.column("n_word_cells")
    pairs = pa.table(
        {
            "pair_id": arrow(sel.pair_id),
            "row": pa.array(sel.row.to_numpy(), pa.int64()),
            "split": pa.nulls(len(sel), pa.string()) if split is None else pa.array([split], pa.string()).take(
                pa.array(np.zeros(len(sel), np.int64))),  # fmt: skip
            "label": pa.array(sel.label.to_numpy(), pa.float64(), from_pandas=True),
            **{name: arrow(sel[name]) for name in ("text_a", "text_b", "sentence_id_a", "sentence_id_b")},
            **{
                name: ok.column(name)
                for name in (
                    "n_tokens_a", "n_tokens_b", "score", "attribution_sum", "positive_sum", "negative_sum",
                    "ref_sim_a", "ref_sim_b", "ref_term", "target", "completeness_error", "factor_error_a",
                    "factor_error_b", "steps_a", "steps_b", "truncated_a", "truncated_b",
                )  # fmt: skip
            },
            "n_cells": n_cells,
            "n_word_cells": n_words,
            **{name: ok.column(name) for name in TOP_CELLS},
            # pass-through columns (--keep-columns, or the dataset's own), strings
            **{c[len(KEEP_PREFIX) :]: arrow(sel[c]) for c in sel.columns if str(c).startswith(KEEP_PREFIX)},
        }
    )
    tables: dict[str, pa.Table] = {"pairs": pairs}
    if ok.column("cell_i").null_count < ok.num_rows:  # the cells came back as lists: the driver writes them
        tables["cells"] = _explode(ok, CELL_LISTS)
        tables["word_cells"] = _explode(ok, WORD_LISTS)

    # New sentences (not stored before, not failed), in sentence-id order: one take (one copy of the metadata).
    ids = meta.column("sentence_id")
    keep = np.flatnonzero(~known_sentences.contains(ids) & ~meta.column("failure").is_valid().to_numpy(False))
    order = pc.sort_indices(ids.take(pa.array(keep, pa.int64()))).to_numpy()
    meta = meta.take(pa.array(keep[order], pa.int64()))
    embedding = float_lists(meta.column("embedding"))
    sentences = pa.table(
        {
            "sentence_id": meta.column("sentence_id"),
            "text": meta.column("text"),
            "n_tokens": meta.column("n_tokens"),
            "n_words": pc.list_value_length(meta.column("words")).cast(pa.int32()),
            "tokens": meta.column("tokens"),
            "word_ids": meta.column("word_ids"),
            "token_start": meta.column("token_start"),
            "token_end": meta.column("token_end"),
            "words": meta.column("words"),
            "factor_error": meta.column("factor_error"),
            "n_steps": meta.column("n_steps"),
            "truncated": meta.column("truncated"),
            "embedding_norm": pa.array(vector_norms(embedding), pa.float64()),
            "embedding": embedding,
            "reference_embedding": float_lists(meta.column("reference_embedding")),
        }
    )
    failed_rows = wave.iloc[failed.column("ord").to_numpy()] if failed.num_rows else wave.iloc[[]]
    failures = quarantine_frame(
        rows=failed_rows.row.to_numpy(),
        pair_ids=failed_rows.pair_id.tolist(),
        reasons=[failure_reason(d) for d in failed.column("failure").to_pylist()],
        details=failed.column("failure").to_pylist(),
        texts_a=failed_rows.text_a.tolist(),
        texts_b=failed_rows.text_b.tolist(),
        labels=[None if math.isnan(x) else repr(x) for x in failed_rows.label],
    )
    tables["sentences"] = sentences
    return tables, failures


def failure_reason(detail: str | None) -> str:
    """The quarantine reason of a pair the engine failed on: `not_converged` (adaptive N stopped at --max-steps above
    --tolerance) or `attribution_error` (NaN/Inf, an error)."""
    return "not_converged" if (detail or "").startswith(NOT_CONVERGED) else "attribution_error"


def _quarantine_table(frame: pd.DataFrame) -> pa.Table:
    frame = frame.sort_values(["row", "reason"], kind="stable")
    return pa.table({f.name: pa.array(frame[f.name].tolist(), f.type) for f in SCHEMAS["quarantine"]})
