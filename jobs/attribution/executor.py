"""Where stages 1-2 of a run happen, behind one interface: on a Ray cluster (on_ray.py: an actor pool and Ray tasks),
or in the driver's own process without Ray (local.py, `--executor local`). run.compute drives either the same way,
wave by wave:

    executor = open_executor(job, store, engine, hooks)    # run.py
    stream = executor.stream_factors(waves)          # stage 1, over every wave
    for w, wave in enumerate(waves):
        factors, meta, timings = stream.wave(w)      # wave w's sentence factors (object refs, or the tables)
        sink = executor.sink(w)                      # who writes its cells: a sink for the stage-2 batches, or None
        rows, timings = executor.compute_cells(wave, factors, sink, seq)   # stage 2
    executor.close()

`resources` is what the run uses (the manifest records it), `ray` which Ray ({} without), `crashes` the exceptions
of a batch that kept killing its worker."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Protocol

import pandas as pd
import pyarrow as pa


class FactorStream(Protocol):
    """Stage 1 over a run's waves: `wave(w)` -> (wave w's factors, their metadata: every column but the factor bytes,
    timings), waves asked for in order; `sizes`, the sentences of each wave begun; `close()`."""

    sizes: list[int]

    def wave(self, w: int) -> tuple[list[Any], pa.Table | None, dict[str, float]]: ...

    def close(self) -> None: ...


class Executor(ABC):
    """Stages 1-2 of one run: its factor stream, its stage-2 batches and who writes their cells."""

    resources: dict[str, Any]
    ray: dict[str, Any]
    crashes: tuple[type[BaseException], ...] = ()

    @abstractmethod
    def stream_factors(self, waves: Iterable[pd.DataFrame]) -> FactorStream:
        """Stage 1 over `waves` (the run's, in order)."""

    @abstractmethod
    def sink(self, w: int) -> Any | None:
        """Where the stage-2 batches of wave `w` write their cells and word cells themselves (a PartSink), or None:
        they send them back and the driver writes them with the wave. Decided anew for each wave."""

    @abstractmethod
    def compute_cells(self, wave: pd.DataFrame, factors: list[Any], sink: Any | None,
                      seq: int) -> tuple[pa.Table, dict[str, Any]]:  # fmt: skip
        """Stage 2 of a wave: (one PAIR_SCHEMA row per pair, in wave order, timings)."""

    def close(self) -> None:
        """Stop what is still running (a stream, a marker file)."""
