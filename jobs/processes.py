"""Which process owns a thing left on disk or in a bucket (a lock, a training's temporary folder), and whether that
process is gone. Standard library only.

A process is named by its host and its pid. Only a process of this host can be known to be gone (its pid no longer
runs); one of another host, or one this user may not signal, counts as alive: a caller then waits for an expiry or
leaves the thing alone rather than remove what a live process still writes."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path


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
