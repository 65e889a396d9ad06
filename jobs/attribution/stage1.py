"""Stage 1 of an attribution run: the sentence factors of every wave, from an actor pool on Ray (`FactorStream`);
the pool's resources (`resources`), the factor batches (`factor_blocks`) and the actors' arguments (`actor_args`),
which the local executor (local.py) shares."""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from xsbert_core import EngineSettings, InputError

from ..config import DEFAULT_BATCH_SIZE_CPU, DEFAULT_BATCH_SIZE_GPU, Execution
from ..raycluster import spare_cpus
from .hooks import Hooks

# Factor batches (Ray Data blocks) per stage-1 pipeline: the waves of a run are served in groups of at most this
# many (FactorStream), each by one dataset and actor pool; the driver's per-block records end with each group.
STAGE1_GROUP_BLOCKS = 2048
# Collect garbage when a group's pipeline ends (FactorStream.close; bench/driver_peaks.py floors turns it off).
STAGE1_COLLECT = True
# Ray 2.60 still takes the retries (--max-retries, jobs/config.py) as remote args, with a deprecation warning
# (RETRY_ARGS_WARNING) that the stages keep out of the log; pyproject pins ray < 2.64, which drops them.
RETRY_ARGS_WARNING = r"`ray_remote_args` is deprecated"


def ray_identity(ray) -> dict[str, Any]:
    """Which Ray this run used: its GCS address, the driver's node and Ray job id (recorded in the manifest,
    so that a run submitted with `ray job submit` can be matched with the head's job list)."""
    ctx = ray.get_runtime_context()
    return {"gcs_address": ctx.gcs_address, "node_id": ctx.get_node_id(), "job_id": ctx.get_job_id()}


def resources(ex: Execution, ray) -> dict[str, Any]:
    total = ray.cluster_resources()
    cpus, gpus = float(total.get("CPU", 1)), float(total.get("GPU", 0))
    gpus_per_actor = ex.gpus_per_actor if ex.gpus_per_actor is not None else (1.0 if gpus > 0 else 0.0)
    if gpus_per_actor == 0 and (ex.device or "").startswith("cuda"):  # Ray hides every GPU from such an actor
        raise InputError(f"--device {ex.device}: the factor actors get no GPU ("
                         + ("the cluster has none" if gpus == 0 else "--gpus-per-actor 0") + "); leave --device out")
    if gpus_per_actor > 0:
        n_actors = ex.num_actors or max(1, int(gpus // gpus_per_actor))
        cpus_per_actor = min(ex.cpus_per_actor or 1.0, max(0.25, cpus / n_actors))
    else:
        cpus_per_actor = ex.cpus_per_actor or 1.0
        n_actors = ex.num_actors or max(1, int(cpus // cpus_per_actor))
    # The actor pool lives for the whole run, so stage 2 runs beside it: the pool reserves at most all but the spare
    # CPUs and the stage-2 tasks take those. On CPU only, the actors still run `threads` torch threads each; the
    # reservation is Ray's bookkeeping (as in jobs.parse's pool).
    spare = spare_cpus(cpus)
    reserved = min(cpus_per_actor, (cpus - spare) / n_actors)
    return {
        "cluster_cpus": cpus,
        "cluster_gpus": gpus,
        "num_actors": n_actors,
        "gpus_per_actor": gpus_per_actor,
        "cpus_per_actor": reserved,
        "cells_cpus": min(1.0, max(spare, cpus - reserved * n_actors)),
        "device": ex.device or ("cuda" if gpus_per_actor > 0 else "cpu"),
        "threads": max(1, int(cpus_per_actor)),
        "batch_size": ex.batch_size or (DEFAULT_BATCH_SIZE_GPU if gpus_per_actor > 0 else DEFAULT_BATCH_SIZE_CPU),
        # CPU: one call in flight per actor, so that an idle actor takes the next batch (longest first).
        "tasks_in_flight": 2 if gpus_per_actor > 0 else 1,
        "factor_memory": ex.factor_memory_bytes(),
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


def actor_args(engine: EngineSettings, res: dict[str, Any], hooks: Hooks) -> dict[str, Any]:
    """FactorActor's arguments: the run's engine settings (resolved, those of the run id), the device, threads, batch
    size and factor memory of `res`, the hooks. Used by both executors, so that a Ray run and a local one load the
    same engine."""
    return dict(engine=engine, device=res["device"], threads=res["threads"], batch_size=res["batch_size"],
                memory_limit=res.get("factor_memory"), gpu_share=res.get("gpus_per_actor"), hooks=hooks)  # fmt: skip


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

    def __init__(self, ray, waves: Iterable[pd.DataFrame], engine: EngineSettings, res: dict[str, Any],
                 max_retries: int, hooks: Hooks) -> None:  # fmt: skip
        self.ray, self.engine, self.res, self.max_retries, self.hooks = ray, engine, res, max_retries, hooks
        self._batches = factor_blocks(waves, res["batch_size"])
        self._pending: tuple[list[pa.Table], int] | None = None  # the next group's first wave, made already
        self.sizes: list[int] = []  # sentences of each wave that has joined a group
        self._last = -1  # the current group's last wave
        self._ds: Any = None
        self._bundles: Iterator[Any] | None = None
        self._executor = None
        self._got: dict[int, list[tuple[Any, pa.Table]]] = {}
        self._count: dict[int, int] = {}

    def _next_group(self) -> None:
        """End the current group's pipeline and build the next one's: the waves that follow, as many as fit in
        STAGE1_GROUP_BLOCKS factor batches (one wave at least), into the object store wave by wave."""
        from ray.data import ActorPoolStrategy

        from .actors import FactorActor

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
        res = self.res
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=RETRY_ARGS_WARNING)
            self._ds = self.ray.data.from_arrow_refs(refs).map_batches(
                FactorActor,
                fn_constructor_kwargs=actor_args(self.engine, res, self.hooks),
                batch_size=1,  # one row, one call: each row is a batch of sentences (factor_blocks)
                batch_format="pyarrow",
                compute=ActorPoolStrategy(
                    size=max(1, min(res["num_actors"], len(refs))), max_tasks_in_flight_per_actor=res["tasks_in_flight"]
                ),
                num_cpus=res["cpus_per_actor"],
                num_gpus=res["gpus_per_actor"] or None,
                max_restarts=-1,  # over the group's waves; a batch's own retries are bounded below
                max_task_retries=self.max_retries,
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
