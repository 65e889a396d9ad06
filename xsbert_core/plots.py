"""Heatmaps of attribution matrices in the style of the papers' figures."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: plots are written to files
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402


def plot_attributions(
    matrix: np.ndarray,
    labels_a: list[str],
    labels_b: list[str],
    path: str | Path | None = None,
    title: str | None = None,
    cmap: str = "RdBu_r",
):
    """Heatmap of A (rows: tokens of a, columns: tokens of b), diverging colormap centred at 0.

    Returns the matplotlib Figure; writes it to `path` when given.
    """
    a = np.asarray(matrix, dtype=float)
    if a.shape != (len(labels_a), len(labels_b)):
        raise ValueError(f"matrix shape {a.shape} does not match labels ({len(labels_a)}, {len(labels_b)})")
    bound = float(np.abs(a).max()) or 1.0
    width = max(4.0, 0.42 * len(labels_b) + 2.5)
    height = max(3.5, 0.36 * len(labels_a) + 1.8)
    fig, ax = plt.subplots(figsize=(width, height))
    im = ax.imshow(a, cmap=cmap, norm=TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound), aspect="auto")
    ax.set_xticks(range(len(labels_b)), labels_b, rotation=60, ha="right", fontsize=9)
    ax.set_yticks(range(len(labels_a)), labels_a, fontsize=9)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    plt.setp(ax.get_xticklabels(), rotation=60, ha="left", rotation_mode="anchor")
    fig.colorbar(im, ax=ax, shrink=0.8, label="attribution")
    if title:
        ax.set_xlabel(title, fontsize=10, labelpad=10)
        ax.xaxis.set_label_position("bottom")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=150, bbox_inches="tight")
        plt.close(fig)
    return fig
