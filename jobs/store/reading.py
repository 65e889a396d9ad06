"""Reading a run on object storage through DuckDB (xsbert sql, xsbert serve and show, jobs.report): pyarrow's
filesystem as an fsspec filesystem (what DuckDB's `register_filesystem` takes) whose every call is retried as the
store's own calls are (retry.py: 5xx, 429, no answer; backoff with jitter up to XSBERT_STORE_RETRY_S), and whose
failure for good is one StoreError line that names the object and what came back."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

from .retry import GaveUp, retried, store_failure, store_retry_s

# Failures that are an answer, not a fault: passed on as they are (DuckDB asks whether a path exists this way).
_ANSWERS = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


class RetriedFile(io.RawIOBase):
    """An object opened for reading whose reads are retried: each read is a ranged read at the file's position
    (read_at), and a failed one opens the object again before the next try, so a try reads the same bytes."""

    def __init__(self, fs: Any, path: str, call: Callable[[str, str, Callable[[], Any]], Any]) -> None:
        super().__init__()
        self._fs, self._path, self._call = fs, path, call
        self._file = call("cannot read", path, lambda: fs.open_input_file(path))
        self._size = int(self._file.size())
        self._pos = 0

    @property
    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._size - self._pos)
        n = left if size is None or size < 0 else min(size, left)
        if n == 0:
            return b""

        def attempt() -> bytes:
            try:
                return self._file.read_at(n, self._pos)
            except Exception:
                with contextlib.suppress(Exception):  # the next try reads from a fresh handle
                    self._file = self._fs.open_input_file(self._path)
                raise

        data = self._call("cannot read", self._path, attempt)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        super().close()


def retried_fsspec(location: str, fs: Any, protocols: tuple[str, ...], deadline_s: float | None = None) -> Any:
    """The pyarrow filesystem `fs` of the store at `location` (s3://bucket/..., gs://...; for messages) as an fsspec
    filesystem for DuckDB under the URI schemes `protocols`: listings, infos and reads retried for up to
    `deadline_s` seconds each (default store_retry_s()); writes are not its business (readers only)."""
    from fsspec.implementations.arrow import ArrowFSWrapper

    deadline = store_retry_s() if deadline_s is None else deadline_s

    def call(doing: str, path: str, fn: Callable[[], Any]) -> Any:
        try:
            return retried(fn, deadline)
        except GaveUp as g:
            if isinstance(g.error, _ANSWERS):
                raise g.error from None
            raise store_failure(location, g.error, doing, path, g) from None

    class Retried(ArrowFSWrapper):
        protocol = protocols

        def ls(self, path: str, detail: bool = False, **kwargs: Any) -> Any:
            return call("cannot list", path, lambda: ArrowFSWrapper.ls(self, path, detail, **kwargs))

        def info(self, path: str, **kwargs: Any) -> Any:
            return call("cannot read", path, lambda: ArrowFSWrapper.info(self, path, **kwargs))

        def modified(self, path: str) -> Any:
            return call("cannot read", path, lambda: ArrowFSWrapper.modified(self, path))

        def _open(self, path: str, mode: str = "rb", block_size: Any = None, seekable: bool = True,
                  **kwargs: Any) -> Any:  # fmt: skip
            if mode != "rb":
                return super()._open(path, mode, block_size, seekable, **kwargs)
            return RetriedFile(self.fs, self._strip_protocol(path), call)

    return Retried(fs, skip_instance_cache=True)
