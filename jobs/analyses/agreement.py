"""Fig 3/4: agreement of two runs' cells over the same pairs, by score bin (sql/agreement.sql)."""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from .. import paper, sqlfiles, sqlrun
from .base import REPORT_SQL, Analysis, Context, Finding, Headline, needs_cells, needs_two_runs
from .facts import (
    cite,
    layer_label,
    pair_model_label,
    paper_comparison,
    run_difference,
    subset_label,
    two_layers,
)
from .format import missing, num, plural

# the SQL file's defaults of these variables (declared there: jobs.sqlfiles.default)
BIN_WIDTH = sqlfiles.default("agreement.sql", "bin_width")


def check_agreement(ctx: Context) -> str | None:
    if reason := needs_two_runs(ctx) or needs_cells(ctx, both=True):
        return reason
    check = sqlrun.run_file(ctx.con, REPORT_SQL / "agreement_check.sql").row(0, named=True)
    shared, same_texts, differ = (check[k] for k in ("n_shared_pairs", "n_same_texts", "n_retokenized_sentences"))
    if not shared:
        return "the two runs share no pair_id: agreement compares the same pairs attributed twice"
    if not same_texts:
        return (f"the {plural(shared, 'pair_id')} the two runs share hold different texts in each: agreement "
                "compares the same pairs attributed twice")  # fmt: skip
    if differ:
        return (f"the two runs tokenize {differ} shared sentences differently (different tokenizers): their cells "
                "do not correspond")  # fmt: skip
    return None


def empty_agreement(df: pl.DataFrame, ctx: Context) -> str | None:
    total = df.filter(pl.col("score_bin") == "all")
    if total.height and total["n_pairs"][0]:
        return None
    return "the two runs share no cell (pair_id, i, j)"


def is_bin_edge(x: float, bin_width: float) -> bool:
    """Whether x is a boundary of the score bins of width `bin_width` (multiples of it, as in the sql/ files)."""
    k = x / bin_width
    return abs(k - round(k)) < 1e-9


def pool(rows: list[dict[str, Any]], n_key: str, stat: str) -> tuple[float | None, float | None, int]:
    """Mean and sample std of a per-pair statistic over several bins, from each bin's count, mean and sample std:
    M = sum n_i m_i / N; s^2 = (sum (n_i - 1) s_i^2 + sum n_i (m_i - M)^2) / (N - 1) — the same as over the pairs."""
    parts = [(r[n_key], r[f"{stat}_mean"], r[f"{stat}_std"]) for r in rows if r[n_key] and not missing(r[f"{stat}_mean"])]
    n = sum(k for k, _, _ in parts)
    if not n:
        return None, None, 0
    mean = sum(k * m for k, m, _ in parts) / n
    if n < 2:
        return mean, None, n
    within = sum((k - 1) * (0.0 if missing(sd) else sd) ** 2 for k, _, sd in parts)
    between = sum(k * (m - mean) ** 2 for k, m, _ in parts)
    return mean, math.sqrt((within + between) / (n - 1)), n


def above(df: pl.DataFrame, low: float, ctx: Context) -> dict[str, Any] | None:
    """The agreement of the pairs with mean score s > low, pooled from agreement.sql's bins above `low` (exact:
    the bins' counts, means and standard deviations determine the pooled ones); None when `low` is not a bin edge at
    the run's bin_width (then no set of bins is s > low), {'n_pairs': 0, ...} when no pair is above it."""
    if not is_bin_edge(low, float(ctx.var("bin_width", BIN_WIDTH))):
        return None
    rows = df.filter(pl.col("score_bin") != "all", pl.col("bin_low") >= low - 1e-9).to_dicts()
    out: dict[str, Any] = {"n_pairs": sum(r["n_pairs"] or 0 for r in rows),
                           "n_correlated": sum(r["n_correlated"] or 0 for r in rows)}  # fmt: skip
    for stat in ("spearman", "pearson"):
        out[f"{stat}_mean"], out[f"{stat}_std"], _ = pool(rows, "n_correlated", stat)
    for stat in ("jaccard_top3", "jaccard_top10"):
        out[f"{stat}_mean"], out[f"{stat}_std"], _ = pool(rows, "n_pairs", stat)
    return out


def agreement_tokens(df: pl.DataFrame) -> str:
    """Which token cells agreement.sql compared (its include_special column), as jobs.paper spells the paper's
    ('content tokens')."""
    return "all tokens" if df["include_special"][0] else "content tokens"


def _correlated(row: dict[str, Any]) -> str:
    """What the correlations are over when some of the row's pairs have none (agreement.sql: null, not counted in
    n_correlated): '' when all have one."""
    n, k = row["n_pairs"], row["n_correlated"]
    if k == n:
        return ""
    if k == 0:
        return " (none has a correlation: each shares one cell or has constant values)"
    return f" (over the {plural(k, 'pair')} with a correlation; {n - k} of {n} share one cell or have constant values)"


def every_cell_agreement(ctx: Context) -> dict[str, Any] | None:
    """agreement.sql's 'all' row with include_special = true (every cell), the figure beside the content one; the
    connection's variables are left as they were."""
    with ctx.variable("include_special", True):
        df = sqlrun.run_file(ctx.con, sqlfiles.SQL_DIR / "agreement.sql")
    rows = df.filter(pl.col("score_bin") == "all")
    return rows.row(0, named=True) if rows.height else None


def _every_cell_reading(content: dict[str, Any], every: dict[str, Any]) -> str:
    """How the every-cell Spearman compares with the content one, as the numbers shown say it."""
    a, b = content["spearman_mean"], every["spearman_mean"]
    if missing(a) or missing(b) or num(a) == num(b):
        return ""
    return (": higher than over content tokens (the special tokens' cells tie, e.g. exactly 0 in both runs at "
            "shallow layers, and ties lift Spearman)" if b > a else ": lower than over content tokens")


def agreement(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.filter(pl.col("score_bin") == "all").row(0, named=True)
    keys = ("n_pairs", "n_correlated", "spearman_mean", "spearman_std", "pearson_mean", "jaccard_top3_mean",
            "jaccard_top10_mean")  # fmt: skip
    one, two = run_difference(ctx.facts, ctx.facts2)
    tokens = agreement_tokens(df)
    model = pair_model_label(ctx.facts, ctx.facts2)
    layer = layer_label(ctx.facts) if layer_label(ctx.facts) == layer_label(ctx.facts2) else (
        f"{layer_label(ctx.facts)} vs {layer_label(ctx.facts2)}")  # fmt: skip
    jaccard = "fig4_jaccard_top10_l8" if layer == paper.get("fig4_jaccard_top10_l8").layer else "fig4_jaccard_top10_l11"
    spread = "" if missing(row["spearman_std"]) else f" ± {num(row['spearman_std'])}"
    over = _correlated(row)
    level = df["level"][0]
    cells = "word matrices" if level == "word" else f"token matrices ({tokens})"
    unlike = paper_comparison(ctx.facts, ctx.facts2)
    out = [Finding(
        f"Over {row['n_pairs']} shared pairs the {cells} of run ({one}) and run2 ({two}) agree with Spearman "
        f"{num(row['spearman_mean'])}{spread}, Pearson {num(row['pearson_mean'])}{over}, and their "
        f"top-10 cells overlap with Jaccard {num(row['jaccard_top10_mean'])} (top-3: {num(row['jaccard_top3_mean'])}).",
        {k: row[k] for k in keys},
        headline=Headline(f"Spearman of the two runs' {cells}, mean per pair, all {row['n_pairs']} pairs",
                          f"{num(row['spearman_mean'])}{spread}"),
    )]  # fmt: skip
    if level == "token" and tokens == "content tokens":
        every = every_cell_agreement(ctx)
        if every is not None:
            out.append(Finding(
                f"Over every cell (special tokens' rows and columns included) the same pairs read Spearman "
                f"{num(every['spearman_mean'])}, top-10 Jaccard {num(every['jaccard_top10_mean'])} (top-3: "
                f"{num(every['jaccard_top3_mean'])}){_every_cell_reading(row, every)}.",
                {f"every_cell_{k}": every[k] for k in keys}))  # fmt: skip
    bin_width = float(ctx.var("bin_width", BIN_WIDTH))
    for low, key, what in ((paper.FIG4_SCORE_ABOVE, jaccard, "jaccard"), (paper.TOP_SCORE, "fig3_spearman_top",
                                                                          "spearman")):
        part = above(df, low, ctx)
        if part is None:
            out.append(Finding(
                f"The pairs with mean score above {low:g} (the paper's subset for {paper.get(key).figure}) are not a "
                f"set of bins at bin_width = {bin_width:g}: no figure for them (--var bin_width={BIN_WIDTH:g} gives "
                "one).",
                {"bin_width": bin_width, "score_above": low}))  # fmt: skip
            continue
        if not part["n_pairs"]:
            continue
        subset = subset_label(ctx.facts, row["n_pairs"], f"s > {low:g}")
        values = {k: part[k] for k in keys} | {"score_above": low}
        if what == "jaccard":
            metric = f"top-10 Jaccard by |value|, {tokens}"
            text = (f"Among the {plural(part['n_pairs'], 'pair')} with mean score above {low:g} the top-10 cells "
                    f"overlap with Jaccard {num(part['jaccard_top10_mean'])} "
                    f"(top-3: {num(part['jaccard_top3_mean'])}).")
            headline = Headline(f"top-10 Jaccard, pairs of mean score above {low:g}", num(part["jaccard_top10_mean"]))
        else:
            spread = "" if missing(part["spearman_std"]) else f" ± {num(part['spearman_std'])}"
            metric = f"Spearman per pair, {tokens}"
            text = (f"Among the {plural(part['n_pairs'], 'pair')} with mean score above {low:g} the Spearman agreement "
                    f"is {num(part['spearman_mean'])}{spread}{_correlated(part)}.")
            headline = Headline(f"Spearman per pair, pairs of mean score above {low:g}",
                                f"{num(part['spearman_mean'])}{spread}")
        # another kind of comparison than the paper's: its number is named, not set beside ours (the study table)
        other = {"paper_key": key, "differs": [f"comparison: {unlike}"], "like_for_like": False}
        out.append(Finding(text, values, **(other if unlike else cite(key, model, layer, subset, metric)),
                           headline=headline))
    if unlike:
        out.append(Finding(
            f"The paper's Fig 3/4 numbers ({paper.get('fig3_spearman_top').model}, one layer at a time) are not set "
            f"beside these: {unlike}, so the comparison is not like for like in kind.", {"paper_comparison": unlike}))
    return out


def plot_agreement(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_by_bin

    bins = df.filter(pl.col("score_bin") != "all", pl.col("n_pairs") > 0)
    # The paper's s > 0.75 value goes on a bin only when one bin is exactly s > 0.75 of cosine scores, (0.75, 1.0].
    fig3 = paper.get("fig3_spearman_top")
    last = bins.filter((pl.col("bin_low") - paper.TOP_SCORE).abs() < 1e-9, (pl.col("bin_high") - 1.0).abs() < 1e-9)
    top_bin = last["score_bin"][0] if last.height else None
    unlike = paper_comparison(ctx.facts, ctx.facts2)
    reference = ({f"paper {fig3.value:.2f} (mpnet exact vs tuned, L11; not like for like)": (top_bin, fig3.value)}
                 if top_bin and not unlike else None)  # fmt: skip
    series = {name: (bins[f"{col}_mean"].to_numpy(), bins[f"{col}_std"].to_numpy())
              for name, col in (("Spearman", "spearman"), ("Pearson", "pearson"), ("top-3 Jaccard", "jaccard_top3"),
                                ("top-10 Jaccard", "jaccard_top10"))}  # fmt: skip
    one, two = run_difference(ctx.facts, ctx.facts2)
    plot_by_bin(bins["score_bin"].to_list(), series, ctx.out / "agreement.png",
                f"Agreement of run ({one}) and run2 ({two})\n{pair_model_label(ctx.facts, ctx.facts2)}, layer "
                f"{two_layers(ctx)}", "agreement (mean; shaded ± 1 std)",
                counts=bins["n_pairs"].to_list(), reference=reference,
                note=f"n = {int(bins['n_pairs'].sum())} pairs in all")  # fmt: skip
    if unlike:
        star = f"the paper's Fig 3 value is not drawn: {unlike}, not the paper's exact-vs-approximate comparison"
    elif reference:
        star = (f"the star is the paper's Spearman for s > 0.75 ({fig3.model}, layer {fig3.layer}), drawn at the "
                f"{top_bin} bin; not like for like (model and layer differ, see the findings)")
    else:
        star = "the paper's s > 0.75 is not one bin at this bin_width, so its value is not drawn"
    return [("agreement.png", f"Per-pair agreement of run and run2, mean ± std per bin of the pair's mean score; {star}.")]


ANALYSIS = Analysis("agreement", "Agreement of two runs", "Fig 3/4", check_agreement, agreement, plot_agreement,
                    empty_agreement,
                    serve_page="/pairs?sort=score", key_figure="agreement.png")
