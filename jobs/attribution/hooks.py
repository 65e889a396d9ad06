"""Faults a test injects into an attribution run, as one object given to the job (`jobs.attribute.main(job,
hooks=Hooks(...))`, tests/hooked.py for a job in a subprocess). The run hands it to the places where the faults
happen, through the constructors of its actors and the arguments of its tasks (it is picklable: they run in other
processes). A run without hooks (every production run) has `Hooks()`, which does nothing.

    kill_once        a path: the first factor-actor call anywhere creates it and kills its process (once per run)
    kill_text        kill the factor actor's process on every batch holding a text that contains this (a batch that
                     kills every actor it meets); each death appends a line to kill_log
    fail_text        a NumericalError on a batch holding a text that contains this (its pairs are quarantined)
    start_log        a path: each factor actor appends a line when it starts
    kill_cells_once  a path: the first stage-2 task anywhere creates it and kills its process
    hold_after_wave  the driver sleeps after committing wave N (1-based), for a test to kill it between waves
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from xsbert_core import NumericalError

# How long a held driver sleeps (a test kills it long before).
HOLD_S = 600.0


@dataclass(frozen=True)
class Hooks:
    kill_once: str | None = None
    kill_text: str | None = None
    kill_log: str | None = None
    fail_text: str | None = None
    start_log: str | None = None
    kill_cells_once: str | None = None
    hold_after_wave: int | None = None

    def in_driver(self) -> Hooks:
        """The hooks that may run in the driver's own process (--executor local): not the ones that kill it."""
        return replace(self, kill_once=None, kill_text=None, kill_log=None, kill_cells_once=None)

    # ------------------------------------------------------------------ in a factor actor
    def actor_started(self) -> None:
        if self.start_log:
            with open(self.start_log, "a", encoding="utf-8") as fh:
                fh.write(f"started pid {os.getpid()}\n")

    def before_factors(self, texts: list[str]) -> None:
        """At the start of a factor-actor call on `texts`: kill_once, kill_text, fail_text."""
        die_once(self.kill_once)
        if self.kill_text and any(self.kill_text in t for t in texts):
            if self.kill_log:
                with open(self.kill_log, "a", encoding="utf-8") as fh:
                    fh.write(f"killed pid {os.getpid()}\n")
            os._exit(1)

    def engine_call(self, texts: list[str]) -> None:
        """Before the engine computes `texts` (a batch, or one sentence of a batch retried alone): fail_text."""
        if self.fail_text and any(self.fail_text in t for t in texts):
            raise NumericalError(f"NaN/Inf in attributions of {[t[:40] for t in texts if self.fail_text in t]} "
                                 "(test hook)")  # fmt: skip

    # ------------------------------------------------------------------ in a stage-2 task, in the driver
    def cells_task(self) -> None:
        die_once(self.kill_cells_once)

    def wave_committed(self, wave: int) -> None:
        """After the driver committed wave `wave` (0-based): hold_after_wave."""
        if self.hold_after_wave == wave + 1:
            time.sleep(HOLD_S)


def die_once(marker: str | None) -> None:
    """The first call anywhere creates `marker` and kills its process; later calls do nothing."""
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"killed pid {os.getpid()}\n".encode())
    os.close(fd)
    os._exit(1)
