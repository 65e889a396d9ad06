"""Adaptive N by panels: the rule on pieces of the path, a piece halved only where its own error is.

A sentence's path [0, 1] is cut into panels p = [a_p, b_p], each with the rule's N nodes (quadrature.Panel). Each
panel's completeness error is known exactly, from the path's points at its ends:

    eps_p = sum_s P_p[:, s] - (e(x(b_p)) - e(x(a_p)))        (factors.integrate_panels, factors.path_embeddings)

and, the ends telescoping, the sentence's error is ||sum_p eps_p|| / ||e(x) - e(r)||. Each round:

  * the sentence's error meets the tolerance tol: done;
  * else each panel whose own error ||eps_p|| / ||e(x) - e(r)|| is above its share tol * (b_p - a_p) is halved (its
    factor dropped, its halves computed next round); the others are kept. Once every panel is within its share the
    sentence is within tol (triangle inequality), so the rounds end;
  * the sentence's nodes stay <= max_steps: the panels furthest above their share are halved first, as many as fit;
    when none fits the sentence stops above tol (not converged), as adaptive N by doubling does at its cap.

Doubling computes all of [0, 1] again at 2N. A path with one narrow feature (bench/results/integrand.md: some QQP
questions' mpnet path has a peak ~0.02 wide at alpha ~0.35) gets its extra nodes around the feature alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from .quadrature import Panel

# Adaptive N before there was a choice: a run id, a manifest and a config leave `refine` out at this value, so the
# stores made then keep theirs.
DOUBLE = "double"
REFINEMENTS: tuple[str, ...] = (DOUBLE, "panels")
# Panels since 2026-11-29: on all-mpnet-base-v2's first 40 QQP questions (layer 8, tolerance 1e-3, cap 512) 3.8x
# faster than doubling on a CPU, every question converged both ways, the hard ones as close to a fixed N = 1024 or
# closer (bench/results/refine.md).
DEFAULT_REFINE = "panels"


def over_share(panel: Panel, error: float, tolerance: float) -> float:
    """How far a panel's relative error is above its share of the tolerance: error / (tol * width) (> 1: above)."""
    return error / (tolerance * panel.width)


def plan_round(panels: Sequence[Panel], errors: Sequence[float], tolerance: float, nodes: int,
               max_steps: int) -> tuple[list[Panel], list[Panel]]:  # fmt: skip
    """(kept, halved) of a round's panels, given each panel's relative error and the sentence's nodes in all (kept
    panels of earlier rounds included). Halving a panel of n nodes adds n; the panels furthest above their share go
    first while the sentence stays within max_steps; the rest are kept."""
    if len(panels) != len(errors):
        raise ValueError("one error per panel")
    order = sorted(range(len(panels)), key=lambda i: -over_share(panels[i], errors[i], tolerance))
    halved: set[int] = set()
    for i in order:
        if over_share(panels[i], errors[i], tolerance) <= 1.0:
            break
        if nodes + panels[i].n <= max_steps:
            halved.add(i)
            nodes += panels[i].n
    kept = [p for i, p in enumerate(panels) if i not in halved]
    return kept, [p for i, p in enumerate(panels) if i in halved]


def node_passes(n_steps: int, panels: Sequence[Panel] | None, start: int) -> int:
    """The nodes adaptive N computed for a sentence of n_steps nodes in all, those it dropped included: doubling
    start + 2 start + ... + N = 2N - start; panels every panel computed, the final L and the L - 1 that were halved,
    (2L - 1) start (start nodes each)."""
    return (2 * len(panels) - 1) * start if panels else 2 * n_steps - start
