"""Table 1: Spearman of the model's scores against the gold labels (sql/table1.sql)."""

from __future__ import annotations

import polars as pl

from .base import Analysis, Context, Finding, Headline, needs_pairs
from .facts import (
    cite,
    model_label,
    model_variant,
    subset_label,
)
from .format import missing, num, plural


def check_table1(ctx: Context) -> str | None:
    return needs_pairs(ctx) or (
        None if ctx.facts["n_labelled"] else "the run's pairs have no gold labels (its dataset has none)"
    )


def _table1_key(ctx: Context) -> str:
    """The paper's Table 1 row for this run's model: its variant (shelf, tuned, exact, orig); a dot-product run is
    set against Orig (which the paper scores with cosine, like the others)."""
    if ctx.facts["similarity"] == "dot":
        return "table1_orig"
    return f"table1_{model_variant(ctx.facts)[1]}"


def table1(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.row(0, named=True)
    values = {k: row[k] for k in ("n_pairs", "spearman_x100", "spearman", "pearson")}
    if missing(row["spearman"]):
        return [Finding(f"Score vs gold label: Spearman is undefined over {plural(row['n_pairs'], 'labelled pair')} "
                        "(fewer than two, or constant scores or labels).", values)]  # fmt: skip
    return [Finding(
        f"The model's similarity ranks the gold labels with Spearman × 100 = {num(row['spearman_x100'], 1)} over "
        f"{row['n_pairs']} labelled pairs (Pearson {num(row['pearson'])}).",
        values, **cite(_table1_key(ctx), model_label(ctx.facts), "-", subset_label(ctx.facts, row["n_pairs"]),
                       f"Spearman × 100, {ctx.facts['similarity']}"),
        headline=Headline("Spearman × 100 of the scores against the gold labels", num(row["spearman_x100"], 1)),
    )]  # fmt: skip


def plot_table1(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_scatter

    data = ctx.frame("select label, score from pairs where label is not null and score is not null")
    plot_scatter(data["label"].to_numpy(), data["score"].to_numpy(), ctx.out / "table1.png",
                 f"Score vs gold label (Spearman × 100 = {num(df['spearman_x100'][0], 1)})\n"
                 f"{model_label(ctx.facts)}, n = {data.height} pairs", "gold label",
                 f"predicted similarity ({ctx.facts['similarity']})")  # fmt: skip
    return [("table1.png", "Predicted similarity f(a, b) against the gold label, one point per pair.")]


ANALYSIS = Analysis("table1", "Scores vs gold labels", "Table 1", check_table1, table1, plot_table1,
                    serve_page="/pairs?sort=score", key_figure="table1.png")
