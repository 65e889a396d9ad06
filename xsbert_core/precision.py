"""Arithmetic of the Jacobian-vector products: float32, TF32 matrix products, bfloat16 or float16.

    fp32   every JVP in float32 (the reference; TF32 matrix products off, whatever the process set)
    tf32   float32 tensors, matrix products in TF32 on CUDA (torch.backends.cuda.matmul.allow_tf32 and
           torch.backends.cudnn.allow_tf32 on during the JVPs, restored after); on a CPU the same numbers as fp32
    bf16   the layers L..n-1, pooling and the tangents in bfloat16 (a copy of the model cast to it)
    fp16   the same in float16

Only the JVPs change: the endpoints h(x), h(r), e(x), e(r) come from the float32 model, each JVP's output is
cast to float32 before it is weighted and summed over the quadrature nodes, and the completeness check
(||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)||), P_a^T P_b and the norms are float64 as before. So a
reduced precision shows in the factor error against float32's endpoints, not hidden by them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Precision = Literal["fp32", "tf32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")
# The default on every device. The rule for a CUDA default: the fastest precision whose mean completeness error on
# STS-B test pairs stays within 2x float32's. Applying it needs bench/gpu.py's precision sweep on a GPU, which has not
# run yet, so CUDA keeps float32 too (bench/precision.py measures the precisions on the CPU).
DEFAULT_PRECISION: Precision = "fp32"

_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "32": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "16": "fp16",
}  # fmt: skip

# By name: torch is imported where a dtype is asked for, so that reading a setting does not load it.
_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def canonical_precision(precision: str) -> Precision:
    """Map 'fp32'/'float32'/'bf16'/'bfloat16'/'fp16'/'half'/'tf32' to its short name; ValueError otherwise."""
    key = str(precision).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"Unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    return _ALIASES[key]  # type: ignore[return-value]


def jvp_dtype(precision: Precision) -> torch.dtype:
    """The dtype of the JVPs' tensors: float32 for fp32 and tf32, else bfloat16 / float16."""
    import torch

    return getattr(torch, _DTYPES[precision])


@contextlib.contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Within: CUDA matrix products (and cuDNN) in TF32 iff `enabled`; both flags restored on exit.

    The flags are process-wide torch settings; they only affect CUDA kernels, so on a CPU nothing computes
    differently (a CPU build of torch has them too, which is how the tests check they are set and restored)."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn
