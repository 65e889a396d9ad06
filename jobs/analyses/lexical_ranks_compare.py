"""Fig 10, Tables 3-4: do two runs rank the tokens alike (sql/lexical_ranks_compare.sql)."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import paper, sqlfiles
from .base import Analysis, Context, Finding, Headline, needs_cells, needs_two_runs
from .facts import (
    cite,
    layer_label,
    model_label,
    pair_model_label,
    paper_comparison,
    run_difference,
    two_layers,
    two_subsets,
)
from .format import num

# the SQL file's defaults of these variables (declared there: jobs.sqlfiles.default)
MIN_COUNT = sqlfiles.default("lexical_ranks_compare.sql", "min_count")
INCLUDE_SPECIAL = sqlfiles.default("lexical_ranks_compare.sql", "include_special")


def check_lexical_ranks_compare(ctx: Context) -> str | None:
    return needs_two_runs(ctx) or needs_cells(ctx, "same-token", both=True)


def empty_lexical_compare(df: pl.DataFrame, ctx: Context) -> str | None:
    if df.height:
        return None
    m = ctx.var("min_count", MIN_COUNT)
    return f"no token has at least {m} same-token cells in both runs (min_count; --var min_count=N lowers it)"


def lexical_ranks_compare(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    rho, n = df["spearman"][0], df["n_shared"][0]
    moved = df.with_columns(shift=(pl.col("shared_rank_1") - pl.col("shared_rank_2")).abs()).sort(
        "shift", descending=True).row(0, named=True)  # fmt: skip
    one, two = run_difference(ctx.facts, ctx.facts2)
    unlike = paper_comparison(ctx.facts, ctx.facts2)
    out = [Finding(
        f"The lexical ranks of run ({one}) and run2 ({two}) correlate with Spearman ρ = {num(rho)} over {n} shared "
        f"tokens; '{moved['token']}' "
        f"moves most (shared rank {num(moved['shared_rank_1'], 1)} vs {num(moved['shared_rank_2'], 1)}).",
        {"spearman": rho, "n_shared": n, "most_moved": moved["token"]},
        **({"paper_key": "fig10_rank_spearman", "differs": [f"comparison: {unlike}"], "like_for_like": False}
           if unlike else cite("fig10_rank_spearman", pair_model_label(ctx.facts, ctx.facts2), two_layers(ctx),
                               two_subsets(ctx), _lexical_metric(ctx))),
        headline=Headline(f"Spearman ρ of the two runs' lexical ranks ({n} shared tokens)", num(rho)),
    )]  # fmt: skip
    if unlike:
        fig10 = paper.get("fig10_rank_spearman")
        out.append(Finding(
            f"The paper's ρ = {fig10.text} ({fig10.figure}: {fig10.model}, layer {fig10.layer}, {fig10.subset}) is "
            f"not set beside this: {unlike}, another kind of comparison.", {"paper_comparison": unlike}))
    return out


def _lexical_metric(ctx: Context) -> str:
    """The lexical-rank comparison as jobs.paper spells the paper's."""
    special = "ranked" if ctx.var("include_special", INCLUDE_SPECIAL) is not False else "left out"
    return (f"Spearman of lexical ranks, tokens with ≥ {ctx.var('min_count', MIN_COUNT)} same-token cells, special "
            f"tokens {special}")


def plot_lexical_ranks_compare(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_scatter

    x, y = df["shared_rank_1"].to_numpy(), df["shared_rank_2"].to_numpy()
    shift = np.abs(x - y)
    annotate = sorted(set(np.argsort(x)[:5]) | set(np.argsort(-x)[:3]) | set(np.argsort(-shift)[:4]))
    fig10 = paper.get("fig10_rank_spearman")
    unlike = paper_comparison(ctx.facts, ctx.facts2)
    note = f"n = {len(x)} shared tokens"
    if not unlike:
        note += (f"\npaper ({fig10.figure}): ρ = {fig10.text}, {fig10.model}, layer {fig10.layer}, QQP\n"
                 f"({'like-for-like' if _lexical_like(ctx) else 'not like-for-like'}: see the finding)")
    axis = {k: f"rank in {k} ({model_label(f)}, layer {layer_label(f)})" for k, f in (("run", ctx.facts),
                                                                                      ("run2", ctx.facts2))}
    plot_scatter(x, y, ctx.out / "lexical_ranks_compare.png",
                 f"Lexical ranks of the two runs (Spearman ρ = {num(df['spearman'][0])})", axis["run"], axis["run2"],
                 labels=df["token"].to_list(), annotate=[int(k) for k in annotate], diagonal=True, invert=True,
                 note=note)  # fmt: skip
    paper_part = (f"the paper's ρ (Fig 10) is not drawn: {unlike}" if unlike else
                  "the paper's ρ (Fig 10) is written below the axes")
    return [("lexical_ranks_compare.png", ("Rank of each shared token in both runs (1 = largest mean self-attribution, "
             f"top left); the dashed line is equal rank; {paper_part}."))]


def _lexical_like(ctx: Context) -> bool:
    return not paper.differences(paper.get("fig10_rank_spearman"), {
        "model": pair_model_label(ctx.facts, ctx.facts2), "layer": two_layers(ctx),
        "subset": two_subsets(ctx), "metric": _lexical_metric(ctx)})


ANALYSIS = Analysis("lexical_ranks_compare", "Lexical ranks of two runs", "Fig 10, Tables 3–4",
                    check_lexical_ranks_compare, lexical_ranks_compare, plot_lexical_ranks_compare,
                    empty_lexical_compare,
                    serve_page="/tokens", key_figure="lexical_ranks_compare.png")
