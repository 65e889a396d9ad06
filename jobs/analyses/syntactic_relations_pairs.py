"""Fig 6's shares with intervals (sql/syntactic_relations_pairs.sql): nsubj–nsubj and same-function pairs over all top
cells and over those between two parsed words, each with a bootstrap interval over clusters of pairs."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import paper, sqlfiles
from .base import Analysis, Context, Finding
from .facts import (
    cite,
    layer_label,
    model_label,
    subset_label,
)
from .format import pct
from .syntactic_relations import _parser_label, check_syntactic_relations

# The shares the file gives, in the order the report shows them.
SHARES = {
    "nsubj_share": "nsubj–nsubj, of all top cells",
    "nsubj_share_of_parsed": "nsubj–nsubj, of the top cells between parsed words",
    "same_function_share": "same function, of all top cells",
    "same_share_of_parsed": "same function, of the top cells between parsed words",
    "unaligned_share": "a word unaligned or unparsed, of all top cells",
}


# the SQL file's defaults of these variables (declared there: jobs.sqlfiles.default)
TOP_SHARE = sqlfiles.default("syntactic_relations_pairs.sql", "top_share")


def empty_syntactic_relations_pairs(df: pl.DataFrame, ctx: Context) -> str | None:
    return None if df.height else "no pair has a top word cell (the run has no word cells)"


def _with_interval(row: dict, share: str) -> str:
    low, high = row[f"{share}_low"], row[f"{share}_high"]
    interval = "" if low is None or high is None else f" ({pct(low)}–{pct(high)})"
    return f"{pct(row[share])}{interval}"


def _clusters(row: dict) -> str:
    what = "clusters of pairs that share a sentence" if row["cluster_by"] == "sentence" else "pairs"
    return f"{row['n_clusters']} {what}, {row['n_pairs']} pairs, {row['resamples']} resamples"


def syntactic_relations_pairs(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.row(0, named=True)
    top_share = ctx.var("top_share", TOP_SHARE)
    setting = (model_label(ctx.facts), layer_label(ctx.facts), f"{subset_label(ctx.facts)}, {_parser_label(ctx)}")
    values = {k: row[k] for k in SHARES} | {f"{k}_ci95": [row[f"{k}_low"], row[f"{k}_high"]] for k in SHARES}
    return [
        Finding(
            f"nsubj–nsubj holds {_with_interval(row, 'nsubj_share')} of all top {100 * top_share:g}% word cells and "
            f"{_with_interval(row, 'nsubj_share_of_parsed')} of those between two parsed words (95% bootstrap "
            f"intervals over {_clusters(row)}).",
            {k: values[k] for k in values if k.startswith("nsubj")} | {"n_pairs": row["n_pairs"],
                                                                        "n_clusters": row["n_clusters"]},
            **cite("fig6_nsubj_share", *setting, f"share of the top {100 * top_share:g}% cells with relation pair "
                   "nsubj–nsubj (of all top cells; of the parsed ones beside it)"),
        ),
        Finding(
            f"Same-function pairs hold {_with_interval(row, 'same_function_share')} of all top cells and "
            f"{_with_interval(row, 'same_share_of_parsed')} of those between two parsed words; "
            f"{_with_interval(row, 'unaligned_share')} of the top cells have a word the parser did not align or "
            f"parse ({_parser_label(ctx)}).",
            {k: values[k] for k in values if not k.startswith("nsubj")},
        ),
    ]  # fmt: skip


def plot_syntactic_relations_pairs(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_ranked_bars

    row = df.row(0, named=True)
    names = [k for k in SHARES if row[k] is not None]
    values = 100 * np.array([row[k] for k in names])
    low = np.array([row[f"{k}_low"] if row[f"{k}_low"] is not None else row[k] for k in names]) * 100
    high = np.array([row[f"{k}_high"] if row[f"{k}_high"] is not None else row[k] for k in names]) * 100
    nsubj = paper.get("fig6_nsubj_share")
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}, n = {row['n_pairs']} pairs"
    plot_ranked_bars([SHARES[k] for k in names], values, ctx.out / "syntactic_relations_pairs.png",
                     f"Shares of the top word cells, with 95% bootstrap intervals\n{run}", "share (%)",
                     errors=np.vstack([values - low, high - values]),
                     groups=["nsubj–nsubj" if k.startswith("nsubj") else ("unaligned" if k.startswith("unaligned")
                                                                          else "same function") for k in names],
                     vlines={f"paper: nsubj–nsubj around {nsubj.text} (its model and denominator not stated)":
                             100 * nsubj.value},
                     note=f"{_parser_label(ctx)}; intervals over {_clusters(row)}",
                     value_format="{:.1f}%")  # fmt: skip
    return [("syntactic_relations_pairs.png", "The shares of the top word cells over the run, each with its 95% "
             "bootstrap interval over clusters of pairs; the dashed line is the paper's nsubj–nsubj share (Fig 6: "
             "stanza parses, its model and denominator not stated, its layer our assumption).")]


ANALYSIS = Analysis("syntactic_relations_pairs", "Syntactic relations: shares with intervals", "Fig 6",
                    check_syntactic_relations, syntactic_relations_pairs, plot_syntactic_relations_pairs,
                    empty_syntactic_relations_pairs, serve_page="/pairs?sort=sum")
