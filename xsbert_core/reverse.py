"""Slow, obviously correct sentence factors: reverse mode, one backward pass per embedding dimension.

    P[k, s] = sum_n w_n sum_h (d e_k / d x)[s, h] (x(alpha_n)) * Delta[s, h]

This is how the reference research code computes attributions (a loop over all D output
dimensions, one sentence at a time). It is the yardstick for the forward-mode engine in tests and
in bench/, not a production path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .factors import endpoints
from .quadrature import Panel, panel_nodes_and_weights
from .split import SplitModel


def sentence_factor_reverse(
    split: SplitModel, text: str, rule: str, n_steps: int, prompt: str | None = None, exclude_prompt: bool = False,
    panels: Sequence[Panel] | None = None,
) -> Tensor:
    """The (D, S) factor of one text (prompt tokens included, as columns), by D backward passes per quadrature node;
    the rule at n_steps on [0, 1], or on each of `panels` (n nodes each) and summed."""
    batch = split.tokenize([text], prompt=prompt, exclude_prompt=exclude_prompt)
    ends = endpoints(split, batch)
    delta = ends.delta
    nodes = [panel_nodes_and_weights(rule, p) for p in (panels or [Panel(0.0, 1.0, n_steps)])]
    alphas = [float(a) for a_n, _ in nodes for a in a_n]
    weights = [float(w) for _, w_n in nodes for w in w_n]
    dim = ends.e_x.shape[-1]
    factor = torch.zeros(dim, batch.lengths[0], dtype=torch.float64)
    with torch.enable_grad():
        for alpha, weight in zip(alphas, weights):
            x = (ends.h_r + float(alpha) * delta).detach().requires_grad_(True)
            e = split.tail(x, batch.features, ends.shift, batch.prompt_length)[0]
            for k in range(dim):
                (grad,) = torch.autograd.grad(e[k], x, retain_graph=k < dim - 1)
                factor[k] += float(weight) * (grad[0] * delta[0]).sum(-1).double().cpu()
    return factor.to(ends.e_x.dtype)
