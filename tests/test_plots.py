"""The report figures' text stays inside the figure, and a histogram of pairs counts in whole pairs."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from xsbert_core.plots import plot_histograms

# the adjectives section's title (jobs/analyses/adjectives.py) for a long model name: 88 characters on its second line
TITLE = ("Attribution of the adjective pair's cell\n"
         "all-MiniLM-L6-v2 shelf, layer 3 of 6, the paper's set, “This house is X.”, n = 46 pairs")  # fmt: skip


def test_a_long_title_is_wrapped_inside_the_figure_and_counts_are_whole():
    rng = np.random.default_rng(0)
    fig = plot_histograms({"synonym": rng.uniform(0.1, 0.45, 23), "opposite": rng.uniform(0.05, 0.35, 23)}, None,
                          TITLE, "word-cell attribution", bins=24, vlines={"0": 0.0})  # fmt: skip
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        title = ax.title.get_window_extent()
        figure = fig.bbox
        assert figure.x0 <= title.x0 and title.x1 <= figure.x1, (title, figure)  # it was cut at the right edge
        assert ax.title.get_text().count("\n") >= 2  # the long line wrapped
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks  # no tick at 0.5 pairs
        tallest = max(p.get_path().vertices[:, 1].max() for p in ax.patches)
        assert ax.get_ylim()[1] >= 1.2 * tallest  # headroom for the legend
    finally:
        plt.close(fig)
