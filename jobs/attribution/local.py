"""Stages 1-2 of jobs.attribute in the driver's own process, without Ray (`--executor local`).

For a machine where Ray is not installed (a GPU box with torch and sentence-transformers, say): the job's own code
with Ray's two parts replaced, nothing else.

    stage 1   stage1.factor_blocks -> FactorActor (one, in this process, on --device)   [Ray: an actor pool]
    stage 2   PairCells over PAIR_BATCH pairs at a time (actors.pair_rows)            [Ray: pair_cells tasks]

The waves, their order, the factor batches, the stage-2 batches, the tables and the commits are jobs.attribute's, so
the store (run id, tables, part names) is the one a one-node Ray run of the same settings writes, and either
executor resumes a run the other began. `import ray` is never executed on this path (nor duckdb, nor psutil).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import pandas as pd
import pyarrow as pa

from xsbert_core import EngineSettings

from ..config import DEFAULT_BATCH_SIZE_CPU, DEFAULT_BATCH_SIZE_GPU, Execution, JobSettings
from ..store import RunStore
from .actors import FactorActor, PairCells, pair_rows
from .executor import Executor
from .hooks import Hooks
from .stage1 import actor_args, factor_blocks
from .stage2 import PAIR_BATCH, CellSettings, exactly_once, pair_input


def resources(ex: Execution) -> dict[str, Any]:
    """What the local run uses (recorded in the manifest as a Ray run's resources are): one factor model on
    --device (default: cuda when torch sees a GPU, else cpu), torch threads from --cpus-per-actor (default: torch's
    own), batches as a Ray run on that device."""
    import torch

    device = ex.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.startswith("cuda")
    threads = max(1, int(ex.cpus_per_actor)) if ex.cpus_per_actor else torch.get_num_threads()
    return {
        "executor": "local",
        "cluster_cpus": float(os.cpu_count() or 1),
        "cluster_gpus": float(torch.cuda.device_count()) if gpu else 0.0,
        "num_actors": 1,
        "gpus_per_actor": 1.0 if gpu else 0.0,
        "cpus_per_actor": float(threads),
        "device": device,
        "threads": threads,
        "batch_size": ex.batch_size or (DEFAULT_BATCH_SIZE_GPU if gpu else DEFAULT_BATCH_SIZE_CPU),
        "factor_memory": ex.factor_memory_bytes(),
    }


class LocalExecutor(Executor):
    """Stages 1-2 in this process. Cells: 'workers' (auto): each stage-2 batch writes its cells and word cells as its
    own parts, as a one-node Ray run's tasks do (a batch's cells, not the wave's, in memory at a time); 'driver':
    the wave's, in one part. The hooks that would kill this process (the driver) are left out."""

    ray: dict[str, Any] = {}

    def __init__(self, job: JobSettings, store: RunStore, engine: EngineSettings, hooks: Hooks) -> None:
        self.store, self.engine, self.hooks = store, engine, hooks.in_driver()
        self.resources = resources(job.execution)
        self.writer = "driver" if job.execution.cell_writer == "driver" else "workers"
        self.cells = CellSettings(engine.similarity, job.attribution.min_abs, job.attribution.cells, hooks=self.hooks)

    def stream_factors(self, waves: Iterable[pd.DataFrame]) -> FactorStream:
        return FactorStream(waves, self.engine, self.resources, self.hooks)

    def sink(self, w: int) -> Any | None:
        self.resources["cell_writer"] = self.writer
        return self.store.sink() if self.writer == "workers" else None

    def compute_cells(self, wave: pd.DataFrame, factors: list[Any], sink: Any | None,
                      seq: int) -> tuple[pa.Table, dict[str, Any]]:  # fmt: skip
        return compute_cells(wave, factors, self.cells, sink, seq)


class FactorStream:
    """Stage 1, wave after wave, in this process: jobs.attribution.stage1.FactorStream's interface (`wave(w)`, `sizes`,
    `close()`), with the factor tables themselves where Ray's stream gives object refs. The model is loaded once,
    when the first wave is asked for. Each factor batch is one FactorActor call, as each is one actor call in a
    Ray run, so the factors are the same batch for batch."""

    def __init__(self, waves: Iterable[pd.DataFrame], engine: EngineSettings, res: dict[str, Any],
                 hooks: Hooks) -> None:  # fmt: skip
        self.engine, self.res, self.hooks = engine, res, hooks
        self._batches = factor_blocks(waves, res["batch_size"])
        self.sizes: list[int] = []
        self._actor: FactorActor | None = None

    def _model(self) -> FactorActor:
        if self._actor is None:
            self._actor = FactorActor(**actor_args(self.engine, self.res, self.hooks))
        return self._actor

    def wave(self, w: int) -> tuple[list[pa.Table], pa.Table | None, dict[str, float]]:
        """(wave w's factor tables, their metadata: every column but the factor bytes, timings). Waves are asked
        for in order, each once."""
        if w != len(self.sizes):
            raise RuntimeError(f"wave {w + 1} asked for after wave {len(self.sizes)}: waves go in order")
        t0 = time.perf_counter()
        got = next(self._batches, None)
        if got is None:
            raise RuntimeError(f"stage 1 has no wave {w + 1}")
        blocks, size = got
        self.sizes.append(size)
        model = self._model()
        tables = [model(block) for block in blocks]
        t1 = time.perf_counter()
        meta = pa.concat_tables([t.drop_columns(["factor"]) for t in tables]) if tables else None
        return tables, meta, {"factors_s": t1 - t0, "factor_meta_s": time.perf_counter() - t1}

    def close(self) -> None:
        """Nothing runs between calls: nothing to stop."""


def compute_cells(wave: pd.DataFrame, factors: list[pa.Table], cells: CellSettings, sink: Any = None,
                  seq: int | None = None) -> tuple[pa.Table, dict[str, Any]]:  # fmt: skip
    """Stage 2 for the wave's pairs, in this process: jobs.attribution.stage2.compute_cells's rows (the same PAIR_BATCH
    batches through the same PairCells), each batch's cells written through `sink` as a Ray task would."""
    t0 = time.perf_counter()
    pair_in = pair_input(wave)
    pair_cells = PairCells(factors, cells.similarity, cells.min_abs, cells.cells)
    rows = [pair_rows(pair_cells, pair_in.slice(k, PAIR_BATCH), sink, seq) for k in range(0, len(wave), PAIR_BATCH)]
    out, duplicates = exactly_once(pa.concat_tables(rows))
    return out, {"cells_s": time.perf_counter() - t0, "duplicates_dropped": duplicates}
