"""Heatmaps of attribution matrices in the style of the papers' figures."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: plots are written to files
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

IMAGE_FORMATS = tuple(sorted(FigureCanvasBase.get_supported_filetypes()))  # what savefig writes, by file suffix


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


def plot_histograms(
    series: dict[str, np.ndarray],
    path: str | Path | None,
    title: str,
    xlabel: str,
    bins: int = 40,
    vlines: dict[str, float] | None = None,
    note: str | None = None,
):
    """Overlaid histograms (step outlines, shared bins), one per named series; dashed vertical lines. Writes the
    figure to `path` and returns the path; with `path` None, returns the open matplotlib Figure."""
    values = [np.asarray(v, dtype=float) for v in series.values()]
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.zeros(0)
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    note = _wrapped(note)
    n_note = note.count("\n") + 1 if note else 0
    fig, ax = plt.subplots(figsize=(6.4, 3.8 + 0.22 * n_note))
    for name, v in zip(series, values):
        ax.hist(v[np.isfinite(v)], bins=edges, histtype="step", linewidth=1.6, label=f"{name} (n={v.size})")
    _mark(ax, vlines)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("pairs")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: no tick at 0.5 pairs
    ax.set_ylim(0, max(ax.get_ylim()[1], 1) * 1.25)  # headroom: the legend above the tallest bar, not over it
    _title(ax, title)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    if note:  # below the axes, where it cannot cover bars or labels
        fig.subplots_adjust(bottom=fig.subplotpars.bottom + 0.06 * n_note)
        fig.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=8, color="0.2")
    if path is None:
        return fig
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def plot_by_layer(
    layers: list[int],
    series: dict[str, tuple[np.ndarray, np.ndarray | None]],
    path: str | Path | None,
    title: str,
    ylabel: str,
    reference: dict[str, tuple[float, float]] | None = None,
    bounds: tuple[float, float] | None = None,
    dashed: tuple[str, ...] = (),
    band_label: str = "shaded: mean ± 1 std over pairs",
    note: str | None = None,
):
    """Lines over layers: name -> (mean per layer, std per layer or None, drawn as a band).

    `reference` marks published values as points: label -> (layer, value); `bounds` clips the
    mean ± std bands to the metric's range (e.g. (0, 1) for a Jaccard index); the series named in `dashed`
    (a baseline such as a noise floor) are drawn dashed. The bands are named once in the legend (`band_label`);
    `note` (e.g. the pairs each point is over) is written under the title.

    Writes the figure to `path` and returns the path; with `path` None, returns the open matplotlib Figure.
    """
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(8.4, 5.0), layout="constrained")  # constrained: room for the legend below
    banded = False
    for name, (mean, std) in series.items():
        mean = np.asarray(mean, dtype=float)
        style = "--" if name in dashed else "-"
        (line,) = ax.plot(layers, mean, marker="o", linewidth=1.6, linestyle=style, label=name)
        if std is not None:
            std = np.asarray(std, dtype=float)
            low, high = mean - std, mean + std
            if bounds is not None:
                low, high = np.clip(low, *bounds), np.clip(high, *bounds)
            ax.fill_between(layers, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            banded = True
    # published values: dark markers named in the legend (a label beside the point would sit among the lines)
    for k, (label, (x, y)) in enumerate((reference or {}).items()):
        ax.plot([x], [y], marker="*XPD"[k % 4], markersize=11 if k % 4 == 0 else 8, color="0.2", linestyle="none",
                label=label)  # fmt: skip
    ax.set_xticks(layers)
    ax.set_xlabel("layer L (attributions to the input of encoder layer L)")
    ax.set_ylabel(ylabel)
    _title(ax, title + (f"\n{note}" if note else ""), fontsize=10)
    ax.grid(alpha=0.3)
    if banded:
        ax.add_artist(ax.legend(handles=[Patch(color="0.6", alpha=0.3, label=band_label)], fontsize=7,
                                loc="lower left", framealpha=0.8))  # fmt: skip
    # below the axes, not inside: with a noise floor the lines and bands fill the plot wherever a legend could go
    fig.legend(handles=[h for h in ax.get_lines() if not h.get_label().startswith("_")], fontsize=8,
               loc="outside lower center", ncol=2)
    if path is None:
        return fig
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- report figures (jobs.report)
# Characters per line of a note under a figure: a longer line would widen the saved figure beyond its axes.
NOTE_WIDTH = 100


def _wrapped(note: str | None) -> str | None:
    """The note with each line wrapped at NOTE_WIDTH characters."""
    if not note:
        return note
    return "\n".join(textwrap.fill(line, NOTE_WIDTH) or line for line in note.split("\n"))


def _title(ax, title: str, fontsize: float = 11, **kwargs) -> None:
    """The axes' title, each line wrapped to the figure's width (about 0.6 em a character): a longer line is cut
    off at the figure's edge."""
    width = max(20, int(ax.figure.get_figwidth() * 72 / (0.6 * fontsize)))
    ax.set_title("\n".join(textwrap.fill(line, width) or line for line in title.split("\n")), fontsize=fontsize,
                 **kwargs)


def _finish(fig, path: str | Path, note: str | None = None) -> Path:
    """Tight layout, an optional note below the axes (wrapped), save at 150 dpi, close. A figure too small for its
    decorations keeps its layout silently: the saved image is cropped to its contents (bbox_inches="tight") anyway."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tight layout not applied")
        fig.tight_layout()
    note = _wrapped(note)
    if note:
        n_lines = note.count("\n") + 1
        fig.subplots_adjust(bottom=fig.subplotpars.bottom + 0.05 * n_lines)
        fig.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=8, color="0.2")
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


# A CDF's line labels sit on a white patch: a curve passing under one does not cross the text.
LABEL_BOX = {"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85}


def _mark(ax, vlines: dict[str, float] | None, top: bool = True) -> None:
    """Dashed vertical lines, each labelled at the top of the axes, left of its line (or at the bottom, on a white
    patch: where a CDF's curve is low)."""
    for label, x in (vlines or {}).items():
        ax.axvline(x, color="0.35", linestyle="--", linewidth=1)
        ax.annotate(label, (x, 0.98 if top else 0.02), xycoords=("data", "axes fraction"), xytext=(-3, 0),
                    textcoords="offset points", rotation=90, ha="right", va="top" if top else "bottom", fontsize=8,
                    color="0.25", bbox=None if top else LABEL_BOX)  # fmt: skip


def plot_cdfs(
    series: dict[str, np.ndarray],
    path: str | Path,
    title: str,
    xlabel: str,
    vlines: dict[str, float] | None = None,
    note: str | None = None,
) -> Path:
    """Empirical CDFs, one step line per named series: F(x) = share of values <= x; dashed vertical lines."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    curves = []
    for name, v in series.items():
        v = np.sort(np.asarray(v, dtype=float)[np.isfinite(np.asarray(v, dtype=float))])
        if v.size:
            ax.step(np.concatenate([[v[0]], v]), np.arange(v.size + 1) / v.size, where="post", linewidth=1.6,
                    label=f"{name} (n={v.size})")  # fmt: skip
            curves.append(v)
    for label, x in (vlines or {}).items():  # each label where the curves are not: above them or below them
        height = max((np.searchsorted(v, x, side="right") / v.size for v in curves), default=0.0)
        _mark(ax, {label: x}, top=height < 0.5)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of values ≤ x")
    _title(ax, title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")
    return _finish(fig, path, note)


def plot_ranked_bars(
    labels: list[str],
    values: np.ndarray,
    path: str | Path,
    title: str,
    xlabel: str,
    errors: np.ndarray | None = None,
    groups: list[str] | None = None,
    group_colors: dict[str, str] | None = None,
    gap_after: int | None = None,
    note: str | None = None,
    vlines: dict[str, float] | None = None,
    value_format: str | None = None,
) -> Path:
    """Horizontal bars in the given order, first on top; `errors` as whiskers; `groups` colour the bars (legend
    below the axes; `group_colors` fixes a colour per group); `gap_after` k leaves a gap and a dotted line after
    the k-th bar (top / bottom lists); `vlines` dashed labelled levels (e.g. a published value); `value_format`
    (e.g. '{:.1f}%') writes each bar's value at its end, so that a bar of 0 still reads."""
    values = np.asarray(values, dtype=float)
    n = len(labels)
    y = np.arange(n, dtype=float)
    if gap_after is not None and 0 < gap_after < n:
        y[gap_after:] += 1.0
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = list(dict.fromkeys(groups)) if groups else []
    color_of = {g: (group_colors or {}).get(g, palette[k % len(palette)]) for k, g in enumerate(names)}
    colors = [color_of[g] for g in groups] if groups else palette[0]
    longest = max((len(s) for s in labels), default=4)
    fig, ax = plt.subplots(figsize=(6.4 + 0.05 * max(0, longest - 12), max(2.6, 0.22 * (y[-1] + 1 if n else 1) + 1.3)))
    ax.barh(y, values, color=colors, xerr=None if errors is None else np.asarray(errors, dtype=float),
            error_kw={"elinewidth": 0.8, "ecolor": "0.3", "capsize": 2})  # fmt: skip
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="0.2", linewidth=0.8)
    if gap_after is not None and 0 < gap_after < n:
        ax.axhline(gap_after, color="0.5", linestyle=":", linewidth=1)
    _mark(ax, vlines)
    if value_format:
        ax.margins(x=0.12)  # room for the labels right of the longest bar
        for yk, v in zip(y, values):
            ax.annotate(value_format.format(v), (max(v, 0.0), yk), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=8, color="0.15")  # fmt: skip
    if groups:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=color_of[g], label=g) for g in names], fontsize=8, loc="lower center",
                  bbox_to_anchor=(0.5, 1.0), ncol=len(names), frameon=False)  # fmt: skip
    ax.set_xlabel(xlabel)
    _title(ax, title, 11, pad=22 if groups else 6)
    ax.grid(axis="x", alpha=0.3)
    return _finish(fig, path, note)


def plot_by_bin(
    bins: list[str],
    series: dict[str, tuple[np.ndarray, np.ndarray | None]],
    path: str | Path,
    title: str,
    ylabel: str,
    counts: list[int] | None = None,
    reference: dict[str, tuple[str, float]] | None = None,
    note: str | None = None,
) -> Path:
    """Lines over ordered categories (score bins): name -> (mean per bin, std per bin or None, a band);
    `counts` go under the bin labels; `reference` marks published values: label -> (bin, value)."""
    x = np.arange(len(bins))
    fig, ax = plt.subplots(figsize=(max(6.4, 0.5 * len(bins) + 1.5), 3.8))  # narrow bins (bin_width 0.05): wider
    for k, (name, (mean, std)) in enumerate(series.items()):
        mean = np.asarray(mean, dtype=float)
        (line,) = ax.plot(x, mean, marker="osD^v<>"[k % 7], linestyle=("-", "--", "-.", ":")[k % 4], linewidth=1.6,
                          label=name)  # fmt: skip
        if std is not None:
            std = np.nan_to_num(np.asarray(std, dtype=float))
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.15, linewidth=0)
    for label, (b, value) in (reference or {}).items():
        if b in bins:
            ax.plot([bins.index(b)], [value], marker="*", markersize=11, color="0.2", linestyle="none")
            ax.annotate(label, (bins.index(b), value), xytext=(-6, 6), textcoords="offset points", fontsize=8,
                        ha="right")  # fmt: skip
    many = len(bins) > 5  # long interval labels would overlap: rotated, the count beside the interval
    ticks = bins if counts is None else [f"{b}{' ' if many else chr(10)}n={c}" for b, c in zip(bins, counts)]
    ax.set_xticks(x, ticks, fontsize=8)
    if many:
        plt.setp(ax.get_xticklabels(), rotation=60 if len(bins) > 10 else 35, ha="right", rotation_mode="anchor")
    ax.set_xlabel("score bin")
    ax.set_ylabel(ylabel)
    _title(ax, title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _finish(fig, path, note)


def plot_scatter(
    x: np.ndarray,
    y: np.ndarray,
    path: str | Path,
    title: str,
    xlabel: str,
    ylabel: str,
    labels: list[str] | None = None,
    annotate: list[int] | None = None,
    diagonal: bool = False,
    invert: bool = False,
    groups: list[str] | None = None,
    hlines: dict[str, float] | None = None,
    note: str | None = None,
) -> Path:
    """Points (x, y), coloured by `groups` (with a legend); `annotate` names the points at these indices with
    `labels`; `diagonal` draws y = x; `hlines` dashed labelled levels; `invert` puts rank 1 at the top left."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    fig, ax = plt.subplots(figsize=(5.6, 5.0) if diagonal else (6.4, 3.8))
    if groups is None:
        ax.scatter(x, y, s=14, alpha=0.6, linewidths=0)
    else:
        kinds = np.asarray(groups)
        for name in dict.fromkeys(groups):
            ax.scatter(x[kinds == name], y[kinds == name], s=14, alpha=0.6, linewidths=0, label=name)
        # outside the axes, right of them: a scatter has points wherever a legend inside could go
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    for label, level in (hlines or {}).items():
        ax.axhline(level, color="0.35", linestyle="--", linewidth=1)
        ax.annotate(label, (0.01, level), xycoords=("axes fraction", "data"), xytext=(0, 3), textcoords="offset points",
                    fontsize=8, color="0.25")  # fmt: skip
    if diagonal and x.size:
        lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
        ax.plot([lo, hi], [lo, hi], color="0.5", linestyle="--", linewidth=1)
    at: dict[tuple[float, float], list[str]] = {}  # points at the same place share one label
    for k in annotate or []:
        at.setdefault((float(x[k]), float(y[k])), []).append(labels[k])
    texts = [ax.annotate(", ".join(names), (px, py), xytext=(3, 3), textcoords="offset points", fontsize=7,
                         color="0.15", arrowprops={"arrowstyle": "-", "color": "0.6", "linewidth": 0.5})
             for (px, py), names in at.items()]  # fmt: skip
    if invert:
        ax.invert_xaxis()
        ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _title(ax, title)
    ax.grid(alpha=0.3)
    _spread_labels(fig, texts)
    return _finish(fig, path, note)


def _spread_labels(fig, texts: list, step: float = 2.0, passes: int = 200) -> None:
    """Move point labels (annotations in offset points) apart until no two overlap: each pass pushes the later of
    an overlapping pair down (and a little right) by `step` points; a thin line joins a moved label to its point."""
    if len(texts) < 2:
        return
    renderer = fig.canvas.get_renderer()
    for _ in range(passes):
        boxes = [t.get_window_extent(renderer).expanded(1.05, 1.15) for t in texts]
        moved = False
        for a in range(len(texts)):
            for b in range(a + 1, len(texts)):
                if boxes[a].overlaps(boxes[b]):
                    dx, dy = texts[b].xyann
                    texts[b].xyann = (dx + step / 4, dy - step)
                    boxes[b] = texts[b].get_window_extent(renderer).expanded(1.05, 1.15)
                    moved = True
        if not moved:
            return


def plot_paired_dots(
    labels: list[str],
    first: np.ndarray,
    second: np.ndarray,
    names: tuple[str, str],
    path: str | Path,
    title: str,
    xlabel: str,
    note: str | None = None,
) -> Path:
    """One row per label: two dots (first, second) joined by a line, in the given order (first row on top)."""
    first, second = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    y = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(6.4, max(2.6, 0.26 * len(labels) + 1.4)))
    ax.hlines(y, np.fmin(first, second), np.fmax(first, second), color="0.75", linewidth=1.5)
    ax.scatter(first, y, s=22, label=names[0], zorder=3)
    ax.scatter(second, y, s=22, label=names[1], zorder=3)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="0.2", linewidth=0.8)
    ax.set_xlabel(xlabel)
    _title(ax, title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _finish(fig, path, note)
