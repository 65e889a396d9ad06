"""Fig 10, Tables 3-4: which tokens attribute most to themselves (sql/lexical_ranks.sql)."""

from __future__ import annotations

import polars as pl

from .. import sqlfiles
from .base import TOP_K, Analysis, Context, Finding, Headline, needs_cells, needs_pairs
from .format import signed

# the SQL file's defaults of these variables (declared there: jobs.sqlfiles.default)
MIN_COUNT = sqlfiles.default("lexical_ranks.sql", "min_count")


def check_lexical_ranks(ctx: Context) -> str | None:
    return needs_pairs(ctx) or needs_cells(ctx, "same-token")


def empty_lexical(df: pl.DataFrame, ctx: Context) -> str | None:
    if df.height:
        return None
    m = ctx.var("min_count", MIN_COUNT)
    return f"no token has at least {m} same-token cells (min_count); lower it, e.g. --var min_count={max(1, m // 5)}"


def _placement(rank: int, total: int) -> str:
    third = rank / total
    return "in the top third" if third <= 1 / 3 else ("in the bottom third" if third > 2 / 3 else "in the middle third")


def lexical_ranks(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    k, m = df.height, ctx.var("min_count", MIN_COUNT)
    first, last = df.row(0, named=True), df.row(k - 1, named=True)
    out = [Finding(
        f"Of {k} tokens with at least {m} same-token cells (our reading of the paper's 'words appearing 30 and more "
        f"times': same-token cells, not occurrences), '{first['token']}' attributes most to itself (mean "
        f"{signed(first['mean'])}) and '{last['token']}' least ({signed(last['mean'])}).",
        {"n_tokens": k, "min_count": m, "top": first["token"], "top_mean": first["mean"], "bottom": last["token"],
         "bottom_mean": last["mean"]},
        headline=Headline(f"the token attributing most to itself (of {k})",
                          f"'{first['token']}' {signed(first['mean'])}"),
    )]  # fmt: skip
    nots = df.filter(pl.col("token").str.to_lowercase().str.strip_chars_start("Ġ▁") == "not")
    if nots.height:
        r = nots.row(0, named=True)
        out.append(Finding(
            f"'{r['token']}' ranks {r['rank']} of {k} tokens (mean {signed(r['mean'])}), {_placement(r['rank'], k)}.",
            {"token": r["token"], "rank": r["rank"], "n_tokens": k, "mean": r["mean"]},
            headline=Headline(f"rank of '{r['token']}' by self-attribution", f"{r['rank']} of {k}")))  # fmt: skip
    return out


def plot_lexical_ranks(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_ranked_bars

    k = min(TOP_K, df.height // 2) if df.height > 2 * TOP_K else df.height
    shown = pl.concat([df.head(k), df.tail(k)]) if df.height > 2 * TOP_K else df
    labels = [f"{t} ({r})" for t, r in zip(shown["token"], shown["rank"])]
    title = (f"Top and bottom {k} of {df.height} tokens by same-token attribution" if df.height > 2 * TOP_K
             else f"{df.height} tokens by same-token attribution")  # fmt: skip
    plot_ranked_bars(labels, shown["mean"].to_numpy(), ctx.out / "lexical_ranks.png", title,
                     "mean attribution of the token to itself (± std)", errors=shown["std"].fill_null(0).to_numpy(),
                     gap_after=k if df.height > 2 * TOP_K else None)  # fmt: skip
    return [("lexical_ranks.png", ("Mean same-token attribution (token_a = token_b) per token, with its rank; "
             "whiskers: one standard deviation."))]  # fmt: skip


ANALYSIS = Analysis("lexical_ranks", "Lexical ranks", "Fig 10, Tables 3–4", check_lexical_ranks, lexical_ranks,
                    plot_lexical_ranks, empty_lexical,
                    serve_page="/tokens", key_figure="lexical_ranks.png")
