"""Errors raised by xsbert_core: each says what was wrong and what to do about it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn


def not_utf8(exc: UnicodeDecodeError) -> str:
    """How a file that is not UTF-8 is said, in every command: its first byte that is not, and where."""
    return f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"


class XsbertError(Exception):
    """Base class of every error this package raises on purpose."""


class InputError(XsbertError, ValueError):
    """A text, pair or setting that cannot be attributed (empty text, only special tokens, N < 1, bad layer, ...)."""


def is_blank(text: str | None) -> bool:
    """Whether a text has nothing to attribute: none, empty, or white space only (check_text's rule; a dataset's row
    with such a text is quarantined, jobs/attribution/validate.py)."""
    return text is None or not text.strip()


def check_text(text: object) -> None:
    """The rule every attributed text meets, checked where the texts come in (before a model loads): a string with
    something in it but white space, and no lone surrogate (what Python makes of bytes that are not UTF-8, in argv
    or a file read with surrogateescape: no tokenizer takes it); an InputError if not."""
    if not isinstance(text, str):
        raise InputError(f"Texts must be strings, got {type(text).__name__}")
    if is_blank(text):
        raise InputError("Empty or whitespace-only text cannot be attributed")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        point = ord(text[exc.start])
        what = (f"not UTF-8 text (byte {point - 0xDC00:#04x} at character {exc.start})" if 0xDC80 <= point <= 0xDCFF
                else f"a lone surrogate (U+{point:04X} at character {exc.start})")  # fmt: skip
        raise InputError(f"Text cannot be attributed: {what}") from None


class TruncationError(InputError):
    """A text is longer than the model's max_seq_length and truncation was set to 'error'."""


class UnsupportedModelError(XsbertError, TypeError):
    """The model's architecture is not one the engine can split at a layer."""


class ModelNotFoundError(XsbertError, FileNotFoundError):
    """A model name resolved neither to a local folder, an installed package, nor the hub."""


class NumericalError(XsbertError, ArithmeticError):
    """NaN or Inf appeared in attributions or embeddings."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a scheduler stopping the command, `ray job stop`), raised where Ctrl-C's KeyboardInterrupt
    would be, so that a command stops the same way: what it cleans up on the way out, one line."""


def terminate(signum: int, frame: object) -> NoReturn:
    """The SIGTERM handler of a command (exit_status; jobs.raycluster puts it back after ray.init)."""
    raise Terminated()


def exit_status(prog: str, body: Callable[[], object], interrupted: str = "",
                errors: tuple[type[Exception], ...] = (XsbertError,)) -> int:  # fmt: skip
    """Every command's way out: the body's result if it is an exit status (an int), else 0 (a summary, None); an
    error it raises on purpose (`errors`) is one `PROG: error: ...` line and status 2, Ctrl-C one
    `PROG: interrupted[: what stays]` line and 130, SIGTERM as Ctrl-C with `PROG: terminated (SIGTERM)[: what
    stays]` and 143, never a traceback. What it prints cannot fail it (xsbert_core.console guard_streams); a stdout
    that failed (a full disk) is one line at the end, status 2."""
    import signal
    import threading

    from .console import guard_streams, output_failure

    guard_streams()
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, terminate) if main else None
    try:
        result = body()
    except errors as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        what, status = ("terminated (SIGTERM)", 143) if isinstance(exc, Terminated) else ("interrupted", 130)
        print(f"{prog}: {what}" + (f": {interrupted}" if interrupted else ""), file=sys.stderr)
        return status
    finally:
        if before is not None:  # None: not in the main thread, or a handler not set from Python (left as it is)
            signal.signal(signal.SIGTERM, before)
    if (failure := output_failure()) is not None:
        print(f"{prog}: error: {failure}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


class CommandParser(argparse.ArgumentParser):
    """Every command's argument parser: argparse's, with a usage error said in one line and status 2, `NAME: error:
    MESSAGE (see PROG --help)`, instead of the usage block first (a long command's buries the line that matters).
    NAME is `command_name(PROG)`, the prefix of the command's other errors too (exit_status). Sub-commands' parsers
    are of this class too (argparse makes them of the parent's). `extras_hint(namespace, extras)`: what to add to the
    line for arguments it does not take (xsbert sql: a query given unquoted)."""

    def __init__(self, *args: Any, extras_hint: Callable[[argparse.Namespace, list[str]], str] | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.extras_hint = extras_hint

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{command_name(self.prog)}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, but a flag no parser knows is said by the sub-command given (`xsbert explain: error:
        unrecognized arguments: --bogus (see xsbert explain --help)`), whose flags it was meant for; argparse says it
        as the top command's."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen = self
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction) and action.dest != argparse.SUPPRESS:
                    chosen = action.choices.get(getattr(namespace, action.dest, None), self)
            hint = chosen.extras_hint(namespace, extras) if getattr(chosen, "extras_hint", None) else ""
            chosen.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace


def command_name(prog: str) -> str:
    """What a command's error lines begin with: its prog without `python -m ` (`jobs.attribute`, `xsbert explain`)."""
    return prog.removeprefix("python -m ")
