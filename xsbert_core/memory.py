"""The memory of one batch of sentence factors, and the largest batch that fits a budget.

One `integrate` call (xsbert_core.factors) on B sentences padded to S tokens at N nodes holds, besides the model,
with R = B * N rows of S x H hidden states (H: hidden size, b: the JVPs' bytes per value, 4 for fp32 / tf32,
2 for bf16 / fp16):

    rows         R*S*H values of x(alpha_n) and of Delta (and the exact mode's shift): ROW_BUILD_COPIES float32
                 copies while x(alpha_n) is built, then 2 (3 exact) copies of b bytes for the whole call
    activations  the Jacobian-vector products of one jvp call: ACTIVATION_COPIES tensors of q * max(S*I, A*S*S)
                 values of b bytes, where q = sequences in the call (token tangents x rows, at most
                 chunk_elements / max(S*I, A*S*S); I: the FFN width, A: attention heads)
    factors      B*D*S float32 (the result; D: the embedding size)

    bytes(B, N, S) = max(ROW_BUILD_COPIES * 4, (2 + exact) * b) * R*S*H + ACTIVATION_COPIES * b * q * max(S*I, A*S^2)
                     + 4*B*D*S

The activations stop growing with B once the rows outnumber one jvp call's (the chunk bounds them); the rows grow
with B*N without bound, which is why a batch that fits at N = 16 runs out at N = 128-256, and why the batch that
fits (`FactorMemory.batch_size`) halves as N doubles once the rows dominate. A model is a guess: when a batch runs
out all the same, `FactorMemory.ran_out` caps the rows x tokens of later batches at half of what failed.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass

import torch
import torch._C._functorch as ft
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from .precision import Precision, jvp_dtype

# float32 copies of the R x S x H rows live while x(alpha_n) = h(r) + alpha * Delta is built: h(r) repeated, Delta
# repeated and alpha * Delta, then the sum (xsbert_core.factors.integrate).
ROW_BUILD_COPIES = 3
# Tensors of one jvp call's largest activation (the FFN's, or the attention scores') live at its peak. Read off
# bench/results/gpu.md's H100 peaks at a chunk of 2**30 values (4 GiB in float32): 29.3 GiB for all-mpnet-base-v2
# (~7 such tensors) and 19.0 GiB for all-MiniLM-L6-v2 (~4.75), the rows and the model taking the rest.
ACTIVATION_COPIES = 7


@dataclass(frozen=True)
class Shape:
    """What the memory of a batch depends on, from the model: hidden size H, FFN width I, attention heads A,
    embedding size D; and the JVPs' chunk (elements of the largest activation of one jvp call), or the sequences
    per jvp call where they are fixed (Explainer's internal_batch_size)."""

    hidden: int
    intermediate: int
    heads: int
    dim: int
    chunk_elements: int
    sequences_per_call: int | None = None


def batch_bytes(shape: Shape, batch: int, n_steps: int, seq_len: int, precision: Precision = "fp32",
                exact: bool = False) -> int:  # fmt: skip
    """bytes(B, N, S) of the module docstring: one integrate call's peak beyond the model."""
    b = torch.finfo(jvp_dtype(precision)).bits // 8
    rows = batch * n_steps
    row_values = rows * seq_len * shape.hidden
    per_seq = max(seq_len * shape.intermediate, shape.heads * seq_len * seq_len)
    per_call = shape.sequences_per_call or max(1, shape.chunk_elements // per_seq)  # token tangents x rows
    tok = max(1, min(seq_len, per_call))
    seqs = tok * min(rows, max(1, per_call // tok))
    row_bytes = max(ROW_BUILD_COPIES * 4, (2 + int(exact)) * b) * row_values
    return int(row_bytes + ACTIVATION_COPIES * b * seqs * per_seq + 4 * batch * shape.dim * seq_len)


class FactorMemory:
    """The largest factor batch that fits `budget` bytes (None: any), learning from batches that ran out.

    `batch_size(n, S, wanted)`: the largest B <= wanted with batch_bytes(B, n, S) <= budget, and B*n*S within the
    cap that `ran_out` set; at least 1 (a single sentence is tried whatever the model says)."""

    def __init__(self, shape: Shape, budget: int | None, precision: Precision = "fp32", exact: bool = False) -> None:
        self.shape, self.budget, self.precision, self.exact = shape, budget, precision, exact
        self.cap_row_tokens: int | None = None  # B*N*S of the largest batch known not to fit, halved
        self.out_of_memory = 0  # batches that ran out (ran_out calls)

    def fits(self, batch: int, n_steps: int, seq_len: int) -> bool:
        if self.cap_row_tokens is not None and batch * n_steps * seq_len > self.cap_row_tokens:
            return False
        return self.budget is None or batch_bytes(self.shape, batch, n_steps, seq_len, self.precision,
                                                  self.exact) <= self.budget  # fmt: skip

    def batch_size(self, n_steps: int, seq_len: int, wanted: int) -> int:
        """The largest B in [1, wanted] that fits (bytes grow with B: a bisection)."""
        if self.fits(wanted, n_steps, seq_len):
            return wanted
        lo, hi = 1, wanted  # fits(lo) is assumed (B = 1 is always tried), fits(hi) is False
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.fits(mid, n_steps, seq_len) else (lo, mid)
        return lo

    def ran_out(self, batch: int, n_steps: int, seq_len: int) -> None:
        """A batch of B sentences at n nodes, S tokens ran out of memory: later batches stay at or below half its
        rows x tokens."""
        self.out_of_memory += 1
        half = max(1, batch * n_steps * seq_len // 2)
        self.cap_row_tokens = half if self.cap_row_tokens is None else min(self.cap_row_tokens, half)


# Messages of allocators that ran out: torch's CPU allocator ("DefaultCPUAllocator: can't allocate memory") under a
# process limit (RLIMIT_DATA) or a full machine, and cuBLAS's own allocation inside a CUDA call.
_OUT_OF_MEMORY_TEXT = ("can't allocate memory", "not enough memory", "out of memory", "CUBLAS_STATUS_ALLOC_FAILED")


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed: torch.OutOfMemoryError (CUDA's caching allocator), or an allocator's message."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc) for t in _OUT_OF_MEMORY_TEXT)


def release_cached(device: torch.device) -> None:
    """What the caching allocator keeps after a failed batch goes back to the device; first the tensors that only a
    reference cycle (the failed call's frames) still holds, which would otherwise stay until the collector ran."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def _storage(t: torch.Tensor) -> tuple[torch.UntypedStorage, int] | None:
    """The storage that holds `t`'s values, and where: under functorch's wrappers (batched, dual, functional); None
    for a wrapper without one of its own."""
    for _ in range(8):
        if not (ft.is_batchedtensor(t) or ft.is_gradtrackingtensor(t) or ft.is_functionaltensor(t)):
            break
        t = ft.get_unwrapped(t)
    try:
        storage = t.untyped_storage()
        return storage, storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _storage_key(t: torch.Tensor) -> int | None:
    found = _storage(t)
    return found[1] if found is not None else None


class TensorBudget(TorchDispatchMode):
    """A limit on the tensors an engine call holds at once, where no allocator sets one (a CPU; a GPU's caching
    allocator has its own, torch.cuda.set_per_process_memory_fraction).

        with TensorBudget(64 * 2**20) as budget:   # the storages of tensors made inside, alive at once <= 64 MiB
            explainer.factors(texts)                # an op whose outputs pass it raises torch.OutOfMemoryError
        budget.peak                                 # the most they held (also with limit=None: a meter)

    Every op's outputs are counted at the storage that holds them (inside vmap and jvp too: the plain tensor under
    functorch's wrappers), each storage once, until it is freed; an output that shares an input's storage (a view,
    an in-place op: the transpose F.linear takes of a weight) is no allocation, so tensors made before (the model)
    are not counted, nor their views. It runs in Python for every op: a CPU's seam, not a GPU's."""

    def __init__(self, limit: int | None) -> None:
        super().__init__()
        self.limit = limit
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs: set[int | None] = set()
        tree_map_only(torch.Tensor, lambda t: inputs.add(_storage_key(t)), (args, kwargs))
        tree_map_only(torch.Tensor, lambda t: self._count(t, inputs), out)
        return out

    def _count(self, t: torch.Tensor, inputs: set[int | None]) -> None:
        found = _storage(t)
        if found is None:
            return
        storage, key = found
        n = storage.nbytes()
        if n == 0 or key in self.live or key in inputs:
            return
        self.live[key] = n
        self.now += n
        self.peak = max(self.peak, self.now)

        def free(key: int = key, n: int = n) -> None:
            if self.live.pop(key, None) is not None:
                self.now -= n

        weakref.finalize(storage, free)
        if self.limit is not None and self.now > self.limit:
            raise torch.OutOfMemoryError(f"tensor budget: {n} bytes more would hold {self.now} bytes at once, over "
                                         f"the limit of {self.limit} bytes (xsbert_core.memory.TensorBudget)")
