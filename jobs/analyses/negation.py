"""Fig 8: how a standalone *not* is attributed (sql/negation.sql)."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import paper
from .base import Analysis, Context, Finding, Headline, needs_cells, needs_pairs
from .facts import (
    cite,
    layer_label,
    model_label,
    model_variant,
    subset_label,
)
from .format import num, pct, signed


def check_negation(ctx: Context) -> str | None:
    return needs_pairs(ctx) or needs_cells(ctx)


def empty_negation(df: pl.DataFrame, ctx: Context) -> str | None:
    if df.height:
        return None
    return ("no pair differs by a standalone 'not' on one side (python -m jobs.attribute --dataset negation makes "
            "such pairs)")  # fmt: skip


def _negation_paper(df: pl.DataFrame) -> bool:
    """Whether negation.sql ran with the paper's definition (the default): the total attribution to the not token,
    relative to the prediction f(a, b); else ours (--var definition=word_cells)."""
    return "definition" not in df.columns or df["definition"][0] == "paper"


def _negation_words(df: pl.DataFrame) -> tuple[str, str, str]:
    """(what the not attribution is, the relative size's symbol, its denominator) for the definition used."""
    if _negation_paper(df):
        return paper.NOT_TOTAL, "not / f(a, b)", "the prediction f(a, b), the score"
    return "its word cells against every word of the other side", "not / ΣW", "ΣW, the pair's word cells"


def negation(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    share, p90, n = df["share_negative"][0], df["p90_abs_relative"][0], df.height
    mean_relative = df["relative"].mean()
    what, symbol, denominator = _negation_words(df)
    setting = (model_label(ctx.facts), layer_label(ctx.facts), subset_label(ctx.facts))
    paper_def = _negation_paper(df)
    kind = model_variant(ctx.facts)[1] == "exact"
    out = [
        Finding(f"The 'not' attribution ({what}) is negative in {pct(share)} of the {n} pairs that differ by a "
                "standalone 'not'.", {"share_negative": share, "n_pairs": n, "n_negative": int(df["is_negative"].sum()),
                                      "definition": "paper" if paper_def else "word_cells"},
                **cite(_negation_key(ctx), *setting, f"share of negative 'not' attributions "
                       f"({paper.NOT_TOTAL if paper_def else 'word cells'})"),
                headline=Headline("pairs whose 'not' attribution is negative",
                                  f"{pct(share)} ({int(df['is_negative'].sum())} of {n})")),
        Finding(f"In 90% of the pairs |{symbol}| ({denominator}) is at most {num(p90, 3)}; on average the 'not' "
                f"contributes {signed(df['not_attribution'].mean())} (relative size {signed(mean_relative)}).",
                {"p90_abs_relative": p90, "mean_relative": mean_relative,
                 "mean_not_attribution": df["not_attribution"].mean()},
                **cite("fig8_not_relative_exact" if kind else "fig8_not_relative_shelf", *setting,
                       f"90th percentile of |not / f(a, b)| ({paper.NOT_TOTAL})" if paper_def else
                       "90th percentile of |not / ΣW| (word cells)"),
                headline=Headline(f"90th percentile of |{symbol}|", num(p90, 3))),
    ]  # fmt: skip
    if paper_def:  # the paper's "of the prediction" is f(a, b) (§3.1); two other denominators beside it, ours
        out.append(Finding(
            f"The 90th percentile of |not| relative to the prediction is {num(p90, 3)} with f(a, b) as the "
            f"denominator, {num(df['p90_abs_relative_plus_one'][0], 3)} with f(a, b) + 1 (Eq. 4's sum) and "
            f"{num(df['p90_abs_relative_to_sum'][0], 3)} with ΣA (the paper's is f(a, b), §3.1). Signs clear of the "
            "completeness error: the negation_signs section.",
            {"p90_abs_relative_plus_one": df["p90_abs_relative_plus_one"][0],
             "p90_abs_relative_to_sum": df["p90_abs_relative_to_sum"][0]}))  # fmt: skip
    return out


def _negation_key(ctx: Context) -> str:
    """The paper's Fig 8 value for this run's kind of model: exact for an exact model, else off the shelf."""
    return "fig8_not_negative_exact" if model_variant(ctx.facts)[1] == "exact" else "fig8_not_negative_shelf"


def plot_negation(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_cdfs, plot_histograms, plot_ranked_bars

    shelf, exact = paper.get("fig8_not_negative_shelf"), paper.get("fig8_not_negative_exact")
    ours = f"this run: {model_label(ctx.facts)}, layer {layer_label(ctx.facts)}"
    n = df.height
    what, symbol, denominator = _negation_words(df)
    plot_ranked_bars([ours, f"paper: {shelf.model}, layer {shelf.layer.split(' (')[0]} (assumed)",
                      f"paper: {exact.model}, layer {exact.layer.split(' (')[0]} (assumed)"],
                     100 * np.array([df["share_negative"][0], shelf.value, exact.value]),
                     ctx.out / "negation-share.png", f"Share of negative 'not' attributions (this run: n = {n} pairs)",
                     "share of pairs (%)",
                     groups=["this run", "paper (Fig 8)", "paper (Fig 8)"],
                     group_colors={"this run": "#1f77b4", "paper (Fig 8)": "#9a9a9a"},
                     note=f"this run: {subset_label(ctx.facts)}, {what}\npaper: {shelf.subset}, {paper.NOT_TOTAL}",
                     value_format="{:.1f}%")  # fmt: skip
    p90 = df["p90_abs_relative"][0]
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}, n = {n} pairs"
    plot_histograms({symbol: df["relative"].to_numpy()}, ctx.out / "negation-hist.png",
                    f"Relative size of the 'not' attribution\n{run}", f"{symbol} ({denominator})", vlines={"0": 0.0})
    marks = {f"90th percentile {p90:.3f}": p90}
    if _negation_paper(df):
        key = "fig8_not_relative_exact" if model_variant(ctx.facts)[1] == "exact" else "fig8_not_relative_shelf"
        ref = paper.get(key)
        marks[f"paper ({ref.model.split()[-1]} mpnet): {ref.value:g}"] = ref.value
    plot_cdfs({f"|{symbol}|": np.abs(df["relative"].to_numpy())}, ctx.out / "negation-cdf.png",
              f"Cumulative share of pairs by |{symbol}|\n{run}", f"|{symbol}|", vlines=marks)  # fmt: skip
    return [("negation-share.png", ("Share of pairs whose 'not' attribution is negative, this run beside the paper's "
             "two values (Fig 8, all-mpnet-base-v2; its layer is our assumption); the settings differ where the labels "
             "do.")),
            ("negation-hist.png", (f"The 'not' attribution ({what}) relative to {denominator}"
             + (" — the paper's definition (Fig 8)." if _negation_paper(df) else
                " — our definition (--var definition=word_cells); the paper's is relative to f(a, b)."))),
            ("negation-cdf.png", "Cumulative share of pairs by the absolute relative size"
             + ("; the paper's 90% bound for its model is marked (another model and subset)." if
                _negation_paper(df) else "."))]  # fmt: skip


ANALYSIS = Analysis("negation", "Negation", "Fig 8", check_negation, negation, plot_negation, empty_negation,
                    serve_page="/pairs?token=not", key_figure="negation-hist.png")
