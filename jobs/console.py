"""Console helpers shared by the command-line entry points (jobs.attribute, jobs.parse, jobs.pipeline, jobs.train,
jobs.evaluate)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, TextIO

from xsbert_core.console import console_logging, guard_streams

from .raycluster import filter_stderr


class WholeLines:
    """A text stream whose threads' writes reach `stream` as whole lines: each thread's text is kept until it ends a
    line (or the thread flushes), then written under one lock.

    print() writes its text and its end in two calls, so two threads printing at once (the job's error line and Ray's
    log monitor, which forwards the workers' lines to this process's stderr) could otherwise make one line of two,
    and ConsoleLines (jobs/raycluster.py) would leave the job's line out with the worker's traceback. Everything but
    write and flush is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._lock = threading.Lock()
        self._local = threading.local()

    def write(self, text: str) -> int:
        pending = getattr(self._local, "pending", "") + text
        lines, end, self._local.pending = pending.rpartition("\n")
        if end:
            self._emit(lines + end)
        return len(text)

    def flush(self) -> None:  # a progress bar's "\r..." shows when its thread flushes, as on the stream itself
        pending, self._local.pending = getattr(self._local, "pending", ""), ""
        self._emit(pending)

    def _emit(self, text: str) -> None:
        with self._lock:
            if text:
                self.stream.write(text)
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def quiet_console(quiet: bool = False) -> None:
    """For the command line: the libraries' warnings once each (console_logging); no download/loading bars of
    transformers and no "Generating train split" bar of `datasets` (a --dataset folder) off a TTY or with `quiet`;
    Ray's C++ restart notice dropped (jobs/raycluster.py says why it is harmless); stdout and stderr written in whole
    lines (WholeLines)."""
    console_logging()
    if quiet or not sys.stderr.isatty():
        import transformers

        transformers.utils.logging.disable_progress_bar()
        if "datasets" in sys.modules:
            sys.modules["datasets"].disable_progress_bars()
        else:  # read when `datasets` is imported (only a dataset from a folder or the hub needs it)
            os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    filter_stderr()
    guard_streams()  # what is printed cannot fail the command (xsbert_core/console.py); whole lines on top of it
    for name in ("stdout", "stderr"):
        if not isinstance(getattr(sys, name), WholeLines):
            setattr(sys, name, WholeLines(getattr(sys, name)))
