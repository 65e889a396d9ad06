"""Console helpers shared by the command-line entry points (jobs.attribute, jobs.parse, jobs.pipeline, jobs.train,
jobs.evaluate)."""

from __future__ import annotations

import logging
import sys

from .raycluster import filter_stderr


def quiet_console() -> None:
    """For the command line: no download/loading bars of transformers off a TTY, Ray's C++ restart notice dropped
    (jobs/raycluster.py says why it is harmless)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not sys.stderr.isatty():
        import transformers

        transformers.utils.logging.disable_progress_bar()
    filter_stderr()
