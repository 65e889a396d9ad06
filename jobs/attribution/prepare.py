"""Stage 0 of an attribution run, no Ray and no writes: read and select the pairs, load the engine, validate, and
hash the run's settings into its run id (`run_config`, jobs/config.py's RunConfig) -> `Prepared`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

import xsbert_core
from xsbert_core import Explainer, InputError, weights_fingerprint
from xsbert_core.cli import writable_folder
from xsbert_core.models import check_device

from ..config import Attribution, JobSettings, RunConfig
from ..store import STORE_VERSION, open_store, pair_content_keys, pair_keys, run_id
from ..store.uri import resolve
from .inputs import CHUNK_ROWS, Pairs
from .memory import release_memory, system_memory_pool
from .validate import SeenIds, quarantine_frame, stream_pairs, validate
from .worklist import WorkList


# --------------------------------------------------------------------------- helpers
def sentence_id(text: str) -> str:
    """16 hex digits of sha256(text): the sentence's key in `sentences`, `pairs.sentence_id_a/b`."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def with_sentence_ids(frame: pd.DataFrame) -> pd.DataFrame:
    """The pairs with sentence_id_a/b (sentence_id of text_a/b) as Arrow strings: each distinct text hashed once, up
    front, so that a wave's tables take the ids as columns (no Python string per pair and wave in the driver)."""
    n = len(frame)
    codes, uniques = pd.factorize(pd.concat([frame.text_a, frame.text_b], ignore_index=True))
    ids = pa.array([sentence_id(t) for t in uniques], pa.string())
    dtype = pd.ArrowDtype(pa.string())
    return frame.assign(
        sentence_id_a=pd.Series(pd.arrays.ArrowExtensionArray(ids.take(pa.array(codes[:n]))), index=frame.index,
                                dtype=dtype),
        sentence_id_b=pd.Series(pd.arrays.ArrowExtensionArray(ids.take(pa.array(codes[n:]))), index=frame.index,
                                dtype=dtype),
    )  # fmt: skip


def run_config(attribution: Attribution, explainer: Explainer, fingerprint: str, pairs) -> dict[str, Any]:
    """The run's RunConfig (jobs/config.py: everything that changes the stored numbers, listed once) as the manifest
    records it; its hash is the run id. The engine's settings are the explainer's, resolved."""
    return RunConfig(
        store_version=STORE_VERSION,
        code_version=xsbert_core.__version__,
        weights_sha256=fingerprint,
        **RunConfig.engine_fields(explainer.settings),
        truncation=attribution.truncation,
        min_abs=float(attribution.min_abs),
        cells=attribution.cells,
        dataset={
            "name": pairs.source.identity,
            "config": pairs.source.config,
            "split": pairs.source.split,
            "columns": pairs.columns.as_dict(),
        },
    ).as_dict()


# --------------------------------------------------------------------------- stages
@dataclass
class Prepared:
    """What a run needs before anything is computed: its rows, validated; the engine; the run id."""

    settings: JobSettings
    pairs: Pairs
    explainer: Explainer
    work: WorkList  # the rows to attribute (validate's `good`), spilled to a memory-mapped file as they were validated
    quarantine: pd.DataFrame  # rows rejected up front, with their reasons
    config: dict[str, Any]  # what the run id hashes
    run_id: str
    n_in: int = 0  # rows selected (pairs.rows stays empty: the rows went chunk by chunk into `work` or `quarantine`)
    started_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    t_start: float = field(default_factory=time.perf_counter)


def prepare(job: JobSettings, chunk_rows: int = CHUNK_ROWS) -> Prepared:
    """Stage 0, no Ray and no writes to the store: read and select the pairs, load the model, validate, hash the
    config. The source is read, validated and tokenised `chunk_rows` rows at a time, and each chunk's good rows go
    to the work list's file, so the driver never holds the selection as Python objects (bench/driver_setup.py).
    Arrow allocates from the system allocator meanwhile (system_memory_pool)."""
    with system_memory_pool():
        return _prepare(job, chunk_rows)


def _prepare(job: JobSettings, chunk_rows: int) -> Prepared:
    t_start = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    sel, a = job.selection, job.attribution
    # --device before anything is read: a name torch knows, and with --executor local a device this machine has (the
    # factor actors' machines are theirs to check)
    check_device(job.execution.device, here=job.execution.executor == "local")
    # A local --out that cannot be made, before the model loads (one that exists may hold the run: a rerun reads it,
    # read-only if need be, and the first write says why it cannot be made)
    out = resolve(job.output.out)
    if isinstance(out, Path) and not out.exists():
        writable_folder(out, f"--out {job.output.out}")
    stream = stream_pairs(
        sel.dataset, split=sel.split, config=sel.config, qqp=sel.qqp_path,
        text_a=sel.text_a_column, text_b=sel.text_b_column, label=sel.label_column, ids=sel.id_column,
        label_range=sel.label_bounds(), sample=sel.sample, seed=sel.seed, limit=sel.limit,
        keep=sel.keep_columns, chunk_rows=chunk_rows,
    )  # fmt: skip
    pairs = stream.pairs
    explainer = Explainer.from_settings(a.engine)
    max_tokens = explainer.split.max_seq_length

    config = run_config(a, explainer, weights_fingerprint(explainer.model), pairs)
    rid = run_id(config)
    # A rerun tokenises only the pairs not in the store yet (404k QQP: ~1M texts, twice, otherwise). Read-only.
    peek = open_store(job.output.out, rid, retry_s=job.output.store_retry_s)
    peek.check()  # an unreachable or missing bucket says so here, as it would when the run opens
    stored, stored_content = peek.done_pair_keys_with_content()
    seen, work, rejected = SeenIds(), WorkList(), []
    n_in = n_long = n_changed = n_rejected = 0
    first_long = first_changed = first_rejected = None
    try:
        for rows in stream.chunks:
            n_in += len(rows)
            good, quarantine = validate(rows, pairs.label_kind, pairs.label_range, count=explainer.token_counts,
                                        max_tokens=max_tokens, quarantine_long=a.truncation == "quarantine",
                                        max_chars=a.max_chars, stored=stored, seen=seen)  # fmt: skip
            del rows
            if a.truncation == "error":
                long = good.pair_id[(good.n_tokens_a > max_tokens) | (good.n_tokens_b > max_tokens)]
                n_long += len(long)
                first_long = first_long if first_long is not None or not len(long) else long.iat[0]
            if len(quarantine):
                held = stored_now_rejected(quarantine, stored)
                n_rejected += len(held)
                first_rejected = first_rejected if first_rejected is not None or not held else held[0]
                rejected.append(quarantine)
            if len(good):
                chunk = with_sentence_ids(compact(good))
                changed = changed_pairs(chunk, stored, stored_content)
                n_changed += len(changed)
                first_changed = first_changed if first_changed is not None or not changed else changed[0]
                work.append(chunk)
                del chunk
            del good, quarantine
        if n_long:
            raise InputError(
                f"{n_long} pairs have a text over max_seq_length={max_tokens} (first: pair {first_long}); "
                "use --truncation quarantine or warn"
            )
        if n_changed:
            raise InputError(
                f"{n_changed} pair(s) of the dataset are in the run with other texts or labels than the dataset has "
                f"now (first: pair {first_changed!r}): a run knows its pairs by id, so texts or labels changed under "
                "the same ids make another dataset; write it to another --out, or give the changed pairs new ids"
            )
        if n_rejected:
            pair, reason = first_rejected
            raise InputError(
                f"{n_rejected} pair(s) the run holds are quarantined now (first: pair {pair!r}, {reason}): their texts "
                "or labels changed under the same ids, or --max-chars or --label-range rejects what they passed when "
                "they were computed; write the dataset to another --out, or give the changed pairs new ids"
            )
        work.finish()
    except BaseException:
        work.discard()
        raise
    quarantine = (pd.concat(rejected, ignore_index=True) if rejected
                  else quarantine_frame([], [], [], [], [], [], []))  # fmt: skip
    release_memory()
    return Prepared(job, pairs, explainer, work, quarantine, config, rid, n_in=n_in, started_at=started_at,
                    t_start=t_start)  # fmt: skip


def changed_pairs(chunk: pd.DataFrame, stored: np.ndarray, stored_content: np.ndarray) -> list[str]:
    """The ids of the chunk's pairs that the run holds already (`stored`) computed for other texts or stored with
    another label (`stored_content`; both RunStore.done_pair_keys_with_content), in the chunk's order."""
    if not len(stored):
        return []
    held = np.isin(pair_keys(chunk.pair_id.tolist()), stored)
    if not held.any():
        return []
    sub = chunk[held]
    keys = pair_content_keys(sub.pair_id.tolist(), sub.sentence_id_a.tolist(), sub.sentence_id_b.tolist(),
                             sub.label.to_numpy(np.float64))  # fmt: skip
    return sub.pair_id[~np.isin(keys, stored_content)].tolist()


# What validate quarantines for a row's own texts or label: a pair the run holds (it passed when it was computed)
# quarantined now for one of these has changed under its id. Not duplicate_pair_id (another row with a held id: the
# first one is the pair) nor the ones without an id.
CONTENT_REASONS = ("empty_text_", "too_long_", "undecodable_text_", "no_content_", "bad_label")


def stored_now_rejected(quarantine: pd.DataFrame, stored: np.ndarray) -> list[tuple[str, str]]:
    """(id, reason) of the pairs the run holds (`stored`) that validate quarantines now for their texts or label
    (CONTENT_REASONS), in the chunk's order: stored, they would be in the run both computed and quarantined."""
    if not len(stored) or not len(quarantine):
        return []
    content = quarantine[quarantine.reason.str.startswith(CONTENT_REASONS) & quarantine.pair_id.notna()]
    if not len(content):
        return []
    held = content[np.isin(pair_keys(content.pair_id.tolist()), stored)]
    return list(zip(held.pair_id.tolist(), held.reason.tolist()))


def compact(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its string columns (ids, texts, pass-through columns) in Arrow buffers instead of one
    Python object per value: the form in which each chunk's good rows go to the work list (404k QQP-like pairs in
    all: 132 -> 70 MB)."""
    return frame.astype({c: pd.ArrowDtype(pa.string()) for c in frame.columns if frame[c].dtype == object})
