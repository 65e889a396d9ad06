"""Fig 6: the syntactic relations of the top word pairs (sql/syntactic_relations.sql)."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import paper, sqlfiles, sqlrun
from .base import TOP_K, Analysis, Context, Finding, Headline, needs_cells, needs_pairs
from .facts import (
    cite,
    layer_label,
    model_label,
    subset_label,
)
from .format import pct, plural

# the SQL file's defaults of these variables (declared there: jobs.sqlfiles.default)
TOP_SHARE = sqlfiles.default("syntactic_relations.sql", "top_share")


def check_syntactic_relations(ctx: Context) -> str | None:
    if reason := needs_pairs(ctx) or needs_cells(ctx):
        return reason
    if not sqlrun.has_table(ctx.run, "parses"):
        return f"the run has no parses table: run python -m jobs.parse --run {ctx.run}"
    return None


def _parser_label(ctx: Context) -> str:
    """The parser of the run's parses table as the subset names it ('spacy en_core_web_sm parses'), beside the
    paper's stanza (jobs.paper: Fig 6's subset)."""
    parses = ctx.facts.get("parses") or {}
    parser = (parses.get("parsers") or "unknown parser").strip()
    if ctx.var("parser", None):
        parser = f"{ctx.var('parser', None)} (--var parser)"
    return f"{parser} parses"


def syntactic_relations(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.row(0, named=True)
    same, mixed, unaligned = row["same_function_share"], row["mixed_share"], row["unaligned_share"]
    parsed = same / (same + mixed) if same + mixed else None
    top_share = ctx.var("top_share", TOP_SHARE)
    real = df.filter(~pl.col("relation_a").is_in(["unaligned", "unparsed"]),
                     ~pl.col("relation_b").is_in(["unaligned", "unparsed"]))  # fmt: skip
    # our setting as jobs.paper spells the paper's: the parser is part of the subset (the paper's: stanza)
    setting = (model_label(ctx.facts), layer_label(ctx.facts), f"{subset_label(ctx.facts)}, {_parser_label(ctx)}")
    out = [Finding(
        f"Of the top {100 * top_share:g}% word cells of each pair ({df['n'].sum()} cells), {pct(same)} join two words "
        f"with the same syntactic function, {pct(mixed)} two different functions, and {pct(unaligned)} a word the "
        f"parser did not align ({_parser_label(ctx)}).",
        {"n_cells": int(df["n"].sum()), "same_function_share": same, "mixed_share": mixed,
         "unaligned_share": unaligned, "same_share_of_parsed": parsed},
        headline=Headline(f"top {100 * top_share:g}% word cells joining the same syntactic function", pct(same)),
    )]  # fmt: skip
    if real.height:
        first = real.row(0, named=True)
        kind = "a same-function pair" if first["is_same_function"] else "a pair of two different functions"
        out.append(Finding(
            f"The most frequent relation pair of the top cells is {first['relation_a']}–{first['relation_b']} "
            f"({kind}, {pct(first['share'])} of the top cells); the {min(real.height, 5)} most frequent hold "
            f"{pct(real.head(5)['share'].sum())} of them.",
            {"relation_a": first["relation_a"], "relation_b": first["relation_b"], "share": first["share"],
             "is_same_function": bool(first["is_same_function"]), "top5_share": real.head(5)["share"].sum()},
            **cite("fig6_same_function", *setting, f"the most frequent relation pairs of the top {100 * top_share:g}% "
                   "cells"),
            headline=Headline("the most frequent relation pair of the top cells",
                              f"{first['relation_a']}–{first['relation_b']} ({pct(first['share'])})")))  # fmt: skip
        nsubj = real.filter(pl.col("relation_a") == "nsubj", pl.col("relation_b") == "nsubj")
        share = nsubj["share"][0] if nsubj.height else 0.0
        out.append(Finding(
            f"nsubj–nsubj holds {pct(share)} of the top cells.", {"nsubj_share": share},
            **cite("fig6_nsubj_share", *setting, f"share of the top {100 * top_share:g}% cells with relation pair "
                   "nsubj–nsubj"),
            headline=Headline("top cells with relation pair nsubj–nsubj", pct(share))))  # fmt: skip
    if parsed is not None:  # our summary (the paper gives no such split): over cells between two parsed words
        n_parsed = int(real["n"].sum())
        out.append(Finding(
            f"Of the {n_parsed} top cells between two parsed words, {pct(parsed)} join the same syntactic function "
            f"and {pct(1 - parsed)} two different ones (our summary; the paper gives no such split).",
            {"same_share_of_parsed": parsed, "mixed_share_of_parsed": 1 - parsed, "n_parsed_cells": n_parsed}))
    return out


def plot_syntactic_relations(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_ranked_bars

    top = df.head(TOP_K)
    groups = ["same function" if s else ("unaligned / unparsed" if {a, b} & {"unaligned", "unparsed"} else "mixed")
              for a, b, s in zip(top["relation_a"], top["relation_b"], top["is_same_function"])]  # fmt: skip
    labels = [a if a == b else f"{a} – {b}" for a, b in zip(top["relation_a"], top["relation_b"])]
    claim, nsubj = paper.get("fig6_same_function"), paper.get("fig6_nsubj_share")
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}, n = {plural(ctx.facts['n_pairs'], 'pair')}"
    plot_ranked_bars(labels, top["share"].to_numpy() * 100, ctx.out / "syntactic_relations.png",
                     f"Relations of the top word pairs ({top.height} most frequent of {df.height})\n{run}",
                     "share of the top cells (%)", groups=groups,
                     group_colors={"same function": "#1f77b4", "mixed": "#ff7f0e",
                                   "unaligned / unparsed": "#b0b0b0"},
                     note=(f"{int(df['n'].sum())} top cells, {_parser_label(ctx)}. Paper ({nsubj.section}, "
                           f"mpnet, stanza): {claim.text}; nsubj–nsubj ≈ {nsubj.text}"))  # fmt: skip
    figures = [("syntactic_relations.png", ("The most frequent relation pairs of the top word cells; a single name "
                "means the same relation on both sides. The paper's Fig 6 (stanza parses) finds same-function pairs "
                "the top contributors, nsubj–nsubj by far the most frequent at around 7% (its model not stated), "
                "which it calls not a large share of all top attributions."))]  # fmt: skip
    same, mixed = df["same_function_share"][0], df["mixed_share"][0]
    if same + mixed:
        n_parsed = int(df.filter(~pl.col("relation_a").is_in(["unaligned", "unparsed"]),
                                 ~pl.col("relation_b").is_in(["unaligned", "unparsed"]))["n"].sum())  # fmt: skip
        plot_ranked_bars(["same function", "mixed"], 100 * np.array([same, mixed]) / (same + mixed),
                         ctx.out / "syntactic_relations-split.png",
                         f"Top word cells between two parsed words: same function vs mixed\n{run}", "share (%)",
                         groups=["same function", "mixed"],
                         group_colors={"same function": "#1f77b4", "mixed": "#ff7f0e"},
                         note=f"n = {n_parsed} cells, {_parser_label(ctx)}; our summary: the paper gives no such "
                              "split", value_format="{:.1f}%")  # fmt: skip
        figures.append(("syntactic_relations-split.png", (
            "Our summary of the top cells whose two words both have a relation: same function on both sides vs two "
            "different functions. The paper states no such share (its Fig 6 ranks the relation pairs), so no paper "
            "value is drawn.")))  # fmt: skip
    return figures


ANALYSIS = Analysis("syntactic_relations", "Syntactic relations of the top word pairs", "Fig 6",
                    check_syntactic_relations, syntactic_relations, plot_syntactic_relations,
                    serve_page="/pairs?sort=sum", key_figure="syntactic_relations.png")
