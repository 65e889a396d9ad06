"""xsbert_core.tangent_rules: a linear layer's forward-mode rule with constant parameters, dy = dx W^T.

    same numbers   vmap(jvp(F.linear)) equals torch's own rule exactly, with and without a bias
    less work      one matrix product for the tangents and no addition (torch's rule adds x times the weight's zero
                   tangent, and the bias's zero tangent)
    torch's rule   kept where the weight carries a tangent; a gradient through the rule is F.linear's

The engine's own results with the rule: tests/test_families.py (every family against the independent reference).
"""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.func import jvp, vmap
from torch.utils._python_dispatch import TorchDispatchMode

from xsbert_core.tangent_rules import constant_parameters


class OpCount(TorchDispatchMode):
    """The aten ops run inside, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def tangents_of_linear(x, t, w, b, rule: bool):
    def push(tt):
        return jvp(lambda h: F.linear(h, w, b), (x,), (tt,))

    if rule:
        with constant_parameters():
            return vmap(push)(t)
    return vmap(push)(t)


@pytest.mark.parametrize("bias", [False, True])
def test_same_numbers_as_torchs_rule_and_less_work(bias):
    torch.manual_seed(0)
    w, b = torch.randn(7, 5), (torch.randn(7) if bias else None)
    x, t = torch.randn(3, 4, 5), torch.randn(6, 3, 4, 5)  # 6 tangents of a (3, 4, 5) input
    with torch.no_grad(), OpCount() as own:
        y_own, dy_own = tangents_of_linear(x, t, w, b, rule=False)
    with torch.no_grad(), OpCount() as ruled:
        y, dy = tangents_of_linear(x, t, w, b, rule=True)
    assert torch.equal(dy, dy_own) and torch.equal(y, y_own)
    assert torch.allclose(dy, t @ w.T, rtol=1e-6, atol=1e-6)
    # One product for y = x W^T + b, one for all tangents dx W^T, nothing added to them.
    assert ruled.ops["mm"] + ruled.ops["addmm"] == 2 and ruled.ops["add"] == 0
    assert own.ops["mm"] + own.ops["addmm"] == 3 and own.ops["add"] > 0  # torch's: + x (W's zero tangent)^T


def test_a_weight_with_a_tangent_keeps_torchs_rule():
    torch.manual_seed(1)
    w, w_t, x = torch.randn(4, 3), torch.randn(4, 3), torch.randn(2, 3)
    with constant_parameters():
        _, dy = jvp(lambda v: F.linear(x, v), (w,), (w_t,))
    assert torch.allclose(dy, x @ w_t.T, rtol=1e-6, atol=1e-6)


def test_gradient_through_the_rule_is_linears():
    torch.manual_seed(2)
    w, b = torch.randn(4, 3), torch.randn(4)
    x = torch.randn(2, 3, requires_grad=True)
    with constant_parameters():
        (g,) = torch.autograd.grad(F.linear(x, w, b).pow(2).sum(), x)
    (want,) = torch.autograd.grad(F.linear(x, w, b).pow(2).sum(), x)
    assert torch.allclose(g, want, rtol=1e-6, atol=1e-6)
