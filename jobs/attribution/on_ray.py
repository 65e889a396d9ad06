"""Stages 1-2 on a Ray cluster (the default executor): the run's actor pool (stage1.FactorStream), its stage-2 tasks
(stage2.compute_cells) and who writes their cells (placement.Placement), behind executor.Executor."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from typing import Any

import pandas as pd
import pyarrow as pa

from xsbert_core import EngineSettings

from ..config import JobSettings
from ..raycluster import init_ray, quiet_ray
from ..store import RunStore
from .executor import Executor, FactorStream
from .hooks import Hooks
from .placement import Placement
from .stage1 import FactorStream as RayFactorStream
from .stage1 import ray_identity, resources
from .stage2 import CellSettings, compute_cells


class RayExecutor(Executor):
    """Joins (or starts) Ray when made: the run has something to compute."""

    def __init__(self, job: JobSettings, store: RunStore, engine: EngineSettings, hooks: Hooks) -> None:
        ex = job.execution
        self.ray_module = ray = init_ray(ex.ray_address)
        quiet_ray(ray, progress_bars=not job.output.quiet and sys.stderr.isatty())
        self.engine, self.hooks, self.max_retries = engine, hooks, ex.max_retries
        self.resources = resources(ex, ray)
        self.ray = ray_identity(ray)
        self.crashes = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError)
        self.placement = Placement(ex.cell_writer, store, ray)  # decided again before each wave (placement.py)
        self._cells = functools.partial(compute_cells, ray, cells=CellSettings(
            engine.similarity, job.attribution.min_abs, job.attribution.cells, ex.max_retries, hooks))  # fmt: skip
        self._stream: RayFactorStream | None = None

    def stream_factors(self, waves: Iterable[pd.DataFrame]) -> FactorStream:
        self._stream = RayFactorStream(self.ray_module, waves, self.engine, self.resources, self.max_retries,
                                       self.hooks)  # fmt: skip
        return self._stream

    def sink(self, w: int) -> Any | None:
        """Before each wave, the nodes that joined since are asked whether they see the run folder (placement.py)."""
        writer = self.resources["cell_writer"] = self.placement.writer(w)
        return self.placement.sink() if writer == "workers" else None

    def compute_cells(self, wave: pd.DataFrame, factors: list[Any], sink: Any | None,
                      seq: int) -> tuple[pa.Table, dict[str, Any]]:  # fmt: skip
        return self._cells(wave, factors, res=self.resources, sink=sink, seq=seq)

    def close(self) -> None:
        try:
            if self._stream is not None:
                self._stream.close()
        finally:
            self.placement.close()
