"""Attribute every pair of a dataset on Ray (or, with --executor local, in this process without Ray) and write the
Parquet store (docs/STORE.md).

    python -m jobs.attribute                       # the embedded default: a seeded STS-B test sample
    python -m jobs.attribute --dataset stsb --split test --limit 20 --steps 4 --out runs
    ray job submit --working-dir . -- python -m jobs.attribute --dataset qqp --num-actors 8
    python -m jobs.attribute --dataset qqp --executor local --device cuda --cells same-token   # no Ray needed

Pipeline: the pairs are cut into waves (a few thousand each; each wave commits atomically, so a killed run
resumes), and one Ray Data pipeline computes the sentence factors of every wave, wave after wave, in one actor pool
(of a group of waves, for runs of more than STAGE1_GROUP_BLOCKS factor batches):

    read, validate, tokenise in chunks of 16,384 rows -> quarantine | the work list (a memory-mapped spill file)
    -> waves in wave_order | per wave: its unique sentences, longest first, in blocks of --batch-size
    -> map_batches(FactorActor, ActorPoolStrategy)   sentence factors P, e(x), e(r)   [stage 1, GPU if any]
       streamed back to the driver; once all of a wave's sentences are back (the pool goes on with the next):
    -> pair_cells (Ray tasks, PAIR_BATCH pairs each)  pair numbers + cells + word cells  [stage 2, CPU]
    -> part files of pairs, cells, word_cells, sentences (+ quarantine), renamed into place, pairs last

--executor local (jobs/_local.py) runs stages 1-2 in this process instead, without Ray: the same waves and factor
batches through one FactorActor on --device, the same PairCells over PAIR_BATCH pairs, the same commits; the store
(and its run id) is the one a Ray run of the same settings writes, and either executor resumes the other's run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

import xsbert_core
from xsbert_core import Explainer, InputError, XsbertError, weights_fingerprint
from xsbert_core.explainer import DEFAULT_LAYER, DEFAULT_MAX_STEPS, DEFAULT_RULE, DEFAULT_STEPS
from xsbert_core.models import DEFAULT_MODEL
from xsbert_core.precision import DEFAULT_PRECISION, PRECISIONS
from xsbert_core.quadrature import SUPPORTED_RULES

from ._actors import CELL_CHOICES, CELL_LISTS, NOT_CONVERGED, TOP_CELLS, WORD_LISTS
from ._inputs import CHUNK_ROWS, KEEP_PREFIX, Pairs, SeenIds, quarantine_frame, sorted_find, stream_pairs, validate
from ._ray import filter_stderr, init_ray, quiet_ray
from .placement import Placement
from .store import (
    SCHEMAS,
    STORE_RETRY_S,
    STORE_VERSION,
    TABLES,
    RunStore,
    StoreError,
    open_store,
    pair_keys,
    run_id,
)

logger = logging.getLogger("jobs.attribute")

# The embedded default (no --dataset): bundled STS-B test, a seeded sample that finishes in a few
# minutes on 2 CPU cores with all-MiniLM-L6-v2 at the engine's default layer and N (measured: ~0.6 s
# per sentence per core at layer 3, N = 16; 100 pairs are ~190 unique sentences).
DEFAULT_DATASET = "stsb"
DEFAULT_SPLIT = "test"
DEFAULT_SAMPLE = 100
DEFAULT_OUT = "runs"
# Adaptive N is the dataset default: without --steps and --tolerance, each sentence's N doubles from DEFAULT_STEPS
# (up to --max-steps) until its factor error ||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)|| is <= this; a
# sentence still above it at --max-steps quarantines its pairs (reason `not_converged`). `--steps N` alone is a fixed
# N (the behaviour, and the run ids, of runs before adaptive N became the default). bench/adaptive.py measures the
# nodes it gives STS-B sentences and what it costs against a fixed N of equal worst-case error.
DEFAULT_ADAPTIVE_TOLERANCE = 1e-3
# Sentences per actor call, of similar length (sorted, longest first). On CPU small batches balance the
# actors (a call is seconds to minutes; the last one decides the wave's tail), on GPU large ones fill it.
DEFAULT_BATCH_SIZE_CPU = 16
DEFAULT_BATCH_SIZE_GPU = 128
# Pairs per commit. Bounds the work lost to a kill and, with Ray Data's backpressure, the factors held in the object
# store (~22 KB per MiniLM sentence, ~2x for mpnet: the wave in stage 2 and what the actors computed ahead).
DEFAULT_WAVE_SIZE_CPU = 2048
DEFAULT_WAVE_SIZE_GPU = 16384
# Factor batches (Ray Data blocks) per stage-1 pipeline: the waves of a run are served in groups of at most this
# many (FactorStream), each by one dataset and actor pool; the driver's per-block records end with each group.
STAGE1_GROUP_BLOCKS = 2048
# Collect garbage when a group's pipeline ends (FactorStream.close; bench/driver_peaks.py floors turns it off).
STAGE1_COLLECT = True
# Pairs per PairCells call (stage 2 is ~1 ms per pair).
PAIR_BATCH = 256
TRUNCATION_CHOICES = ("quarantine", "warn", "error")
CELL_WRITERS = ("auto", "workers", "driver")
EXECUTORS = ("ray", "local")
# A batch whose actor dies is retried on a restarted actor; bounded so a poisonous batch fails the run
# (Ray Data's own default is unbounded); the actors themselves restart as often as needed over a run. Ray 2.60 still
# takes these as remote args, with a deprecation warning (RETRY_ARGS_WARNING) that the stages keep out of the log;
# pyproject pins ray < 2.64, which drops them.
DEFAULT_MAX_RETRIES = 3  # --max-retries: retries of a factor batch on a restarted actor (and of a cell task)

RETRY_ARGS_WARNING = r"`ray_remote_args` is deprecated"


class JobFailedError(XsbertError, RuntimeError):
    """The run stopped part-way (a batch that kept killing its workers, retried copies that disagree): the
    waves before are committed, nothing of the failing wave is; the same command resumes the run."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m jobs.attribute",
        description="Token-pair attributions for every pair of a dataset, on Ray, into a Parquet store. "
        f"Without --dataset: --dataset {DEFAULT_DATASET} --split {DEFAULT_SPLIT} --sample {DEFAULT_SAMPLE} --seed 0.",
    )
    d = p.add_argument_group("data")
    d.add_argument("--dataset", default=None,
                   help="stsb | qqp (bundled) | negation | adjectives (generated, docs/ANALYSES.md) | "
                        "a TSV/CSV/Parquet/JSONL file (.gz ok) | a `datasets` folder | "
                        "a hub name such as glue/qqp or sentence-transformers/stsb")  # fmt: skip
    d.add_argument("--split", default=None, help="split (stsb: train|dev|test, default test; qqp: train)")
    d.add_argument("--config", default=None, help="hub dataset config (glue/qqp needs none)")
    d.add_argument("--qqp-path", default=None, help="the QQP subset file (default: $XSBERT_QQP, ../shared/data/qqp)")
    d.add_argument("--limit", type=int, default=None, help="the first N rows (after --sample)")
    d.add_argument("--sample", type=int, default=None, help="a seeded random sample of N rows")
    d.add_argument("--seed", type=int, default=0, help="seed of --sample")
    d.add_argument("--text-a-column", default=None)
    d.add_argument("--text-b-column", default=None)
    d.add_argument("--label-column", default=None, help="'none' for no labels")
    d.add_argument("--id-column", default=None, help="id column(s), comma-separated; 'none' for row numbers")
    d.add_argument("--label-range", default=None, metavar="LO:HI", help="labels outside are quarantined")
    d.add_argument("--keep-columns", default=None, metavar="A,B",
                   help="dataset columns copied as strings into the pairs table (part of the run config)")
    m = p.add_argument_group("attribution (as in `xsbert explain`)")
    m.add_argument("--model", default=DEFAULT_MODEL)
    m.add_argument("--layer", type=int, default=DEFAULT_LAYER)
    m.add_argument("--mode", choices=("auto", "approx", "exact"), default="auto",
                   help="auto: exact for a reference-shifted model, else approx")
    m.add_argument("--similarity", default="auto", help="cos, dot, or auto (the model's own similarity function)")
    m.add_argument("--rule", default=DEFAULT_RULE, help=" | ".join(SUPPORTED_RULES))
    m.add_argument("--steps", type=int, default=None,
                   help=f"quadrature nodes N: a fixed N when given without --tolerance; else where adaptive N starts "
                        f"(default {DEFAULT_STEPS})")  # fmt: skip
    m.add_argument("--tolerance", type=float, default=None,
                   help="adaptive N: N doubles per sentence until its factor error <= this (default "
                        f"{DEFAULT_ADAPTIVE_TOLERANCE:g} unless --steps is given); a sentence still above it at "
                        "--max-steps quarantines its pairs (not_converged)")  # fmt: skip
    m.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="cap for adaptive N")
    m.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                   help="arithmetic of the Jacobian-vector products (tf32: CUDA only; bf16/fp16: reduced-precision "
                        "JVPs, float32 sums); part of the run id unless fp32")  # fmt: skip
    m.add_argument("--truncation", choices=TRUNCATION_CHOICES, default="quarantine",
                   help="texts over max_seq_length: quarantine the pair (default), warn (truncate and flag), "
                        "or error (stop before computing)")  # fmt: skip
    m.add_argument("--min-abs", type=float, default=0.0, help="store only cells with |value| >= this (sums unchanged)")
    m.add_argument("--cells", choices=CELL_CHOICES, default="all",
                   help="which cells to store: all (default), same-token (token_a = token_b, word_a = word_b: what "
                        "sql/lexical_ranks.sql reads: ~4%% of QQP's) or none; part of the run id; the pairs' sums, "
                        "ranks and top cells stay over every cell")  # fmt: skip
    r = p.add_argument_group("execution")
    r.add_argument("--executor", choices=EXECUTORS, default="ray",
                   help="ray (default): stages 1-2 on a Ray cluster; local: in this process, without Ray (Ray need "
                        "not be installed; same store, same run id): one model on --device, e.g. one GPU")  # fmt: skip
    r.add_argument("--ray-address", default=None, help="join this cluster (default: $RAY_ADDRESS, else start one)")
    r.add_argument("--num-actors", type=int, default=None,
                   help="factor actors (default: one per GPU, else per CPU; --executor local: one)")
    r.add_argument("--gpus-per-actor", type=float, default=None, help="default 1 when the cluster has GPUs, else 0")
    r.add_argument("--cpus-per-actor", type=float, default=None,
                   help="CPUs (and torch threads) per factor actor (default 1; --executor local: torch's own default)")
    r.add_argument("--batch-size", type=int, default=None, help="sentences per actor batch (default 16 CPU / 128 GPU)")
    r.add_argument("--wave-size", type=int, default=None, help="pairs per atomic commit (default 2048 CPU / 16384 GPU)")
    r.add_argument("--max-retries", type=int, default=DEFAULT_MAX_RETRIES,
                   help="a batch whose worker died is retried this often (on a restarted actor), then the run fails")
    r.add_argument("--cell-writer", choices=CELL_WRITERS, default="auto",
                   help="who writes the cells and word cells: the stage-2 tasks (workers; the driver only commits) "
                        "or the driver. auto, decided before each wave: workers on object storage or where every "
                        "node sees the local --out (nodes that join are asked), else the driver; workers stops the "
                        "job before a wave with a node that does not see it")  # fmt: skip
    r.add_argument("--device", default=None,
                   help="torch device of the factor actors (default: cuda when they get GPUs, else cpu)")  # fmt: skip
    o = p.add_argument_group("output")
    o.add_argument("--out", default=DEFAULT_OUT,
                   help="store root: a local folder, s3://bucket/prefix or gs://bucket/prefix; the run is <out>/<run id>")
    o.add_argument("--store-retry-s", type=float, default=None, metavar="S",
                   help="how long one call to object storage is retried when the store answers 5xx/429 or the "
                        "connection fails, with backoff and jitter, before the job stops (exit 2; the same command "
                        f"resumes); default $XSBERT_STORE_RETRY_S, else {STORE_RETRY_S:.0f} s")  # fmt: skip
    o.add_argument("-q", "--quiet", action="store_true", help="no Ray Data progress bars")
    args = p.parse_args(argv)
    if args.dataset is None:
        args.dataset = DEFAULT_DATASET
        args.split = args.split or DEFAULT_SPLIT
        if args.sample is None and args.limit is None:
            args.sample = DEFAULT_SAMPLE
    if args.steps is None:  # adaptive N by default; --steps alone is a fixed N
        args.steps = DEFAULT_STEPS
        if args.tolerance is None:
            args.tolerance = DEFAULT_ADAPTIVE_TOLERANCE
    return args


# --------------------------------------------------------------------------- helpers
def _label_range(text: str | None) -> tuple[float, float] | None:
    if not text:
        return None
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError as exc:
        raise InputError(f"--label-range must be LO:HI, got {text!r}") from exc
    return lo, hi


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


def arrow(column: pd.Series, type_: pa.DataType = pa.string()) -> pa.Array | pa.ChunkedArray:
    """A pandas column as Arrow: an Arrow-backed one (compact) as it is, zero-copy; others converted."""
    if isinstance(column.dtype, pd.ArrowDtype):
        return column.array.__arrow_array__().cast(type_)
    return pa.array(column.tolist(), type_)


_HEX = np.full(256, 255, dtype=np.uint64)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint64)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint64)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint64)


def mapped_keys(pieces: Iterable[np.ndarray], directory: str | None = None) -> np.ndarray:
    """The concatenation of `pieces` (uint64 arrays) as a read-only memory-mapped file under `directory` (default:
    tempfile's), its folder removed at once: the keys' pages are the kernel's to drop and read again (file-backed),
    not the driver's own heap, which so holds none of them however many pairs a run has. Written piece by piece."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="xsbert-keys-", dir=directory)
    try:
        path, n = os.path.join(folder, "keys.u64"), 0
        with open(path, "wb") as fh:
            for piece in pieces:
                np.ascontiguousarray(piece, np.uint64).tofile(fh)
                n += len(piece)
        return np.memmap(path, np.uint64, mode="r", shape=(n,)) if n else np.zeros(0, np.uint64)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sorted_contains(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """One bool per query: in the sorted array `keys`? (sorted_find's second half.)"""
    return sorted_find(keys, queries)[1]


def _merge_sorted(old: np.ndarray, new: np.ndarray, chunk: int = 1 << 20) -> Iterator[np.ndarray]:
    """The sorted union of the sorted, disjoint `old` and `new`, `chunk` keys of `old` at a time."""
    at = np.searchsorted(old, new)  # new[k] goes before old[at[k]]
    j = 0
    for start in range(0, len(old), chunk):
        stop = min(start + chunk, len(old))
        k = int(np.searchsorted(at, stop))  # those that go before old[stop]
        yield np.sort(np.concatenate([old[start:stop], new[j:k]]))
        j = k
    yield new[j:]


class SentenceKeys:
    """The set of sentence ids a run has stored, as sorted 64-bit integers (the ids are 16 hex digits) in a
    memory-mapped file (mapped_keys): 8 bytes per sentence of the page cache instead of a Python string in a set
    (~90; 404k QQP pairs have ~540k sentences), none of the driver's heap. add() writes the merged keys to a new
    file (a wave's new keys and one chunk of the old ones in memory at a time)."""

    def __init__(self, ids: Iterable[str] | pa.Array | pa.ChunkedArray = (), directory: str | None = None) -> None:
        self.directory = directory
        self.keys = mapped_keys([np.unique(self._keys(ids))], directory)

    @staticmethod
    def _keys(ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The ids as uint64, read from the Arrow string buffers (no Python object per id)."""
        arr = ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(list(ids), pa.string())
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        arr = arr.cast(pa.string())
        if arr.null_count:
            raise ValueError("a sentence id is missing (null)")
        if not len(arr):
            return np.zeros(0, np.uint64)
        offsets = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset : arr.offset + len(arr) + 1]
        if np.any(np.diff(offsets) != 16):
            raise ValueError("a sentence id is not 16 hex digits")
        digits = _HEX[np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].reshape(len(arr), 16)]
        if np.any(digits == 255):
            raise ValueError("a sentence id is not 16 hex digits")
        keys = np.zeros(len(arr), np.uint64)
        for k in range(16):
            keys = (keys << np.uint64(4)) | digits[:, k]
        return keys

    def contains(self, ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
        """One bool per id: stored already?"""
        return sorted_contains(self.keys, self._keys(ids))

    def add(self, ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> None:
        new = np.unique(self._keys(ids))
        new = new[~sorted_contains(self.keys, new)]
        if len(new):
            self.keys = mapped_keys(_merge_sorted(self.keys, new), self.directory)

    def __len__(self) -> int:
        return len(self.keys)


def run_config(args: argparse.Namespace, explainer: Explainer, fingerprint: str, pairs) -> dict[str, Any]:
    """Everything that changes the stored numbers; its hash is the run id. Not --limit/--sample: they
    select rows, they change no row's numbers (a larger selection later computes only what is new)."""
    s = explainer.settings
    return {
        "store_version": STORE_VERSION,
        "code_version": xsbert_core.__version__,
        "model": s["model"],
        "weights_sha256": fingerprint,
        "mode": s["mode"],
        "similarity": s["similarity"],
        "layer": s["layer"],
        "n_layers": s["n_layers"],
        "rule": s["rule"],
        "steps": s["steps"],
        "tolerance": s["tolerance"],
        "max_steps": s["max_steps"],
        "truncation": args.truncation,
        "min_abs": float(args.min_abs),
        # only when not all: the run ids of stores of every cell stay what they were before --cells
        **({"cells": args.cells} if args.cells != "all" else {}),
        "dataset": {
            "name": pairs.source.identity,
            "config": pairs.source.config,
            "split": pairs.source.split,
            "columns": pairs.columns.as_dict(),
        },
        # Only when not float32: the configs (and so the run ids) of float32 runs are those made before precision
        # was a setting, so their stores are found again.
        **({"precision": s["precision"]} if s.get("precision", DEFAULT_PRECISION) != DEFAULT_PRECISION else {}),
    }


def ray_identity(ray) -> dict[str, Any]:
    """Which Ray this run used: its GCS address, the driver's node and Ray job id (recorded in the manifest,
    so that a run submitted with `ray job submit` can be matched with the head's job list)."""
    ctx = ray.get_runtime_context()
    return {"gcs_address": ctx.gcs_address, "node_id": ctx.get_node_id(), "job_id": ctx.get_job_id()}


def resources(args: argparse.Namespace, ray) -> dict[str, Any]:
    total = ray.cluster_resources()
    cpus, gpus = float(total.get("CPU", 1)), float(total.get("GPU", 0))
    gpus_per_actor = args.gpus_per_actor if args.gpus_per_actor is not None else (1.0 if gpus > 0 else 0.0)
    if gpus_per_actor > 0:
        n_actors = args.num_actors or max(1, int(gpus // gpus_per_actor))
        cpus_per_actor = min(args.cpus_per_actor or 1.0, max(0.25, cpus / n_actors))
    else:
        cpus_per_actor = args.cpus_per_actor or 1.0
        n_actors = args.num_actors or max(1, int(cpus // cpus_per_actor))
    # The actor pool lives for the whole run, so stage 2 runs beside it: the pool reserves at most all but one CPU
    # (half of a one-CPU cluster) and the stage-2 tasks take that one. On CPU only, the actors still run
    # `threads` torch threads each; the reservation is Ray's bookkeeping (as in jobs.parse's pool).
    spare = min(1.0, cpus / 2)
    reserved = min(cpus_per_actor, (cpus - spare) / n_actors)
    return {
        "cluster_cpus": cpus,
        "cluster_gpus": gpus,
        "num_actors": n_actors,
        "gpus_per_actor": gpus_per_actor,
        "cpus_per_actor": reserved,
        "cells_cpus": min(1.0, max(spare, cpus - reserved * n_actors)),
        "device": args.device or ("cuda" if gpus_per_actor > 0 else "cpu"),
        "threads": max(1, int(cpus_per_actor)),
        "batch_size": args.batch_size or (DEFAULT_BATCH_SIZE_GPU if gpus_per_actor > 0 else DEFAULT_BATCH_SIZE_CPU),
        # CPU: one call in flight per actor, so that an idle actor takes the next batch (longest first).
        "tasks_in_flight": 2 if gpus_per_actor > 0 else 1,
    }


# --------------------------------------------------------------------------- stage 1: one pipeline for the run
def factor_blocks(waves: Iterable[pd.DataFrame], batch_size: int) -> Iterator[tuple[list[pa.Table], int]]:
    """Stage 1's input, wave by wave: the wave's unique sentences, longest first, in batches of `batch_size` that
    never span two waves, each batch one row (sentence_id and text as lists, wave); and the number of sentences of
    the wave.

    Each row is one actor call (map_batches with batch_size=1), so a wave's batches are the same whether the run is
    whole or resumed, and so are its factors, to the bit. A sentence used by two waves is computed in both (wave_order makes that
    rare), which keeps each wave's factors to itself."""
    for w, wave in enumerate(waves):
        lengths = dict(zip(wave.text_a, wave.n_tokens_a)) | dict(zip(wave.text_b, wave.n_tokens_b))
        known = dict(zip(wave.text_a, wave.sentence_id_a)) | dict(zip(wave.text_b, wave.sentence_id_b))
        texts = sorted(lengths, key=lambda t: (-lengths[t], t))
        ids = [known[t] for t in texts]  # with_sentence_ids hashed them once, when the chunk was spilled
        blocks = [pa.table({"sentence_id": [ids[k : k + batch_size]], "text": [texts[k : k + batch_size]],
                            "wave": pa.array([w], pa.int32())}) for k in range(0, len(texts), batch_size)]  # fmt: skip
        yield blocks, len(texts)


class FactorStream:
    """Stage 1, wave after wave: Ray Data pipelines (an actor pool each, the model loaded once per actor), each over
    the sentences of a group of consecutive waves (at most STAGE1_GROUP_BLOCKS factor batches; one group for runs
    of up to ~260k sentences at GPU batches, ~33k at CPU ones). The factor blocks stream back as the actors finish
    them and stay in the object store (the driver maps their metadata, never their factor bytes); `wave(w)` returns
    wave w's blocks once all its sentences are back. Meanwhile the pool goes on with the group's next waves, as far
    as Ray Data's backpressure lets it. A batch that kept killing its actor raises (ray.exceptions) from `wave`.

    Why groups: a Ray Data dataset keeps a stats record of every block it has output until it ends (Ray 2.60,
    ray-project/ray#66016), so one dataset for a whole run grows the driver with the run; a group bounds that, and
    the driver holds only the group's input batches (texts and ids in the object store), for the price of one pool
    start (model load) per group."""

    def __init__(self, ray, waves: Iterable[pd.DataFrame], args: argparse.Namespace, explainer: Explainer,
                 res: dict[str, Any]) -> None:  # fmt: skip
        self.ray, self.args, self.explainer, self.res = ray, args, explainer, res
        self._batches = factor_blocks(waves, res["batch_size"])
        self._pending: tuple[list[pa.Table], int] | None = None  # the next group's first wave, made already
        self.sizes: list[int] = []  # sentences of each wave that has joined a group
        self._last = -1  # the current group's last wave
        # Test hooks (tests/test_job*.py): kill one actor call / every call on a text / a NumericalError on a text /
        # log each actor start.
        self._hooks = {k: os.environ.get(f"XSBERT_TEST_{k.upper()}") or None
                       for k in ("kill_once", "kill_text", "kill_log", "fail_text", "start_log")}  # fmt: skip
        self._ds: Any = None
        self._bundles: Iterator[Any] | None = None
        self._executor = None
        self._got: dict[int, list[tuple[Any, pa.Table]]] = {}
        self._count: dict[int, int] = {}

    def _next_group(self) -> None:
        """End the current group's pipeline and build the next one's: the waves that follow, as many as fit in
        STAGE1_GROUP_BLOCKS factor batches (one wave at least), into the object store wave by wave."""
        from ray.data import ActorPoolStrategy

        from ._actors import FactorActor

        self.close()
        refs: list[Any] = []
        while True:
            if self._pending is None:
                self._pending = next(self._batches, None)
                if self._pending is None:
                    break
            blocks, size = self._pending
            if refs and len(refs) + len(blocks) > STAGE1_GROUP_BLOCKS:
                break
            refs += [self.ray.put(block) for block in blocks]
            self._count[len(self.sizes)] = 0
            self.sizes.append(size)
            self._pending = None
            del blocks
        if not refs:
            raise RuntimeError(f"stage 1 has no wave after wave {len(self.sizes)}")
        self._last = len(self.sizes) - 1
        args, explainer, res = self.args, self.explainer, self.res
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=RETRY_ARGS_WARNING)
            self._ds = self.ray.data.from_arrow_refs(refs).map_batches(
                FactorActor,
                fn_constructor_kwargs=dict(
                    model=args.model, layer=explainer.layer, mode=explainer.mode, similarity=explainer.similarity,
                    rule=explainer.rule, steps=explainer.steps, tolerance=explainer.tolerance,
                    max_steps=explainer.max_steps, truncation=explainer.truncation, device=res["device"],
                    precision=explainer.precision,
                    threads=res["threads"], batch_size=res["batch_size"], **self._hooks,
                ),  # fmt: skip
                batch_size=1,  # one row, one call: each row is a batch of sentences (factor_blocks)
                batch_format="pyarrow",
                compute=ActorPoolStrategy(
                    size=max(1, min(res["num_actors"], len(refs))), max_tasks_in_flight_per_actor=res["tasks_in_flight"]
                ),
                num_cpus=res["cpus_per_actor"],
                num_gpus=res["gpus_per_actor"] or None,
                max_restarts=-1,  # over the group's waves; a batch's own retries are bounded below
                max_task_retries=args.max_retries,
            )

    def _start(self) -> None:
        """Start the group's pipeline; it returns once the first block is back (so in `wave`, where its errors
        belong). The executor is kept too (a private API of Ray 2.60; `iter_internal_ref_bundles` is the same
        without it), so that a run that stops early (an error in stage 2, a commit) stops the pool instead of
        leaving it on."""
        self._bundles, _, self._executor = self._ds._execute_to_iterator(capture_executor=False)

    def wave(self, w: int) -> tuple[list[Any], pa.Table, dict[str, float]]:
        """(wave w's factor block refs, their metadata: every column but the factor bytes, timings). Waves are
        asked for in order."""
        t0 = time.perf_counter()
        meta_s = 0.0
        if w > self._last:
            self._next_group()
        if self._bundles is None:
            self._start()
        while self._count[w] < self.sizes[w]:
            try:
                bundle = next(self._bundles)  # type: ignore[call-overload]
            except StopIteration:
                raise RuntimeError(f"{self.sizes[w] - self._count[w]} sentences of wave {w + 1} came back from no "
                                   "actor") from None  # fmt: skip
            t1 = time.perf_counter()
            for ref in bundle.block_refs:
                # Zero-copy from the object store: the factor bytes are mapped, never read, by the driver (on a
                # multi-node cluster a block travels to the head node's object store once, ~22 KB per MiniLM sentence).
                block = self.ray.get(ref)
                if not block.num_rows:
                    continue
                waves = pc.unique(block.column("wave")).to_pylist()
                if len(waves) != 1:
                    raise RuntimeError(f"a factor block holds sentences of waves {waves}")
                self._got.setdefault(waves[0], []).append((ref, block.drop_columns(["factor"])))
                self._count[waves[0]] += block.num_rows
            meta_s += time.perf_counter() - t1
        got = self._got.pop(w, [])
        del self._count[w]
        meta = pa.concat_tables([m for _, m in got]) if got else None
        timings = {"factors_s": time.perf_counter() - t0 - meta_s, "factor_meta_s": meta_s}
        return [ref for ref, _ in got], meta, timings

    def close(self) -> None:
        """Stop the current group's pipeline (a no-op once it has finished) and let it go. Ray Data's executor and
        its stats hold each other in reference cycles, so they go only with a collection, made here unless
        STAGE1_COLLECT is off. (What it buys is not established: `bench/driver_peaks.py floors` at 30k pairs in
        groups of 64 blocks gave floors of 461 -> 471 and 463 -> 472 MB over 15 waves without it, 460 -> 462 and
        465 -> 472 with it.)"""
        if self._executor is not None:
            self._executor.shutdown(force=True)
        self._bundles = self._executor = self._ds = None
        self._got.clear()
        if STAGE1_COLLECT:
            gc.collect()


# --------------------------------------------------------------------------- stage 2, per wave
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
    args: argparse.Namespace,
    explainer: Explainer,
    res: dict[str, Any],
    sink: Any = None,
    seq: int | None = None,
) -> tuple[pa.Table, dict[str, Any]]:
    """Stage 2 for the wave's pairs from its factor blocks: (PAIR_SCHEMA rows, timings).

    One Ray task (`pair_cells`) per PAIR_BATCH pairs, spread over the cluster, each retried up to --max-retries times
    when its worker dies (a retry's copies are dropped by `exactly_once`). With a `sink` the stage-2 tasks write
    the cells and word cells as parts of wave `seq` themselves and the rows name those parts; without, the rows
    carry the cells as lists for the driver to write."""
    from ._actors import pair_cells

    t0 = time.perf_counter()
    pair_in = pair_input(wave)
    task = _remote(ray, pair_cells).options(num_cpus=res["cells_cpus"], max_retries=args.max_retries,
                                            scheduling_strategy="SPREAD")  # fmt: skip
    kwargs = dict(factor_refs=factor_refs, similarity=explainer.similarity, min_abs=args.min_abs,
                  kill_once=os.environ.get("XSBERT_TEST_KILL_CELLS_ONCE") or None, sink=sink, seq=seq,
                  cells=args.cells)  # fmt: skip
    try:
        refs = [task.remote(pair_in.slice(k, PAIR_BATCH), **kwargs) for k in range(0, len(wave), PAIR_BATCH)]
        out, duplicates = exactly_once(pa.concat_tables(ray.get(refs)))
    except JobFailedError:
        raise
    except Exception as exc:  # a task that could not write its parts: say so in one line
        why = _write_failure(exc) if sink is not None else None
        if why is None:
            raise
        hint = ""
        if "access denied" in why:  # 401/403 only: the workers need credentials of their own, where a node gets them
            hint = ("; the Ray workers reach the store with credentials of their own: the node's role / instance "
                    "profile, or a Kubernetes Secret or service account")  # fmt: skip
        raise StoreError(f"a stage-2 task could not write its part of the store ({why}){hint}") from None
    return out, {"cells_s": time.perf_counter() - t0, "duplicates_dropped": duplicates}


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


# --------------------------------------------------------------------------- stages
@dataclass
class Prepared:
    """What a run needs before anything is computed: its rows, validated; the engine; the run id."""

    args: argparse.Namespace
    pairs: Pairs
    explainer: Explainer
    work: WorkList  # the rows to attribute (validate's `good`), spilled to a memory-mapped file as they were validated
    quarantine: pd.DataFrame  # rows rejected up front, with their reasons
    config: dict[str, Any]  # what the run id hashes
    run_id: str
    n_in: int = 0  # rows selected (pairs.rows stays empty: the rows went chunk by chunk into `work` or `quarantine`)
    started_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    t_start: float = field(default_factory=time.perf_counter)


def prepare(args: argparse.Namespace, chunk_rows: int = CHUNK_ROWS) -> Prepared:
    """Stage 0, no Ray and no writes to the store: read and select the pairs, load the model, validate, hash the
    config. The source is read, validated and tokenised `chunk_rows` rows at a time, and each chunk's good rows go
    to the work list's file, so the driver never holds the selection as Python objects (bench/driver_setup.py).
    Arrow allocates from the system allocator meanwhile (system_memory_pool)."""
    with system_memory_pool():
        return _prepare(args, chunk_rows)


def _prepare(args: argparse.Namespace, chunk_rows: int) -> Prepared:
    t_start = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if args.max_retries < 0:
        raise InputError(f"--max-retries must be >= 0, got {args.max_retries}")
    stream = stream_pairs(
        args.dataset, split=args.split, config=args.config, qqp=args.qqp_path,
        text_a=args.text_a_column, text_b=args.text_b_column, label=args.label_column, ids=args.id_column,
        label_range=_label_range(args.label_range), sample=args.sample, seed=args.seed, limit=args.limit,
        keep=args.keep_columns, chunk_rows=chunk_rows,
    )  # fmt: skip
    pairs = stream.pairs
    engine_truncation = "error" if args.truncation == "error" else "warn"
    explainer = Explainer(
        args.model, layer=args.layer, mode=args.mode, similarity=args.similarity, rule=args.rule,
        steps=args.steps, tolerance=args.tolerance, max_steps=args.max_steps, truncation=engine_truncation,
        precision=args.precision,
    )  # fmt: skip
    max_tokens = explainer.split.max_seq_length

    config = run_config(args, explainer, weights_fingerprint(explainer.model), pairs)
    rid = run_id(config)
    # A rerun tokenises only the pairs not in the store yet (404k QQP: ~1M texts, twice, otherwise). Read-only.
    peek = open_store(args.out, rid, retry_s=args.store_retry_s)
    peek.check()  # an unreachable or missing bucket says so here, as it would when the run opens
    stored = peek.done_pair_keys()
    seen, work, rejected = SeenIds(), WorkList(), []
    n_in = n_long = 0
    first_long = None
    try:
        for rows in stream.chunks:
            n_in += len(rows)
            good, quarantine = validate(
                rows, pairs.label_kind, pairs.label_range, None, max_tokens, args.truncation == "quarantine",
                count_both=explainer.split.token_counts, stored=stored, seen=seen,
            )  # fmt: skip
            del rows
            if args.truncation == "error":
                long = good.pair_id[(good.n_tokens_a > max_tokens) | (good.n_tokens_b > max_tokens)]
                n_long += len(long)
                first_long = first_long if first_long is not None or not len(long) else long.iat[0]
            if len(quarantine):
                rejected.append(quarantine)
            if len(good):
                work.append(with_sentence_ids(compact(good)))
            del good, quarantine
        if n_long:
            raise InputError(
                f"{n_long} pairs have a text over max_seq_length={max_tokens} (first: pair {first_long}); "
                "use --truncation quarantine or warn"
            )
        work.finish()
    except BaseException:
        work.discard()
        raise
    quarantine = (pd.concat(rejected, ignore_index=True) if rejected
                  else quarantine_frame([], [], [], [], [], [], []))  # fmt: skip
    release_memory()
    return Prepared(args, pairs, explainer, work, quarantine, config, rid, n_in=n_in, started_at=started_at,
                    t_start=t_start)  # fmt: skip


def compact(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its string columns (ids, texts, pass-through columns) in Arrow buffers instead of one
    Python object per value: the form in which each chunk's good rows go to the work list (404k QQP-like pairs in
    all: 132 -> 70 MB)."""
    return frame.astype({c: pd.ArrowDtype(pa.string()) for c in frame.columns if frame[c].dtype == object})


@contextlib.contextmanager
def system_memory_pool() -> Iterator[None]:
    """Arrow's allocations inside the block from the system allocator (glibc's malloc) instead of pyarrow's default
    (mimalloc), unless $ARROW_DEFAULT_MEMORY_POOL chooses; the pool before is restored after it. For prepare(): read
    chunk by chunk, mimalloc keeps much of what each chunk freed even after release_unused() (404k pairs: 59 MB
    kept, 14 with the system pool), while glibc's free pages go back through malloc_trim (release_memory). For
    prepare(), the work list's plan and each wave's tables and commit; the rest of the waves keeps mimalloc: with the
    system pool throughout, the driver's floor after a wave was ~30 MB higher (10k pairs: 511 against 481 MB;
    bench/results/scale.md)."""
    before = pa.default_memory_pool()
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ and before.backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, loaded once; None where there is none (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_memory() -> None:
    """Hand freed memory back to the OS: Arrow's pool and glibc's heap keep what a large step freed (reading and
    tokenising the selection: 116 MB at 404k pairs), which would otherwise count as the driver's for the run."""
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(AttributeError):
        if (libc := _glibc()) is not None:
            libc.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


def malloc_in_use() -> int | None:
    """Bytes glibc's malloc has handed out and not got back (mallinfo2: uordblks + hblkhd), None without glibc 2.33+:
    the driver's live native heap (numpy, Ray's core worker, tokenizers; not Python's small objects, which live in
    pymalloc's arenas, nor Arrow's default pool)."""
    fn = getattr(_glibc(), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _MallInfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


def driver_memory_mb() -> dict[str, float]:
    """This process's resident memory in MB: rss_mb (all of it), and on Linux private_mb (RssAnon: its own heap,
    without the object-store pages it maps, which Ray's store owns) and malloc_mb (malloc_in_use: of the heap, what
    is live rather than kept by the allocators)."""
    out: dict[str, float] = {}
    with contextlib.suppress(ImportError):  # psutil comes with Ray; a machine without Ray may lack it
        import psutil

        out["driver_rss_mb"] = psutil.Process().memory_info().rss / 2**20
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                out["driver_private_mb"] = int(line.split()[1]) / 1024
    if (live := malloc_in_use()) is not None:
        out["driver_malloc_mb"] = live / 2**20
    return out


@dataclass
class Progress:
    """What stage 1-2 did in this invocation (one entry per wave)."""

    wrote: list[Path] = field(default_factory=list)
    waves: list[dict[str, Any]] = field(default_factory=list)
    failures: list[pd.DataFrame] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=dict)
    ray: dict[str, Any] = field(default_factory=dict)


def compute(store: RunStore, prep: Prepared, on_wave: Callable[[str], None] | None = print) -> Progress:
    """Stages 1-2 for the selection's pairs not in the store yet, wave by wave, each wave one commit.

    Ray is started (or joined) only when there is something to compute; with --executor local, stages 1-2 run in
    this process instead (jobs/_local.py: the same batches, the same FactorActor and PairCells, the same commits)."""
    args = prep.args
    progress = Progress()
    work = prep.work
    todo = ~np.isin(work.pair_keys, store.done_pair_keys())
    known_q = store.quarantine_keys()
    quarantine = prep.quarantine
    new_q = quarantine[
        [(int(r), p, q) not in known_q for r, p, q in zip(quarantine.row, quarantine.pair_id, quarantine.reason)]
    ]
    if len(new_q):
        progress.wrote += store.commit(store.next_seq(), {"quarantine": _quarantine_table(new_q)})
    if not todo.any():
        return progress
    store.check_writable()  # a read-only store says so before anything is computed
    if args.executor == "local":  # stages 1-2 in this process, without Ray (jobs/_local.py)
        from . import _local

        ray, res, crashes, placement = None, _local.resources(args), (), None
        writer = _local.cell_writer(args.cell_writer)
    else:
        ray = init_ray(args.ray_address)
        quiet_ray(ray, progress_bars=not args.quiet and sys.stderr.isatty())
        res = resources(args, ray)
        progress.ray = ray_identity(ray)
        placement = Placement(args.cell_writer, store, ray)  # decided again before each wave (jobs/placement.py)
        try:
            writer = placement.writer(0)
        except BaseException:
            placement.close()
            raise
        crashes = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError)
    wave_size = args.wave_size or (DEFAULT_WAVE_SIZE_GPU if res["gpus_per_actor"] > 0 else DEFAULT_WAVE_SIZE_CPU)
    res.update(wave_size=wave_size, max_retries=args.max_retries)
    progress.resources = res
    res.update(cell_writer=writer)
    known_sentences = SentenceKeys(store.column("sentences", "sentence_id"))
    with system_memory_pool():  # the plan rewrites the work list: what it frees goes back to the OS
        n_waves = work.plan(todo, wave_size)  # the driver holds one wave of the work list at a time
    del todo

    def waves() -> Iterator[pd.DataFrame]:
        for w in range(n_waves):
            yield work.wave(w)

    if ray is None:
        stream: Any = _local.FactorStream(waves(), args, prep.explainer, res)
        cells_of = _local.compute_cells
    else:
        try:
            stream = FactorStream(ray, waves(), args, prep.explainer, res)
        except BaseException:
            placement.close()
            raise
        cells_of = functools.partial(compute_cells, ray)
    try:
        for w, wave in enumerate(waves()):
            seq = store.next_seq()
            if placement is not None and w:
                writer = res["cell_writer"] = placement.writer(w)  # nodes that joined since are asked first
            sink = (placement.sink() if placement else store.sink()) if writer == "workers" else None
            try:
                refs, meta, timings = stream.wave(w)
            except crashes as exc:
                raise JobFailedError(
                    f"wave {w + 1}/{n_waves} failed: a batch killed its worker {args.max_retries + 1} times "
                    f"(--max-retries {args.max_retries}; {type(exc).__name__}: {str(exc).splitlines()[0]}). "
                    f"{w} earlier wave(s) of this run are committed, nothing of wave {w + 1} was written; "
                    "the same command resumes the run"
                ) from exc
            out, cell_timings = cells_of(wave, refs, args, prep.explainer, res, sink=sink, seq=seq)
            del refs  # the wave's factors leave the object store
            factor_bytes = 4 * int(pc.sum(pc.multiply(meta.column("dim"), meta.column("n_tokens"))).as_py() or 0)
            timings.update(cell_timings,
                           attribution_s=float(pc.sum(meta.column("compute_s")).as_py() or 0.0),  # actor-seconds
                           sentences=stream.sizes[w], factor_bytes=factor_bytes,
                           factor_bytes_per_sentence=factor_bytes / max(1, stream.sizes[w]))  # fmt: skip
            # The wave's tables and their Parquet encoding are the driver's largest step (the sentences table with
            # its embeddings, ~3.6 KB per sentence; writing 106 MB of it took +145 MB more with mimalloc, +52 with the
            # system allocator, bench/driver_peaks.py parquet-write): from the system allocator, they go back to the OS
            # after the commit (release_memory).
            with system_memory_pool():
                tables, failed = wave_tables(wave, meta, out, prep.pairs.source.split, known_sentences)
                if len(failed):
                    progress.failures.append(failed)
                    tables["quarantine"] = _quarantine_table(
                        failed[[(int(r), p, why) not in known_q
                                for r, p, why in zip(failed.row, failed.pair_id, failed.reason)]]  # fmt: skip
                    )
                t_commit = time.perf_counter()
                parts = written_parts(out)
                if writer == "workers":
                    store.settle(seq, parts)  # every reported part there, no stray part of this wave
                    progress.wrote += [f"{t}/{name}" for t in sorted(parts) for name in sorted(parts[t])]
                progress.wrote += store.commit(seq, tables)
            timings["commit_s"] = time.perf_counter() - t_commit
            known_sentences.add(tables["sentences"].column("sentence_id"))
            timings.update(wave=w, pairs=tables["pairs"].num_rows,
                           cells=int(pc.sum(tables["pairs"].column("n_cells")).as_py() or 0))  # fmt: skip
            progress.waves.append(timings)
            if on_wave is not None:
                on_wave(
                    f"wave {w + 1}/{n_waves}: {timings['pairs']} pairs, {timings['sentences']} sentences, "
                    f"factors {timings['factors_s']:.1f}s, cells {timings['cells_s']:.1f}s"
                )
            # What the wave's tables took from the heap goes back to the OS; what the driver keeps after that is
            # recorded per wave (a run's memory should not grow with its waves: bench/results/scale.md).
            del meta, out, tables, wave
            release_memory()
            timings.update(driver_memory_mb())
            if os.environ.get("XSBERT_TEST_HOLD_AFTER_WAVE") == str(w + 1):  # test hook: a driver to kill between waves
                time.sleep(600)
    finally:
        stream.close()
        if placement is not None:
            placement.close()
    return progress


class SpillFile:
    """An Arrow IPC file written table by table, then mapped read-only: its record batches are zero-copy views of
    the mapping, so their pages are the kernel's to drop and read again. The file lives in a fresh folder under
    `directory` (default: tempfile's, i.e. $TMPDIR) that is removed as soon as the file is mapped (or discard()ed):
    the mapping keeps the pages readable, and nothing is left behind when the process stops, even when killed."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self.schema: pa.Schema | None = None
        self.batches: list[pa.RecordBatch] = []  # after finish()
        self.starts = np.zeros(1, np.int64)  # the first row of each batch, and the row count last
        self._folder: str | None = None
        self._sink: Any = None
        self._writer: Any = None
        self._mapped = False

    def write(self, table: pa.Table) -> None:
        import tempfile

        if self._mapped:
            raise RuntimeError("the spill file is mapped already: nothing more can be written")
        if self._writer is None:
            self._folder = tempfile.mkdtemp(prefix="xsbert-worklist-", dir=self.directory)
            self._sink = pa.OSFile(os.path.join(self._folder, "pairs.arrow"), "wb")
            self.schema = table.schema
            self._writer = pa.ipc.new_file(self._sink, self.schema)
        self._writer.write_table(table.cast(self.schema))

    def finish(self) -> None:
        """Close, map and unlink (nothing written: nothing to map)."""
        if self._writer is None or self._mapped:
            return
        try:
            self._writer.close()
            self._sink.close()
            reader = pa.ipc.open_file(pa.memory_map(os.path.join(self._folder, "pairs.arrow"), "r"))  # type: ignore[arg-type]
            self.batches = [reader.get_batch(k) for k in range(reader.num_record_batches)]
            self.starts = np.cumsum([0] + [b.num_rows for b in self.batches])
            self._mapped = True
        finally:
            self.discard()

    def discard(self) -> None:
        """Close and remove the folder (finish() does, once mapped; after an error, the caller)."""
        import shutil

        with contextlib.suppress(Exception):
            if self._writer is not None and not self._mapped:
                self._writer.close()
                self._sink.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def take(self, rows: np.ndarray) -> pa.Table:
        """The rows at positions `rows`, in that order: taken batch by batch (a take over the whole file at once
        would first join its batches, i.e. read all of it into memory)."""
        by_row = np.argsort(rows, kind="stable")
        sorted_rows = rows[by_row]
        batch = np.searchsorted(self.starts, sorted_rows, side="right") - 1
        bounds = np.flatnonzero(np.diff(batch)) + 1
        pieces = [self.batches[batch[lo]].take(pa.array(sorted_rows[lo:hi] - self.starts[batch[lo]]))
                  for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(rows)]) if hi > lo]  # fmt: skip
        return pa.Table.from_batches(pieces, schema=self.schema).take(pa.array(np.argsort(by_row)))

    def rows(self, start: int, stop: int) -> pa.Table:
        """Rows [start, stop) as zero-copy slices of the mapping."""
        parts = []
        for k, b in enumerate(self.batches):
            lo, hi = max(start, int(self.starts[k])), min(stop, int(self.starts[k + 1]))
            if hi > lo:
                parts.append(b.slice(lo - int(self.starts[k]), hi - lo))
        return pa.Table.from_batches(parts, schema=self.schema)


class WorkList:
    """The pairs a run attributes, spilled chunk by chunk as prepare() validates them, with 8-byte keys per pair
    (of its id) and per text (its sentence id): the driver holds one chunk or one wave of the pairs at a time, not
    the run's (404k QQP-like pairs: ~85 MB in Arrow buffers, ~0.85 GB at 4M). The keys (24 bytes per pair) are in
    memory while prepare() appends, then memory-mapped (mapped_keys); the texts' keys go once plan() has used them.

    append() each chunk (rows of compact()'s form with sentence ids: with_sentence_ids) to a SpillFile in input
    order; finish() maps it. plan() picks the pairs to compute, orders them (wave_order) and copies them wave by
    wave into a second SpillFile in that order, dropping the first: wave(w) is then one contiguous stretch of the
    mapping, as few pages as the wave's rows fill. plan() is called once."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self.num_rows = 0
        self.wave_size = 1
        self.n_planned = 0
        self._chunks = SpillFile(directory)  # input order, until plan()
        self._waves: SpillFile | None = None  # plan order
        self._keys: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pair_keys = self.keys_a = self.keys_b = np.zeros(0, np.uint64)

    def append(self, frame: pd.DataFrame) -> None:
        """Rows to attribute, after those appended before."""
        table = pa.Table.from_pandas(frame, preserve_index=False)
        self._chunks.write(table)
        self._keys.append((pair_keys(table.column("pair_id")), SentenceKeys._keys(table.column("sentence_id_a")),
                           SentenceKeys._keys(table.column("sentence_id_b"))))  # fmt: skip
        self.num_rows += table.num_rows

    def finish(self) -> WorkList:
        """Map the file; no more rows."""
        self._chunks.finish()
        if self._keys:
            self.pair_keys, self.keys_a, self.keys_b = (mapped_keys(k, self.directory) for k in zip(*self._keys))
            self._keys = []
        return self

    def discard(self) -> None:
        self._chunks.discard()
        if self._waves is not None:
            self._waves.discard()

    def plan(self, todo: np.ndarray | None, wave_size: int) -> int:
        """Compute the rows where `todo` (one bool per row; None: all) in wave_order, `wave_size` rows per wave;
        returns the number of waves. Components are found on the texts' sentence ids (64-bit keys)."""
        if wave_size < 1:
            raise ValueError(f"wave_size must be >= 1, got {wave_size}")
        if self._waves is not None:
            raise RuntimeError("the work list is planned already")
        self.finish()
        rows = np.arange(self.num_rows) if todo is None else np.flatnonzero(todo)
        m = len(rows)
        nodes, codes = np.unique(np.concatenate([self.keys_a[rows], self.keys_b[rows]]), return_inverse=True)
        order = rows[wave_order_codes(codes[:m], codes[m:], len(nodes))]
        del rows, nodes, codes
        self._waves = SpillFile(self.directory)
        try:
            for start in range(0, m, wave_size):
                self._waves.write(self._chunks.take(order[start : start + wave_size]))
            self._waves.finish()
        except BaseException:
            self._waves.discard()
            raise
        self._chunks = SpillFile(self.directory)  # the input-order mapping goes with its last reference
        self.keys_a = self.keys_b = np.zeros(0, np.uint64)  # the plan's alone
        self.wave_size, self.n_planned = wave_size, m
        return self.n_waves

    @property
    def n_waves(self) -> int:
        return math.ceil(self.n_planned / self.wave_size)

    def wave(self, w: int) -> pd.DataFrame:
        """The rows of wave w (plan()'s order) as a frame like compact()'s: strings in Arrow buffers, numbers in
        numpy, a fresh RangeIndex."""
        if not 0 <= w < self.n_waves or self._waves is None:
            raise IndexError(f"wave {w} of {self.n_waves}")
        part = self._waves.rows(w * self.wave_size, (w + 1) * self.wave_size)
        return part.to_pandas(types_mapper=_arrow_strings, self_destruct=False).reset_index(drop=True)


def _arrow_strings(type_: pa.DataType) -> pd.ArrowDtype | None:
    return pd.ArrowDtype(type_) if pa.types.is_string(type_) or pa.types.is_large_string(type_) else None


def wave_order(text_a: np.ndarray, text_b: np.ndarray) -> np.ndarray:
    """The order in which pairs are cut into waves: grouped by connected component of the graph whose nodes are
    the sentences and whose edges are the pairs (components in the order of their first pair, pairs in input
    order within one). A wave computes the factors of every sentence its pairs use and keeps none for the next
    wave, so a sentence whose pairs fall in two waves is integrated twice; grouped, only a component larger
    than what is left of a wave is split. (QQP-like pairs, 100k, waves of 16,384: 186,966 sentences integrated in
    input order, 133,055 grouped, 133,044 unique; bench/results/scale.md.)"""
    n = len(text_a)
    codes, uniques = pd.factorize(np.concatenate([text_a, text_b]))
    return wave_order_codes(codes[:n], codes[n:], len(uniques))


def wave_order_codes(a: np.ndarray, b: np.ndarray, n_nodes: int) -> np.ndarray:
    """wave_order on the pairs' sentences as integer codes in [0, n_nodes) (the same order for any coding)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(a)
    if n == 0:
        return np.arange(0)
    graph = coo_matrix((np.ones(n, np.int8), (a, b)), shape=(n_nodes, n_nodes))
    n_comp, label = connected_components(graph, directed=False)
    comp = label[a]
    first = np.full(n_comp, n, dtype=np.int64)
    np.minimum.at(first, comp, np.arange(n))
    return np.lexsort((np.arange(n), first[comp]))


def summarize(store: RunStore, prep: Prepared, progress: Progress) -> dict[str, Any]:
    """The selection's state in the store, whatever invocation computed it; counts in = done + quarantined."""
    quarantine, failures, stats = prep.quarantine, progress.failures, progress.waves
    stored = store.read_table("pairs", ["pair_id", "completeness_error"])
    abs_err = pd.Series([], dtype=np.float64)
    if stored is not None:  # the store's pairs of this selection, on their id keys (no Python string per pair)
        mine = np.isin(pair_keys(stored.column("pair_id")), prep.work.pair_keys)
        abs_err = pd.Series(stored.column("completeness_error").to_numpy(zero_copy_only=False)[mine]).abs()
    computed_pairs = sum(s["pairs"] for s in stats)
    computed_sentences = sum(s["sentences"] for s in stats)
    wall = time.perf_counter() - prep.t_start
    s = prep.explainer.settings
    summary: dict[str, Any] = dict(
        run_id=prep.run_id,
        run_dir=str(store.path),
        n_in=prep.n_in,
        n_done=len(abs_err),
        n_quarantined=len(quarantine) + sum(len(f) for f in failures),
        quarantine_reasons=pd.concat([quarantine.reason, *(f.reason for f in failures)]).value_counts()
        .sort_index().to_dict(),
        computed_pairs=computed_pairs,
        computed_sentences=computed_sentences,
        waves=len(stats),
        wall_s=wall,
        compute_s=sum(s["factors_s"] + s["factor_meta_s"] + s["cells_s"] for s in stats),
        pairs_per_s=computed_pairs / wall if computed_pairs else 0.0,
        sentences_per_s=computed_sentences / wall if computed_sentences else 0.0,
        mean_abs_completeness_error=float(abs_err.mean()) if len(abs_err) else None,
        max_abs_completeness_error=float(abs_err.max()) if len(abs_err) else None,
        wrote_files=len(progress.wrote),
        duplicates_dropped=sum(s["duplicates_dropped"] for s in stats),
        ray=progress.ray,
        settings={k: s[k] for k in ("layer", "rule", "steps", "tolerance", "max_steps", "mode", "precision")},
    )
    summary["advice"] = completeness_advice(summary)
    if summary["n_in"] != summary["n_done"] + summary["n_quarantined"]:
        raise RuntimeError(f"count mismatch: in {summary['n_in']} != done {summary['n_done']} + "
                           f"quarantined {summary['n_quarantined']}")  # fmt: skip
    return summary


def update_manifest(store: RunStore, prep: Prepared, progress: Progress, summary: dict[str, Any]) -> None:
    """Record this invocation in manifest.json when it wrote anything, when the run has no manifest yet, or when the
    manifest's tables disagree with the store's (a manifest write that failed after a commit: the rerun fixes it)."""
    old = store.read_manifest()
    parts = {t: len(store.parts(t)) for t in TABLES}
    recorded = {t: v.get("parts") for t, v in (old or {}).get("tables", {}).items()}
    if not progress.wrote and old is not None and recorded == parts:  # parts are never rewritten: equal counts, equal
        return
    tables = {t: {"path": f"{t}/*.parquet", "parts": parts[t], "rows": n} for t, n in store.counts().items()}
    args = prep.args
    manifest = old or {"run_id": prep.run_id, "created_at": prep.started_at, "runs": []}
    manifest.update(
        run_id=prep.run_id,
        store_version=STORE_VERSION,
        schema="docs/STORE.md",
        cells=args.cells,  # which cells the run stores (also config.cells when not all)
        config=prep.config,
        settings=prep.explainer.settings,
        updated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        tables=tables,
    )
    manifest["runs"].append(
        {
            "started_at": prep.started_at,
            "selection": {"dataset": args.dataset, "split": prep.pairs.source.split, "limit": args.limit,
                          "sample": args.sample, "seed": args.seed, "n_source_rows": prep.pairs.n_source_rows},
            "counts": {k: summary[k] for k in ("n_in", "n_done", "n_quarantined", "computed_pairs",
                                               "computed_sentences")},
            "quarantine_reasons": summary["quarantine_reasons"],
            "resources": progress.resources,
            "ray": progress.ray,
            "waves": progress.waves,
            "duplicates_dropped": summary["duplicates_dropped"],
            "wall_s": summary["wall_s"],
            "mean_abs_completeness_error": summary["mean_abs_completeness_error"],
            "max_abs_completeness_error": summary["max_abs_completeness_error"],
        }
    )  # fmt: skip
    store.write_manifest(manifest)


def attribute(prep: Prepared, on_wave: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Stages 1-2 into the store, then the summary; a rerun of the same selection computes and writes nothing."""
    with open_store(prep.args.out, prep.run_id, prep.pairs.columns.keep, retry_s=prep.args.store_retry_s) as store:
        progress = compute(store, prep, on_wave)
        progress.wrote += store.commit_missing_tables()
        summary = summarize(store, prep, progress)
        update_manifest(store, prep, progress, summary)
    return summary


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the job (prepare -> attribute); returns the summary (also printed)."""
    summary = attribute(prepare(args), on_wave=lambda line: print(line, flush=True))
    print_summary(summary, summary["run_dir"])
    return summary


# Mean |completeness error| above which a run's end warns (similarity units: 1e-2 is 1% of cosine's range).
COMPLETENESS_WARN = 1e-2


def completeness_advice(summary: dict[str, Any]) -> str | None:
    """A hint when the run's mean |completeness error| is large for its quadrature, else None.

    Riemann's error falls like 1/N, Gauss-Legendre's much faster; --tolerance picks N per sentence."""
    err = summary.get("mean_abs_completeness_error")
    if err is None or err <= COMPLETENESS_WARN:
        return None
    s = summary["settings"]
    if s.get("tolerance") is not None:
        fix = f"--max-steps {2 * int(s['max_steps'])} (adaptive N stopped at the cap) or a smaller --tolerance"
    elif s["rule"] == "riemann":
        target = 2 ** math.ceil(math.log2(max(2.0, s["steps"] * err / (COMPLETENESS_WARN / 2))))
        fix = f"--steps {target} (riemann's error falls like 1/N), --rule gauss-legendre --steps {max(16, s['steps'])}"
        fix += ", or --tolerance 1e-3"
    else:
        fix = f"--steps {4 * s['steps']} or --tolerance 1e-3 (adaptive N per sentence)"
    return (f"mean |completeness error| {err:.2e} is large for {s['rule']} N={s['steps']} at layer {s['layer']} "
            f"(> {COMPLETENESS_WARN:g}): the cells do not sum to what they should; rerun with {fix}")


def print_summary(s: dict[str, Any], run_dir: str | Path) -> None:
    err = (
        f"mean {s['mean_abs_completeness_error']:.2e}, max {s['max_abs_completeness_error']:.2e}"
        if s["mean_abs_completeness_error"] is not None
        else "n/a"
    )
    reasons = ", ".join(f"{k} {v}" for k, v in s["quarantine_reasons"].items()) or "none"
    lines = [
        "",
        f"run {s['run_id']}: {s['n_in']} pairs in = {s['n_done']} done + {s['n_quarantined']} quarantined",
        f"  computed now        {s['computed_pairs']} pairs, {s['computed_sentences']} unique sentences, "
        f"{s['waves']} wave(s)",
        f"  throughput          {s['pairs_per_s']:.2f} pairs/s, {s['sentences_per_s']:.2f} sentences/s (wall)",
        f"  quarantined         {reasons}",
        f"  |completeness err|  {err}",
        f"  wall time           {s['wall_s']:.1f} s",
        *([f"  duplicate rows      {s['duplicates_dropped']} dropped (retried stage-2 batches; copies were equal)"]
          if s["duplicates_dropped"] else []),
        *([f"  ray                 job {s['ray']['job_id']} on {s['ray']['gcs_address']}"] if s["ray"] else []),
        "try:",
        f"  xsbert sql --run {run_dir} \"select pair_id, label, round(score, 3) as score, "
        "round(attribution_sum, 3) as sum_a, completeness_error from pairs order by score desc limit 5\"",
        f"store: {run_dir}",
    ]
    print("\n".join(lines), flush=True)
    if s.get("advice"):
        print(f"warning: {s['advice']}", file=sys.stderr, flush=True)


def quiet_console() -> None:
    """For the command line: no download/loading bars of transformers off a TTY, Ray's C++ restart notice dropped
    (jobs/_ray.py says why it is harmless)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not sys.stderr.isatty():
        import transformers

        transformers.utils.logging.disable_progress_bar()
    filter_stderr()


def cli(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_console()
    try:
        main(args)
    except XsbertError as exc:
        print(f"jobs.attribute: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
