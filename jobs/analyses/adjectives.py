"""Table 2, Fig 9: adjective synonyms vs opposites (sql/adjectives.sql)."""

from __future__ import annotations

from typing import Any

import polars as pl

from .base import Analysis, Context, Finding, Headline, needs_cells, needs_pairs
from .facts import (
    cite,
    layer_label,
    model_label,
)
from .format import pct, plural, signed


def check_adjectives(ctx: Context) -> str | None:
    if reason := needs_pairs(ctx) or needs_cells(ctx):
        return reason
    missing = {"triplet", "kind"} - ctx.columns("pairs")
    if missing:
        return (f"pairs has no {'/'.join(sorted(missing))} column: these are adjective-triplet pairs of "
                "python -m jobs.attribute --dataset adjectives")  # fmt: skip
    if not ctx.scalar("select count(*) from pairs where triplet is not null"):
        return "no pair has a triplet (python -m jobs.attribute --dataset adjectives makes them)"
    return None


def _adjective_means(df: pl.DataFrame) -> pl.DataFrame:
    """Per triplet: the mean synonym and opposite cell over templates (rows without a cell left out)."""
    return (
        df.filter(pl.col("attribution").is_not_null())
        .group_by("triplet")
        .agg(synonym=pl.col("attribution").filter(pl.col("kind") == "synonym").mean(),
             opposite=pl.col("attribution").filter(pl.col("kind") == "opposite").mean())
        .drop_nulls()
        .sort("synonym", descending=True)
    )


# Our set of the paper's adjective pairs (Fig 9): two per triplet (anchor–synonym, anchor–opposite) in one template,
# 46 pairs. The paper does not state its template (App. C's example is "This house is beautiful."): this one for
# every triplet is our assumption. --dataset adjectives adds three more templates (184 pairs), our extension.
PAPER_TEMPLATE = "This house is X."


def _distinct(df: pl.DataFrame) -> dict[str, Any]:
    """Over the distinct sentence pairs (is_repeat false; Table 2 has four opposite pairs twice): how many opposite
    cells are negative, with the exact binomial 95% interval, and a one-sided rank-sum test of synonym > opposite."""
    from scipy import stats

    rows = df.filter(pl.col("attribution").is_not_null())
    if "is_repeat" in rows.columns:
        rows = rows.filter(~pl.col("is_repeat"))
    syn, opp = (rows.filter(pl.col("kind") == k)["attribution"].to_numpy() for k in ("synonym", "opposite"))
    negative = int((opp < 0).sum())
    ci = stats.binomtest(negative, len(opp)).proportion_ci(method="exact") if len(opp) else None
    test = stats.mannwhitneyu(syn, opp, alternative="greater") if len(syn) and len(opp) else None
    return {"n_distinct_synonym": len(syn), "n_distinct_opposite": len(opp), "n_negative_opposite": negative,
            "negative_opposite_ci95": [ci.low, ci.high] if ci else None,
            "rank_sum_p": float(test.pvalue) if test else None}  # fmt: skip


def _adjective_summary(df: pl.DataFrame) -> dict[str, Any]:
    cells = df.filter(pl.col("attribution").is_not_null())
    syn, opp = (cells.filter(pl.col("kind") == k)["attribution"] for k in ("synonym", "opposite"))
    per = _adjective_means(df)
    return {"mean_synonym": syn.mean(), "mean_opposite": opp.mean(), "n_synonym": syn.len(), "n_opposite": opp.len(),
            "n_triplets": per.height, "n_synonym_larger": int((per["synonym"] > per["opposite"]).sum()),
            "n_without_cell": df.height - cells.height}  # fmt: skip


def adjectives(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    out = []
    own = df.filter(pl.col("template") == PAPER_TEMPLATE) if "template" in df.columns else df.head(0)
    if own.height:  # our set of the paper's first: the default comparison
        v, d = _adjective_summary(own), _distinct(own)
        ci = d["negative_opposite_ci95"]
        test = "" if d["rank_sum_p"] is None else (
            f"; synonyms above opposites by a one-sided rank-sum test over the distinct pairs, p = {d['rank_sum_p']:.1g}")
        out.append(Finding(
            f"Our set of the paper's (“{PAPER_TEMPLATE}”, two pairs per triplet, {own.height} pairs; the template is "
            f"our assumption): the adjective cell averages {signed(v['mean_synonym'])} for synonyms and "
            f"{signed(v['mean_opposite'])} for opposites; the synonym's is larger in {v['n_synonym_larger']} of "
            f"{v['n_triplets']} triplets; {d['n_negative_opposite']} of the {d['n_distinct_opposite']} distinct "
            f"opposite sentence pairs are negative"
            + ("" if ci is None else f" (exact 95% interval {pct(ci[0])}–{pct(ci[1])})") + test + ".",
            {f"paper_set_{k}": x for k, x in (v | d).items()} | {"paper_set_n_pairs": own.height},
            **cite("fig9_opposites_lower", model_label(ctx.facts), layer_label(ctx.facts),
                   f"Table 2's 23 triplets, two pairs each in {PAPER_TEMPLATE} ({own.height} pairs)",
                   "the attribution of the adjective pair (token to word by averaging)"),
            headline=Headline(f"triplets whose synonym cell is larger than the opposite's (“{PAPER_TEMPLATE}”)",
                              f"{v['n_synonym_larger']} of {v['n_triplets']}")))  # fmt: skip
    values = _adjective_summary(df)
    n_templates = df["template"].n_unique() if "template" in df.columns else 1
    label = (f"Our extension, all {n_templates} templates pooled ({df.height} pairs)" if own.height and
             n_templates > 1 else f"Over all {df.height} pairs")  # fmt: skip
    if not own.height or n_templates > 1:
        out.append(Finding(
            f"{label}: the adjective cell averages {signed(values['mean_synonym'])} for synonyms and "
            f"{signed(values['mean_opposite'])} for opposites ({values['n_synonym']} and {values['n_opposite']} "
            f"pairs); the synonym's (mean over templates) is larger in {values['n_synonym_larger']} of "
            f"{values['n_triplets']} triplets.", values,
            headline=Headline(f"triplets whose synonym cell is larger than the opposite's ({df.height} pairs)",
                              f"{values['n_synonym_larger']} of {values['n_triplets']}")))  # fmt: skip
    if values["n_without_cell"]:
        out.append(Finding(f"{values['n_without_cell']} adjective pairs have no single adjective cell (the texts "
                           "differ in more than one word, or the cell was pruned by --min-abs).",
                           {"n_without_cell": values["n_without_cell"]}))  # fmt: skip
    return out


def plot_adjectives(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_histograms, plot_paired_dots

    own = df.filter(pl.col("template") == PAPER_TEMPLATE) if "template" in df.columns else df.head(0)
    shown = own if own.height else df
    which = (f"the paper's set, “{PAPER_TEMPLATE}”" if own.height else "all templates")
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}"
    cells = shown.filter(pl.col("attribution").is_not_null())
    plot_histograms({k: cells.filter(pl.col("kind") == k)["attribution"].to_numpy() for k in ("synonym", "opposite")},
                    ctx.out / "adjectives-hist.png",
                    f"Attribution of the adjective pair's cell\n{run}, {which}, n = {cells.height} pairs",
                    "word-cell attribution", bins=24, vlines={"0": 0.0})  # fmt: skip
    per = _adjective_means(df)
    n_templates = df["template"].n_unique() if "template" in df.columns else 1
    plot_paired_dots(per["triplet"].to_list(), per["synonym"].to_numpy(), per["opposite"].to_numpy(),
                     ("anchor–synonym", "anchor–opposite"), ctx.out / "adjectives-triplets.png",
                     f"Adjective cell per triplet, mean over {plural(n_templates, 'template')}\n{run}, "
                     f"n = {df.height} pairs", "word-cell attribution")  # fmt: skip
    figures = [("adjectives-hist.png", "Attribution of the adjective cell in anchor–synonym vs anchor–opposite "
                f"pairs: {which} ({cells.height} pairs)."),
               ("adjectives-triplets.png", "Per triplet (anchor/synonym/opposite), the mean cell over the templates"
                + (" (our extension: the paper uses one template)." if n_templates > 1 else "."))]  # fmt: skip
    return figures


ANALYSIS = Analysis("adjectives", "Adjective synonyms vs opposites", "Table 2, Fig 9", check_adjectives, adjectives,
                    plot_adjectives,
                    serve_page="/pairs?sort=score", key_figure="adjectives-hist.png")
