"""Which process owns a thing left on disk or in a bucket (a lock, a training's temporary folder), and whether that
process is gone. Standard library only.

A process is named by its host and its pid. Only a process of this host can be known to be gone (its pid no longer
runs); one of another host, or one this user may not signal, counts as alive: a caller then waits for an expiry or
leaves the thing alone rather than remove what a live process still writes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def this_process() -> tuple[str, int]:
    """(host, pid) of the calling process."""
    return socket.gethostname(), os.getpid()


def process_gone(host: object, pid: object) -> bool:
    """True only when `pid` is a process of this host that no longer runs."""
    if host != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        return False
    return False


def process_tag() -> str:
    """`<host>-<pid>` of the calling process: the part of a temporary name that says who writes it."""
    host, pid = this_process()
    return f"{host}-{pid}"


def tag_gone(tag: str) -> bool:
    """True only when `tag` (process_tag's) names a process of this host that no longer runs."""
    host, _, pid = tag.rpartition("-")
    return pid.isdigit() and process_gone(host, int(pid))


def owned_path(folder: Path, prefix: str, suffix: str = "") -> Path:
    """`folder/<prefix><process_tag()><suffix>`: a temporary name whose owner remove_orphans can tell."""
    return Path(folder) / f"{prefix}{process_tag()}{suffix}"


def remove_orphans(folder: Path, prefix: str, suffix: str = "") -> list[Path]:
    """Remove the files and folders of `folder` named `<prefix><tag><suffix>` whose process (process_tag) was of
    this host and is gone: what a killed process left. Return them."""
    removed = []
    for path in sorted(Path(folder).glob(f"{prefix}*{suffix}")):
        if not tag_gone(path.name[len(prefix):len(path.name) - len(suffix)]):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def lock_file(path: Path, shared: bool = False) -> IO[str] | None:
    """An flock(2) on the file `path` (made if missing) for this process, exclusive or `shared`, without waiting:
    the open file, to keep while the lock is needed (closing it releases the lock), or None when another process
    holds it. An exclusive holder writes who it is into the file, for `held_by` to say."""
    import fcntl

    while True:
        fh = open(path, "r" if shared else "a+", encoding="utf-8")
        try:
            fcntl.flock(fh, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return None
        try:  # still the file at `path`: a holder that removes it on release (release_removing) did not just do so
            if os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        fh.close()
    if not shared:  # who holds it, unbuffered and best effort: on a full disk the lock holds all the same
        host, pid = this_process()
        try:
            os.ftruncate(fh.fileno(), 0)
            os.pwrite(fh.fileno(), f"pid {pid} on {host}\n".encode(), 0)
        except OSError:
            pass
    return fh


@contextlib.contextmanager
def waiting_lock(path: Path) -> Iterator[None]:
    """An exclusive flock(2) on the file `path` (made if missing) for the block, waiting for another holder to let
    go: for a short read-modify-write that two processes may do at once (a merge into a JSON file, the next part's
    number); the file stays."""
    import fcntl

    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        yield


def release_removing(fh: IO[str]) -> None:
    """Release a lock_file lock and remove its file, so that nothing of it stays on disk (lock_file's check of the
    file's identity keeps a process that opened it just before from holding a lock on a removed file)."""
    try:
        os.unlink(fh.name)
    except FileNotFoundError:
        pass
    fh.close()


def held_by(path: Path, wait_s: float = 0.1) -> str:
    """Who holds the lock file `path`, as its holder wrote it ("pid 123 on node-1"), or "another process". A holder
    writes its name just after it takes the lock: an empty file is read again for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            said = path.read_text(encoding="utf-8").strip()
        except OSError:
            said = ""
        if said or time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    return said if said.startswith("pid ") else "another process"
