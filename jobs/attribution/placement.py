"""Who writes a wave's cells and word cells on a Ray cluster whose nodes come and go (--cell-writer).

Stage-2 tasks can write their cells as parts of the store themselves (`workers`) only where the node they run on
sees the store: object storage is seen from everywhere, a local `--out` only from nodes that mount the same
folder. An autoscaling cluster adds nodes after the job started (cluster.yaml's GPU group starts at 0 workers), so
the choice is not made once: before each wave, every node that has joined since the last wave is asked whether it
sees the run folder, by a task pinned to it (NodeAffinitySchedulingStrategy, no CPU) that reads a marker file the
driver wrote there with a random token. Then, for a local `--out`:

- `auto`: `workers` for the wave while every node seen so far has the marker, `driver` from the first wave on a
  cluster with a node that does not (the driver writes the cells it is sent back; said once, on stderr);
- `workers`: a node without the marker stops the job before that wave is computed, in one line naming the node
  (earlier waves stay committed);
- `driver`: nothing to check (the tasks send their cells back, the driver writes them).

A node can still join between the check and the wave's tasks: each stage-2 task of a local run looks for the marker
itself before writing (`NodeCheckedSink.here`) and sends its cells back to the driver where it is missing, so a
task never writes to a disk the driver does not read. The marker is removed when the job ends (a killed job's, by
the next writer's open: RunStore.recover).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Any

from ..store import MARKER_PREFIX, RunStore, StoreError, disk_failure

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 120.0  # a node's check task waits for a worker process to start there (seconds on a busy node)


class NodeCheckedSink:
    """A local run's PartSink for stage-2 tasks that first looks for the driver's marker in the run folder:
    `here()` is False on a node that does not see it (that task's cells then go back to the driver)."""

    def __init__(self, sink: Any, marker: str, token: str) -> None:
        self.sink, self.marker, self.token = sink, marker, token

    def here(self) -> bool:
        return _sees(self.marker, self.token)

    def write(self, table: str, seq: int, first: int, data: Any) -> str:
        return self.sink.write(table, seq, first, data)


def _sees(marker: str, token: str) -> bool:
    try:
        return Path(marker).read_text(encoding="utf-8").strip() == token
    except OSError:
        return False


def _check(marker: str, token: str) -> tuple[bool, str]:
    """On one node: (does it see the marker with the token, the node's host name)."""
    return _sees(marker, token), socket.gethostname()


class Placement:
    """The --cell-writer of each wave (see the module's docstring); `close()` removes the marker."""

    def __init__(self, choice: str, store: RunStore, ray: Any) -> None:
        self.choice, self.store, self.ray = choice, store, ray
        self.local = not store.location.is_remote
        self.checked: dict[str, bool] = {}  # node id -> sees the run folder
        self.blind: list[str] = []  # nodes without the marker, as "address (host)"
        self.token = secrets.token_hex(16)
        self.marker = str(Path(store.path) / f"{MARKER_PREFIX}{self.token}")
        self._written = False
        self._said = False

    def writer(self, wave: int) -> str:
        """'workers' or 'driver' for wave `wave` (0-based), after checking the nodes that joined since the last;
        StoreError where --cell-writer workers meets a node without the run folder."""
        if self.choice == "driver":
            return "driver"
        if not self.local:
            return "workers"
        self._check_new_nodes(wave)
        if not self.blind:
            return "workers"
        if self.choice == "workers":
            raise StoreError(
                f"--cell-writer workers: node {self.blind[0]} does not see --out {self.store.root} (the run folder "
                f"{self.store.path} is not on its disk); stopped before wave {wave + 1}, nothing of it written. "
                "Use object storage (s3://, gs://) or a folder every node mounts for --out, or --cell-writer auto "
                "(the driver then writes the cells)"
            )
        if not self._said:
            self._said = True
            logger.warning("node %s does not see --out %s: the driver writes the cells from wave %d on (use object "
                           "storage or a folder every node mounts for the workers to write them)",
                           self.blind[0], self.store.root, wave + 1)  # fmt: skip
        return "driver"

    def sink(self) -> Any:
        """The stage-2 tasks' sink for a `workers` wave: the store's, checked per task for a local run."""
        sink = self.store.sink()
        return NodeCheckedSink(sink, self.marker, self.token) if self.local else sink

    def close(self) -> None:
        if self._written:
            try:
                os.unlink(self.marker)
            except OSError:
                pass
            self._written = False

    def _check_new_nodes(self, wave: int) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        new = [n for n in self.ray.nodes() if n.get("Alive") and n["NodeID"] not in self.checked]
        if not new:
            return
        if not self._written:
            try:
                Path(self.marker).write_text(self.token + "\n", encoding="utf-8")
            except OSError as exc:  # a full or read-only disk: one line, and no empty marker left behind
                with contextlib.suppress(OSError):
                    os.unlink(self.marker)
                raise disk_failure(self.marker, exc) from None
            self._written = True
        task = self.ray.remote(_check)
        refs = {n["NodeID"]: task.options(num_cpus=0, max_retries=0,
                                          scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                                          ).remote(self.marker, self.token)
                for n in new}  # fmt: skip
        ready, _ = self.ray.wait(list(refs.values()), num_returns=len(refs), timeout=CHECK_TIMEOUT_S)
        done = set(ready)
        for node in new:
            ref = refs[node["NodeID"]]
            if ref not in done:  # not answered yet (a node still starting): asked again before the next wave
                self.ray.cancel(ref, force=True)
                continue
            try:
                sees, host = self.ray.get(ref)
            except self.ray.exceptions.RayError:  # the node left while being asked: asked again if it comes back
                continue
            self.checked[node["NodeID"]] = sees
            if not sees:
                self.blind.append(f"{node.get('NodeManagerAddress', '?')} ({host})")
        if wave and len(self.checked) > 1:
            logger.info("before wave %d: %d node(s) see the run folder, %d do not", wave + 1,
                        sum(self.checked.values()), len(self.blind))  # fmt: skip
