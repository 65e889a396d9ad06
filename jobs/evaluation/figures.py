"""What an evaluation writes: its tables (CSV, Parquet, Markdown) and Fig 2-5 as PNG, the paper's values beside ours."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xsbert_core.training import base_name

from .. import paper, sqlfiles
from .agreement import COMPARISONS

if TYPE_CHECKING:
    import polars as pl

# Fig 3/4 points: label -> (layers below mpnet's last, value), drawn as many layers below our last.
_FIG3, _FIG4_L11, _FIG4_L8 = (paper.get(k) for k in ("fig3_spearman_top", "fig4_jaccard_top10_l11",
                                                     "fig4_jaccard_top10_l8"))  # fmt: skip
_FIG2_NEAR, _FIG2_BELOW = paper.get("fig2_ref_sim_near_zero"), paper.get("fig2_ref_term_below")
# Fig 2's thresholds as the report's analysis has them: sql/reference_terms.sql's defaults (jobs.sqlfiles.default)
NEAR_ZERO = sqlfiles.default("reference_terms.sql", "near_zero")
TERM_THRESHOLD = sqlfiles.default("reference_terms.sql", "term_threshold")
PAPER_FIG3 = {f"paper (§4.4): mpnet exact vs tuned, L11 (\"layer eleven\"), s>0.75: {_FIG3.value:.2f}":
              (0, _FIG3.value)}
PAPER_FIG4 = {f"paper (§4.4): mpnet, L11, top-10, s>0.5: {_FIG4_L11.value:.2f}": (0, _FIG4_L11.value),
              f"paper (§4.4): mpnet, L8 (3 below L11), top-10, s>0.5: {_FIG4_L8.value:.2f}": (3, _FIG4_L8.value)}
# The paper's Fig 4 values are for pairs of mean score s > 0.5 (paper.FIG4_SCORE_ABOVE): ours are drawn on the same
# subset.


def write_table(df: pl.DataFrame, out: Path, name: str, title: str, floats: int = 4) -> str:
    """<name>.csv, <name>.parquet and a Markdown table (returned and written to <name>.md)."""
    df.write_csv(out / f"{name}.csv")
    df.write_parquet(out / f"{name}.parquet")
    cols = df.columns

    def fmt(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.{floats}f}"
        return str(v)

    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.iter_rows()]
    text = "\n".join(lines) + "\n"
    (out / f"{name}.md").write_text(text, encoding="utf-8")
    return text


def pairs_columns(run: str, columns: list[str], pairs_of: str) -> dict[str, np.ndarray]:
    """The pairs table's `columns` of `run`, on the pairs `pairs_of` (another run) holds too."""
    from ..sqlrun import connect

    con = connect(run, variables={"pairs_of": pairs_of})  # the runs checked and read as xsbert sql reads them
    try:
        rows = con.sql(f"select {', '.join(columns)} from pairs where pair_id in "
                       "(select pair_id from read_parquet(getvariable('pairs_of') || '/pairs/*.parquet'))").fetchnumpy()
    finally:
        con.close()
    return {c: np.asarray(rows[c], dtype=float) for c in columns}


def approx_bound_holds(positive_sum: np.ndarray, negative_sum: np.ndarray, bound: float = 2.0) -> bool:
    """Whether the approximate-mode bound f(a, b) + 1 ≤ 2 holds on average: mean ΣA (positive + negative sums, what
    the attributions converge to) ≤ `bound`. Where it does not (the references' embeddings longer than the texts',
    docs/ANALYSES.md pos_neg_sums.sql), Fig 5 draws no line at 2 and gives no share above it."""
    return bool(np.mean(np.asarray(positive_sum) + np.asarray(negative_sum)) <= bound)


def _counts(values: list[int]) -> str:
    """'300', or '188–196' where the comparisons' counts differ."""
    return str(values[0]) if len(values) == 1 else f"{min(values)}–{max(values)}"


def pooled_above(bins: pl.DataFrame, low: float, layers: list[int]) -> dict[str, np.ndarray]:
    """Per layer, the Jaccard means and sample stds of the pairs with mean score above `low`, pooled exactly from
    agreement.sql's bins above it (jobs.analyses.agreement.pool: the bins' counts, means and stds give the pooled ones)."""
    import polars as pl

    from ..analyses.agreement import pool as _pool

    out: dict[str, list] = {"n_pairs": [], "jaccard_top3_mean": [], "jaccard_top3_std": [], "jaccard_top10_mean": [],
                            "jaccard_top10_std": []}  # fmt: skip
    for layer in layers:
        rows = bins.filter(pl.col("layer") == layer, pl.col("score_bin") != "all",
                           pl.col("bin_low") >= low - 1e-9).to_dicts()  # fmt: skip
        out["n_pairs"].append(sum(r["n_pairs"] or 0 for r in rows))
        for stat in ("jaccard_top3", "jaccard_top10"):
            mean, std, _ = _pool(rows, "n_pairs", stat)
            out[f"{stat}_mean"].append(np.nan if mean is None else mean)
            out[f"{stat}_std"].append(np.nan if std is None else std)
    return {k: (np.asarray(v) if k != "n_pairs" else v) for k, v in out.items()}


def plot_all(out: Path, summary: dict[str, Any]) -> list[Path]:
    """Fig 2-5 as PNG from what the stages wrote (agreement.parquet, the runs of summary['figures'])."""
    import polars as pl

    from xsbert_core.plots import plot_by_layer, plot_histograms

    written: list[Path] = []
    if (out / "agreement.parquet").exists():
        ag = pl.read_parquet(out / "agreement.parquet").sort("layer")
        noise: dict[str, pl.DataFrame] = {}
        noise_bins: dict[str, pl.DataFrame] = {}
        if "comparison" in ag.columns:  # the noise floor's comparisons drawn beside exact vs approximate
            for label in ag["comparison"].unique(maintain_order=True).to_list():
                if label != COMPARISONS[0][0]:
                    noise_bins[label] = ag.filter(pl.col("comparison") == label, ~pl.col("include_special"))
                    noise[label] = noise_bins[label].filter(pl.col("score_bin") == "all")
            ag = ag.filter(pl.col("comparison") == COMPARISONS[0][0])
        every = None
        if "include_special" in ag.columns:  # content tokens drawn, every cell's Spearman beside them
            every = ag.filter(pl.col("include_special"), pl.col("score_bin") == "all")
            ag = ag.filter(~pl.col("include_special"))
        overall = ag.filter(pl.col("score_bin") == "all")
        layers = overall["layer"].to_list()
        top = ag.filter(pl.col("bin_low") == paper.TOP_SCORE)
        n_layers = int(summary.get("n_layers") or (max(layers) + 1))
        model = base_name(str(summary.get("base") or "model"))
        span = (f"layers {min(layers)}–{max(layers)} of {n_layers}" if len(layers) > 1
                else f"layer {layers[0]} of {n_layers}")  # fmt: skip
        n_all = sorted(set(overall["n_pairs"].to_list()))
        n_top = sorted(set(top["n_pairs"].to_list()))

        def below_last(points: dict[str, tuple[int, float]]) -> dict[str, tuple[float, float]]:
            return {label: (n_layers - 1 - below, value) for label, (below, value) in points.items()}

        series = {"Spearman, all pairs": (overall["spearman_mean"].to_numpy(), overall["spearman_std"].to_numpy()),
                  "Pearson, all pairs": (overall["pearson_mean"].to_numpy(), None)}  # fmt: skip
        if top.height == len(layers):
            series["Spearman, mean score in (0.75, 1]"] = (top["spearman_mean"].to_numpy(), None)
        if every is not None and every.height == len(layers):
            series["Spearman, all pairs, every cell (special tokens in)"] = (every["spearman_mean"].to_numpy(), None)
        # a noise-floor series is drawn where it has every layer of the exact-vs-approximate one
        noise = {label: df for label, df in noise.items() if df["layer"].to_list() == layers}
        also = "\ndashed: one recipe trained with two seeds (the noise floor)" if noise else ""
        for label, df in noise.items():
            series[f"Spearman, all pairs, {label} (noise floor)"] = (df["spearman_mean"].to_numpy(), None)
        tokens = "content tokens" if "include_special" in ag.columns else "token cells"
        written.append(plot_by_layer(layers, series, out / "fig3_agreement_correlation.png",
                                     f"{model}, exact vs tuned (approximate), {span}\nrank correlation per pair{also}",
                                     f"correlation of token cells ({tokens})",
                                     reference=below_last(PAPER_FIG3), bounds=(-1.0, 1.0),
                                     dashed=tuple(k for k in series if "noise floor" in k),
                                     note=f"n = {_counts(n_all)} pairs per layer; mean score in (0.75, 1]: "
                                          f"{_counts(n_top)}; the paper's star: mpnet, another model and depth"))
        # fmt: skip
        # Fig 4 on the paper's subset, s > 0.5 (pooled exactly from the score bins above 0.5)
        above = {label: pooled_above(df_all, paper.FIG4_SCORE_ABOVE, layers) for label, df_all in
                 [("exact vs tuned", ag)] + [(lab, frame) for lab, frame in noise_bins.items()]}  # fmt: skip
        main = above["exact vs tuned"]
        jac = {"top-3 Jaccard, s > 0.5": (main["jaccard_top3_mean"], main["jaccard_top3_std"]),
               "top-10 Jaccard, s > 0.5": (main["jaccard_top10_mean"], main["jaccard_top10_std"])}
        for label in noise:
            if label in above:
                jac[f"top-3, {label} (noise floor)"] = (above[label]["jaccard_top3_mean"], None)
                jac[f"top-10, {label} (noise floor)"] = (above[label]["jaccard_top10_mean"], None)
        n_above = ", ".join(f"{label} {_counts(sorted(set(v['n_pairs'])))}" for label, v in above.items())
        written.append(plot_by_layer(layers, jac, out / "fig4_agreement_jaccard.png",
                                     f"{model}, exact vs tuned (approximate), {span}\ntop-k token pairs shared, "
                                     f"pairs of mean score s > 0.5{also}",
                                     f"Jaccard index ({tokens}, top-k by |value|)",
                                     reference=below_last(PAPER_FIG4), bounds=(0.0, 1.0),
                                     dashed=tuple(k for k in jac if "noise floor" in k),
                                     note=f"n (s > 0.5) per layer: {n_above}"))  # fmt: skip
    fig = summary.get("figures")
    if fig:
        shelf = pairs_columns(fig["runs"]["shelf"], ["ref_sim_a", "ref_sim_b", "ref_term", "positive_sum",
                                                      "negative_sum"], fig["runs"]["exact"])  # fmt: skip
        exact = pairs_columns(fig["runs"]["exact"], ["positive_sum", "negative_sum"], fig["runs"]["shelf"])
        sims = np.concatenate([shelf["ref_sim_a"], shelf["ref_sim_b"]])
        near = float(np.mean(np.abs(sims) <= NEAR_ZERO))
        below = float(np.mean(shelf["ref_term"] < TERM_THRESHOLD))
        model_name, n_fig = base_name(str(summary.get("base") or "model")), len(shelf["ref_term"])
        written.append(plot_histograms(
            {"f(a, r_b) and f(b, r_a)": sims, "f(r_a, r_b)": shelf["ref_term"]},
            out / "fig2_reference_terms.png",
            f"{model_name} shelf: reference terms (no layer: forward quantities), n = {n_fig} pairs", "cosine",
            vlines={f"-{NEAR_ZERO:g}": -NEAR_ZERO, f"+{NEAR_ZERO:g}": NEAR_ZERO, f"{TERM_THRESHOLD:g}": TERM_THRESHOLD},
            note=f"{near:.1%} of reference similarities within ±{NEAR_ZERO:g} (paper {_FIG2_NEAR.text})\n"
                 f"{below:.1%} of reference terms < {TERM_THRESHOLD:g} (paper {_FIG2_BELOW.text})"))  # fmt: skip
        # 2 bounds the approximate sums only where ΣA converges below it: where the run's mean ΣA is above 2 (the
        # references' norms, docs/ANALYSES.md pos_neg_sums.sql), no "max approx" line is drawn
        mean_target = float(np.mean(shelf["positive_sum"] + shelf["negative_sum"]))
        bound_holds = approx_bound_holds(shelf["positive_sum"], shelf["negative_sum"])
        lines = {"max exact (1)": 1.0} | ({"max approx (2)": 2.0} if bound_holds else {})
        shelf_share = (f"shelf {np.mean(shelf['positive_sum'] > 2):.1%} (> 2)" if bound_holds else
                       f"shelf: no share (mean ΣA {mean_target:.2f} > 2: 2 is no bound for this model)")
        written.append(plot_histograms(
            {"shelf (approx): positive sum": shelf["positive_sum"], "exact: positive sum": exact["positive_sum"],
             "shelf (approx): negative sum": shelf["negative_sum"], "exact: negative sum": exact["negative_sum"]},
            out / "fig5_pos_neg_sums.png",
            f"{model_name}, shelf and exact, layer {fig['layer']}: positive and negative sums (n = {n_fig} pairs)",
            "sum of positive / negative cells", vlines=lines,
            note=f"positive sum > max score: {shelf_share}, exact {np.mean(exact['positive_sum'] > 1):.1%} (> 1)"))
        # fmt: skip
    return written
