"""The driver's memory: Arrow's allocator for a block (`system_memory_pool`), giving freed memory back to the OS
(`release_memory`, glibc's malloc_trim), and what the driver holds (`malloc_in_use`, `driver_memory_mb`); a factor
actor's: its limit and the budget its batches are planned in (`actor_memory`), and whether an error took its GPU
down (`device_lost`)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from ..config import GPU_PLAN_SHARE


@contextlib.contextmanager
def system_memory_pool() -> Iterator[None]:
    """Arrow's allocations inside the block from the system allocator (glibc's malloc) instead of pyarrow's default
    (mimalloc), unless $ARROW_DEFAULT_MEMORY_POOL chooses; the pool before is restored after it. For prepare(): read
    chunk by chunk, mimalloc keeps much of what each chunk freed even after release_unused() (404k pairs: 59 MB
    kept, 14 with the system pool), while glibc's free pages go back through malloc_trim (release_memory). For
    prepare(), the work list's plan and each wave's tables and commit; the rest of the waves keeps mimalloc: with the
    system pool throughout, the driver's floor after a wave was ~30 MB higher (10k pairs: 511 against 481 MB;
    bench/results/scale.md)."""
    before = pa.default_memory_pool()
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ and before.backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, loaded once; None where there is none (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_memory() -> None:
    """Hand freed memory back to the OS: Arrow's pool and glibc's heap keep what a large step freed (reading and
    tokenising the selection: 116 MB at 404k pairs), which would otherwise count as the driver's for the run."""
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(AttributeError):
        if (libc := _glibc()) is not None:
            libc.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


def malloc_in_use() -> int | None:
    """Bytes glibc's malloc has handed out and not got back (mallinfo2: uordblks + hblkhd), None without glibc 2.33+:
    the driver's live native heap (numpy, Ray's core worker, tokenizers; not Python's small objects, which live in
    pymalloc's arenas, nor Arrow's default pool)."""
    fn = getattr(_glibc(), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _MallInfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


def driver_memory_mb() -> dict[str, float]:
    """This process's resident memory in MB: rss_mb (all of it), and on Linux private_mb (RssAnon: its own heap,
    without the object-store pages it maps, which Ray's store owns) and malloc_mb (malloc_in_use: of the heap, what
    is live rather than kept by the allocators)."""
    out: dict[str, float] = {}
    with contextlib.suppress(ImportError):  # psutil comes with Ray; a machine without Ray may lack it
        import psutil

        out["driver_rss_mb"] = psutil.Process().memory_info().rss / 2**20
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                out["driver_private_mb"] = int(line.split()[1]) / 1024
    if (live := malloc_in_use()) is not None:
        out["driver_malloc_mb"] = live / 2**20
    return out


# --------------------------------------------------------------------------- a factor actor's memory


def actor_memory(explainer, limit: int | None, gpu_share: float | None) -> tuple[int | None, int | None]:
    """A factor actor's memory: (the budget its batches are planned in, Explainer.memory.budget; the limit of the
    tensors one call may hold on a CPU, xsbert_core.memory.TensorBudget, or None).

    On CUDA: with a limit, the caching allocator may hold what it holds now (the model) plus `limit`
    (torch.cuda.set_per_process_memory_fraction, set here: an allocation beyond it fails as on a full card), and
    batches are planned within `limit`; without one, within GPU_PLAN_SHARE of the actor's share of the card
    (`gpu_share`), less what the model holds. On a CPU: with a limit, each call's tensors are held to it
    (TensorBudget) and batches are not planned (the model's constants were read on a GPU): a batch that runs out is
    halved (Explainer). A process limit (RLIMIT_DATA) would do it for real too, but it also refuses the Ray worker's
    own threads and buffers. Without a limit, nothing is set or planned on a CPU."""
    import torch

    device = explainer.split.device
    if device.type != "cuda":
        return None, limit
    total = torch.cuda.get_device_properties(device).total_memory
    held = torch.cuda.memory_allocated(device)
    if limit is not None:
        torch.cuda.set_per_process_memory_fraction(min(1.0, (held + limit) / total), device)
        return int(limit), None
    return max(1, int(GPU_PLAN_SHARE * total * min(1.0, gpu_share or 1.0)) - held), None


def device_lost(device) -> bool:
    """After an error: is this process's CUDA context unusable (a sticky error: a device-side assert, an illegal
    address)? False on a CPU."""
    if getattr(device, "type", "cpu") != "cuda":
        return False
    import torch

    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return True
    return False
