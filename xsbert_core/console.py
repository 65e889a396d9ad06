"""The commands' standard streams: what they print survives a terminal that cannot show a character, a reader that
went away (`| head -1`), a stdout that is closed (`>&-`) or fails (a full disk), and every command's logging."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO


class GuardedStream:
    """A text stream (stdout or stderr) that never raises into the command:

    - a character the stream's encoding lacks (PYTHONIOENCODING=ascii, a C locale's pipe) is written as an escape
      (`\\xe9`), not a UnicodeEncodeError after the work is done;
    - a reader that went away (BrokenPipeError) or a stream closed under the command makes the rest of the output go
      nowhere, silently: a job piped into `head -1` goes on to its end instead of stopping in a traceback mid-run;
    - any other failed write (a stdout on a full disk) is kept in `failed`, the rest of the output dropped, and the
      command's way out (xsbert_core.errors.exit_status) says it in one line, exit 2.

    The stream's file descriptor is pointed at os.devnull once it failed, so that the interpreter's last flush of the
    original stream at exit does not print "Exception ignored ..." either."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.failed: OSError | None = None
        self.gone = stream is None  # no stream at all: the process was started with it closed (`>&-`)

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except UnicodeEncodeError:
                encoding = getattr(self.stream, "encoding", None) or "ascii"
                self._guard(lambda: self.stream.write(text.encode(encoding, "backslashreplace").decode(encoding)))
            except Exception as exc:  # noqa: BLE001 - said in _lost
                self._lost(exc)
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            self._guard(self.stream.flush)

    def _guard(self, call) -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - said in _lost
            self._lost(exc)

    def _lost(self, exc: Exception) -> None:
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            self.failed = self.failed or exc
        elif not isinstance(exc, (BrokenPipeError, ValueError)):  # ValueError: a closed file
            raise exc
        self.gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)
        except Exception:  # noqa: BLE001 - a stream without a descriptor (a test's capture) has nothing to point
            pass

    def isatty(self) -> bool:
        return not self.gone and bool(getattr(self.stream, "isatty", lambda: False)())

    def __getattr__(self, name: str) -> Any:
        if self.stream is None:
            raise AttributeError(name)
        return getattr(self.stream, name)


def guard_streams() -> None:
    """sys.stdout and sys.stderr as GuardedStream (once; a later call finds them so)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if _guard_of(stream) is None:
            setattr(sys, name, GuardedStream(stream))


def _guard_of(stream: Any) -> GuardedStream | None:
    """The GuardedStream that `stream` is or wraps (jobs/console.py's WholeLines wraps one), or None."""
    while stream is not None and not isinstance(stream, GuardedStream):
        stream = vars(stream).get("stream") if hasattr(stream, "__dict__") else None
    return stream


def output_failure() -> str | None:
    """How this process's stdout failed (a GuardedStream's `failed`), or None."""
    guard = _guard_of(sys.stdout)
    if guard is None or guard.failed is None:
        return None
    return f"cannot write to stdout ({guard.failed.strerror or guard.failed}): what the command printed is lost"


def console_logging() -> None:
    """The commands' logging (xsbert, and the jobs' quiet console): records of WARNING and up, as `LEVEL name:
    message`, each once. huggingface_hub prints its records with a handler of its own and still passed them on to
    this one: each of its warnings (a retried request) came out twice."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("huggingface_hub").propagate = False
