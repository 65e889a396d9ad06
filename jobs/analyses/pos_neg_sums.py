"""Fig 5: positive and negative attribution sums per pair (sql/pos_neg_sums.sql)."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import polars as pl

from .. import sqlrun
from .base import REPORT_SQL, Analysis, Context, Finding, Headline, needs_pairs
from .facts import (
    layer_label,
    model_label,
)
from .format import missing, num, pct, signed


def check_pos_neg_sums(ctx: Context) -> str | None:
    if reason := needs_pairs(ctx):
        return reason
    if not ctx.scalar("select count(positive_sum) from pairs"):
        return "the run's pairs have no positive_sum / negative_sum values"
    return None


def pos_neg_sums(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.filter(pl.col("score_bin") == "all").row(0, named=True)
    values = {k: row[k] for k in ("n_pairs", "share_positive_exceeds", "max_score", "mean_positive_sum",
                                  "mean_negative_sum", "mean_attribution_sum")}  # fmt: skip
    sums = (f"mean positive sum {num(row['mean_positive_sum'])}, mean negative sum {num(row['mean_negative_sum'])}, "
            f"mean total {num(row['mean_attribution_sum'])}")  # fmt: skip
    mean_sums = f"{signed(row['mean_positive_sum'])} / {signed(row['mean_negative_sum'])}"
    if row["max_score"] is None:
        return [Finding(f"Dot-product scores have no maximum, so no share is given (set --var max_score=X); {sums}.",
                        values, headline=Headline("mean positive / negative sum", mean_sums))]  # fmt: skip
    broken = reference_norms(ctx, row["max_score"]) if row["mode"] == "approx" else []
    if broken:  # the bound is shown not to hold: a share of sums above it says nothing
        return [Finding(f"Over {row['n_pairs']} pairs: {sums}.", values,
                        headline=Headline("mean positive / negative sum", mean_sums)), *broken]
    bound = "f(a, b) ≤ 1" if row["mode"] == "exact" else "f(a, b) + 1 with ideal references"
    return [Finding(
        f"The positive attributions alone exceed {num(row['max_score'], 0)} (the largest total, {bound}) in "
        f"{pct(row['share_positive_exceeds'])} of {row['n_pairs']} pairs ({sums}).", values,
        headline=Headline(f"pairs whose positive sum exceeds {num(row['max_score'], 0)}",
                          pct(row["share_positive_exceeds"])))]  # fmt: skip


def reference_norms(ctx: Context, max_score: float) -> list[Finding]:
    """Approximate mode: when ΣA converges above max_score on average (sql/report/reference_norms.sql), the bound
    does not hold: say so and why (the references' embedding norms); [] when it holds."""
    # the file's bound is pos_neg_sums' max_score (from the manifest when not set)
    unset = ctx.var("max_score", None) is None
    with ctx.variable("max_score", float(max_score)) if unset else nullcontext():
        row = sqlrun.run_file(ctx.con, REPORT_SQL / "reference_norms.sql").row(0, named=True)
    if not row["is_bound_exceeded"]:
        return []
    target, score, ratio = row["mean_target"], row["mean_score"], row["reference_norm_ratio"]
    why = ""
    if not missing(ratio):
        why = (f": the reference embeddings are {ratio:.1f}× as long as the sentences' (mean norm "
               f"{num(row['mean_reference_norm'])} vs {num(row['mean_embedding_norm'])}), so the reference term "
               f"f(r_a, r_b)·‖r_a‖‖r_b‖ / (‖a‖‖b‖) adds about {num(row['mean_target_minus_score'])} rather than 1")
    return [Finding(
        f"In this run ΣA converges to {num(target)} on average against a mean score of {num(score)}{why}; the bound "
        f"{num(max_score, 0)} of approximate mode does not hold for this model and layer, so the table's share of "
        f"positive sums above {num(max_score, 0)} (share_positive_exceeds, against max_score) measures against a bound "
        "ΣA itself passes, and no finding is made of it.",
        {"mean_target": target, "mean_score": score, "mean_embedding_norm": row["mean_embedding_norm"],
         "mean_reference_norm": row["mean_reference_norm"], "is_bound_exceeded": True},
        headline=Headline("ΣA converges to, on average (against the mean score)",
                          f"{num(target)} ({num(score)})"))]  # fmt: skip


def plot_pos_neg_sums(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_by_bin, plot_cdfs, plot_scatter

    max_score = df["max_score"][0]
    data = ctx.frame("select score, positive_sum, negative_sum from pairs")
    broken = max_score is not None and df["mode"][0] == "approx" and bool(reference_norms(ctx, max_score))
    # where the run shows the approximate-mode bound does not hold, no line is drawn for it
    lines = {f"max score {max_score:g}": max_score} if max_score is not None and not broken else None
    line = ("no line is drawn for the approximate-mode bound 2: this run's ΣA converges above it on average (see the "
            "findings)" if broken else "the dashed line is the largest possible total")  # fmt: skip
    n = data.height
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}, n = {n} pairs"
    plot_scatter(np.concatenate([data["score"].to_numpy()] * 2),
                 np.concatenate([data["positive_sum"].to_numpy(), data["negative_sum"].to_numpy()]),
                 ctx.out / "pos_neg_sums-scatter.png", f"Positive and negative attribution sums per pair\n{run}",
                 f"score f(a, b) ({ctx.facts['similarity']})", "sum of attributions",
                 groups=["positive sum"] * n + ["negative sum"] * n, hlines=lines)  # fmt: skip
    plot_cdfs({"positive sum": data["positive_sum"].to_numpy(), "|negative sum|": -data["negative_sum"].to_numpy()},
              ctx.out / "pos_neg_sums-cdf.png", f"Cumulative share of pairs by the size of each part\n{run}",
              "sum of attributions (absolute)", vlines=lines)  # fmt: skip
    bins = df.filter(pl.col("score_bin") != "all")
    plot_by_bin(bins["score_bin"].to_list(),
                {"mean positive sum": (bins["mean_positive_sum"].to_numpy(), None),
                 "mean negative sum": (bins["mean_negative_sum"].to_numpy(), None),
                 "mean total ΣA": (bins["mean_attribution_sum"].to_numpy(), None),
                 "mean score": (bins["mean_score"].to_numpy(), None)},
                ctx.out / "pos_neg_sums-bins.png", f"Attribution sums by score\n{run}", "sum of attributions",
                counts=bins["n_pairs"].to_list())  # fmt: skip
    return [
        ("pos_neg_sums-scatter.png", f"Each pair's positive and negative sum against its score; {line}."),
        ("pos_neg_sums-cdf.png", f"Cumulative share of pairs by positive sum and by |negative sum|; {line}."),
        ("pos_neg_sums-bins.png", "Means per score bin (the bins of the table)."),
    ]  # fmt: skip


ANALYSIS = Analysis("pos_neg_sums", "Positive and negative sums", "Fig 5", check_pos_neg_sums, pos_neg_sums,
                    plot_pos_neg_sums,
                    serve_page="/pairs?sort=positive", key_figure="pos_neg_sums-scatter.png")
