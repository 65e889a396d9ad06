"""Fig 8's count, each sign clear of its completeness error (sql/negation_signs.sql): the share of negative 'not'
attributions over the pairs whose sign is clear at some N, with an exact binomial and a cluster bootstrap interval,
and how many pairs are not counted."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import paper
from .base import Analysis, Context, Finding
from .facts import (
    cite,
    layer_label,
    model_label,
    model_variant,
    subset_label,
)
from .format import pct, plural
from .negation import check_negation, empty_negation  # the same pairs as Fig 8's


def _steps(df: pl.DataFrame) -> list[int]:
    """Every N a pair was attributed at, over the runs read."""
    return sorted({int(n) for steps in df["steps"].to_list() if steps for n in steps if n is not None})


def _is_paper_definition(df: pl.DataFrame) -> bool:
    return df["definition"][0] == "paper"


def _interval(low: float | None, high: float | None) -> str:
    return "n/a" if low is None or high is None else f"{100 * low:.1f}–{100 * high:.1f}%"


def negation_signs(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.row(0, named=True)
    n, clear, unclear, k = row["n_pairs"], row["n_clear"], row["n_not_clear"], row["n_negative"]
    steps = _steps(df)
    runs = 1 + len(ctx.var("other_runs", None) or [])
    at = f"N = {', '.join(map(str, steps))}" if steps else "no recorded N"
    what = paper.NOT_TOTAL if _is_paper_definition(df) else "the not-word's word cells"
    hint = ("" if not unclear else
            " (the rows with is_clear false: attribute those pairs again at a larger --steps and add the runs with "
            "--var other_runs=DIR,...)")  # fmt: skip
    out = [Finding(
        f"The sign of the 'not' attribution ({what}) is clear of the completeness error (|error| < "
        f"{row['margin']:g} × |not|) in {clear} of the {plural(n, 'pair')} that differ by a standalone 'not', read "
        f"from {plural(runs, 'run')} at {at}, each at the smallest clear N; {unclear} "
        f"{'is' if unclear == 1 else 'are'} not counted{hint}.",
        {"n_pairs": n, "n_clear": clear, "n_not_clear": unclear, "steps": steps, "runs": runs,
         "margin": row["margin"], "not_clear": df.filter(~pl.col("is_clear"))["pair_id"].to_list()},
    )]  # fmt: skip
    if not clear:
        return out
    key = "fig8_not_negative_exact" if model_variant(ctx.facts)[1] == "exact" else "fig8_not_negative_shelf"
    setting = (model_label(ctx.facts), layer_label(ctx.facts), subset_label(ctx.facts))
    out.append(Finding(
        f"Of the {clear} clear signs, {k} {'is' if k == 1 else 'are'} negative ({pct(row['share_negative'])}; exact "
        f"binomial 95% interval {_interval(row['ci_low'], row['ci_high'])}; bootstrap 95% interval over "
        f"{row['n_clusters']} clusters of pairs from one source {_interval(row['boot_low'], row['boot_high'])}).",
        {"n_negative": k, "share_negative": row["share_negative"], "ci95": [row["ci_low"], row["ci_high"]],
         "bootstrap_ci95": [row["boot_low"], row["boot_high"]], "n_clusters": row["n_clusters"],
         "resamples": row["resamples"]},
        **cite(key, *setting, f"share of negative 'not' attributions ({what}), signs clear of the completeness "
               "error"),
    ))  # fmt: skip
    if _is_paper_definition(df):
        relative = "fig8_not_relative_exact" if model_variant(ctx.facts)[1] == "exact" else "fig8_not_relative_shelf"
        out.append(Finding(
            f"Over the clear pairs, the 90th percentile of |not| relative to the prediction is "
            f"{row['p90_abs_relative']:.3f} with f(a, b) as the denominator, {row['p90_abs_relative_plus_one']:.3f} "
            f"with f(a, b) + 1 (Eq. 4's sum) and {row['p90_abs_relative_to_sum']:.3f} with ΣA (the paper's is "
            "f(a, b), §3.1).",
            {"p90_abs_relative": row["p90_abs_relative"], "p90_abs_relative_plus_one": row["p90_abs_relative_plus_one"],
             "p90_abs_relative_to_sum": row["p90_abs_relative_to_sum"]},
            **cite(relative, *setting, f"90th percentile of |not / f(a, b)| ({paper.NOT_TOTAL}), signs clear of the "
                   "completeness error"),
        ))  # fmt: skip
    if row["n_unstable"]:
        out.append(Finding(f"The sign differs between the runs' N in {plural(row['n_unstable'], 'pair')}.",
                           {"n_unstable": row["n_unstable"]}))
    return out


def plot_negation_signs(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_ranked_bars, plot_scatter

    row = df.row(0, named=True)
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}"
    figures = []
    if row["n_clear"]:
        shelf, exact = paper.get("fig8_not_negative_shelf"), paper.get("fig8_not_negative_exact")
        share = row["share_negative"]
        whiskers = np.array([[share - row["ci_low"], 0.0, 0.0], [row["ci_high"] - share, 0.0, 0.0]]) * 100
        plot_ranked_bars([f"this run: {row['n_negative']} of {row['n_clear']} clear signs",
                          f"paper: {shelf.model}", f"paper: {exact.model}"],
                         100 * np.array([share, shelf.value, exact.value]), ctx.out / "negation_signs-share.png",
                         f"Negative 'not' attributions, signs clear of the error\n{run}", "share of pairs (%)",
                         errors=whiskers, groups=["this run", "paper (Fig 8)", "paper (Fig 8)"],
                         group_colors={"this run": "#1f77b4", "paper (Fig 8)": "#9a9a9a"},
                         note=(f"this run: {subset_label(ctx.facts)}; {row['n_not_clear']} pairs not clear, not "
                               f"counted; whisker: exact binomial 95% interval\npaper: {shelf.subset}, layer "
                               "assumed; its count says nothing of the error"),
                         value_format="{:.1f}%")  # fmt: skip
        figures.append(("negation_signs-share.png", "Share of negative 'not' attributions over the pairs whose sign "
                        "is clear of the completeness error, with its exact binomial 95% interval, beside the paper's "
                        "two values (Fig 8; another subset, its layer our assumption)."))  # fmt: skip
    # every pair: its value (at the clear N, else at its largest N) against its error relative to it
    last = [vals[-1] if vals else None for vals in df["not_attributions"].to_list()]
    last_err = [errs[-1] if errs else None for errs in df["completeness_errors"].to_list()]
    value = [c if c is not None else v for c, v in zip(df["not_attribution"].to_list(), last)]
    error = [c if c is not None else e for c, e in zip(df["completeness_error"].to_list(), last_err)]
    keep = [k for k, (v, e) in enumerate(zip(value, error)) if v is not None and e is not None and v != 0]
    if keep:
        ratio = [np.log10(max(abs(error[k]) / abs(value[k]), 1e-12)) for k in keep]
        kinds = ["not clear" if not df["is_clear"][k] else ("negative" if value[k] < 0 else "positive")
                 for k in keep]  # fmt: skip
        plot_scatter(np.array([value[k] for k in keep]), np.array(ratio), ctx.out / "negation_signs-error.png",
                     f"'not' attribution and its pair's completeness error\n{run}, n = {len(keep)} pairs",
                     "'not' attribution (at the clear N, else the largest)", "log10(|error| / |not|)",
                     groups=kinds, hlines={f"margin {row['margin']:g}": float(np.log10(row["margin"]))})  # fmt: skip
        figures.append(("negation_signs-error.png", "Each pair's 'not' attribution against its completeness error "
                        "relative to it (log10); below the dashed line the sign is clear and counted."))
    return figures


ANALYSIS = Analysis("negation_signs", "Negation: signs clear of the error", "Fig 8", check_negation,
                    negation_signs, plot_negation_signs, empty_negation, serve_page="/pairs?token=not")
