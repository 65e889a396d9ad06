"""Forward-mode rules for the engine's Jacobian-vector products where torch's own do work that is known to be zero.

    y = x W^T + b,  W and b constants:   dy = dx W^T

torch's rule for a linear layer also carries the terms of W's and b's tangents. Under `torch.func.jvp` the parameters
have none, yet the rule multiplies x by a zero tangent of W and adds the product (and b's zero tangent) to dx W^T:
under vmap over token tangents that is one more matrix product of the primal's size and one more addition over the
whole (tokens x rows x S x width) output per linear layer, about a third of the layer's cost. `constant_parameters`
routes `torch.nn.functional.linear` (every `nn.Linear`) whose weight and bias are plain constant tensors to a rule
that computes dx W^T alone: the same matrix product on the same tangent, so the same numbers, and nothing else.

A weight or bias that carries a tangent or requires a gradient (a functorch-wrapped tensor, a parameter being
trained) keeps torch's own rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.overrides import TorchFunctionMode


class _ConstantLinear(torch.autograd.Function):
    """y = F.linear(x, W, b) with W, b constants: jvp dy = dx W^T, vjp dx = dy W."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_forward(inputs[1])
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def jvp(ctx, x_t: Tensor, weight_t, bias_t) -> Tensor:
        (weight,) = ctx.saved_tensors
        return F.linear(x_t, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (weight,) = ctx.saved_tensors
        return grad @ weight, None, None


def _constant(t: Tensor | None) -> bool:
    return t is None or (isinstance(t, Tensor) and not t.requires_grad and not is_functorch_wrapped_tensor(t))


class _ConstantParameters(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            names = ("input", "weight", "bias")
            given = {**dict(zip(names, args)), **kwargs}
            weight, bias = given.get("weight"), given.get("bias")
            if set(given) <= set(names) and weight is not None and _constant(weight) and _constant(bias):
                return _ConstantLinear.apply(given["input"], weight, bias)
        return func(*args, **kwargs)


@contextlib.contextmanager
def constant_parameters() -> Iterator[None]:
    """Within: linear layers whose weight and bias are constants take the forward-mode rule dy = dx W^T."""
    with _ConstantParameters():
        yield
