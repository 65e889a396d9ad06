"""Heatmaps of a few real pairs of the run (xsbert_core.plots.plot_attributions): the report's examples section."""

from __future__ import annotations

import numpy as np
import polars as pl

from .base import Context, Finding, Section, first_row, quote
from .format import num

# Example heatmaps: pairs whose sides have at most this many word tokens are preferred (readable labels).
EXAMPLE_MAX_TOKENS = 24


def _example_pairs(ctx: Context) -> list[tuple[str, str]]:
    """(pair_id, why) of a few pairs: a typical one (the median score: the study page shows it), the highest and
    lowest score, the most negative cell, a negation pair, an adjective synonym and opposite pair; short pairs
    (readable labels) first."""
    picked: list[tuple[str, str]] = []

    def add(pid: str | None, why: str) -> None:
        if pid is not None and pid not in [p for p, _ in picked]:
            picked.append((pid, why))

    stored = "coalesce(n_cells, 1) > 0"  # pairs whose cells were all pruned (--min-abs) show nothing
    short = f"coalesce(greatest(n_tokens_a, n_tokens_b), 0) <= {EXAMPLE_MAX_TOKENS + 2} and {stored}"
    for where in (short, stored):  # the pair whose score is nearest the run's median
        pid = ctx.scalar(f"""
            select pair_id from pairs where {where} and score is not null
            order by abs(score - (select median(score) from pairs where {where})), pair_id limit 1""")  # fmt: skip
        if pid is not None:
            add(pid, "a typical pair (the median score)")
            break
    for order, why in (("desc", "highest score"), ("asc", "lowest score")):
        pid = ctx.scalar(f"select pair_id from pairs where {short} order by score {order}, pair_id limit 1")
        add(pid or ctx.scalar(f"select pair_id from pairs where {stored} order by score {order}, pair_id limit 1"), why)
    pid = ctx.scalar(f"""
        select cells.pair_id from cells join pairs using (pair_id)
        where {short} and cells.value < 0 order by cells.value, cells.pair_id limit 1""")  # fmt: skip
    add(pid, "the most negative token cell")
    neg = ctx.results.get("negation")
    if neg is not None and neg.height:
        row = neg.sort("not_attribution").row(0, named=True)
        add(row["pair_id"], "negation pair with the smallest 'not' attribution")
    adj = ctx.results.get("adjectives")
    if adj is not None:  # both kinds of one triplet and template, App. C's example if there
        cells = adj.filter(pl.col("attribution").is_not_null()).sort(
            pl.col("template") != "This house is X.", pl.col("triplet") != "beautiful/pretty/ugly", "triplet",
            "template", "kind")  # fmt: skip
        if cells.height:
            first = cells.row(0, named=True)
            both = cells.filter(pl.col("triplet") == first["triplet"], pl.col("template") == first["template"])
            for row in both.sort("kind", descending=True).iter_rows(named=True):
                add(row["pair_id"], f"adjective pair ({row['kind']})")
    return picked


def pair_matrix(ctx: Context, pid: str) -> tuple[np.ndarray, list[str], list[str], str] | None:
    """A pair's token matrix without special tokens (cells not stored, --min-abs, are 0), or its word matrix
    when it has no token cells; None when it has neither."""
    sides = ctx.con.sql("""
        select sa.tokens, sa.word_ids, sa.words, sb.tokens, sb.word_ids, sb.words
        from pairs p join sentences sa on sa.sentence_id = p.sentence_id_a
                     join sentences sb on sb.sentence_id = p.sentence_id_b
        where p.pair_id = ?""", params=[pid]).fetchall()  # fmt: skip
    if not sides:
        return None
    tokens_a, ids_a, words_a, tokens_b, ids_b, words_b = sides[0]
    for table, (x, y), (la, lb) in (("cells", ("i", "j"), (tokens_a, tokens_b)),
                                    ("word_cells", ("u", "v"), (words_a, words_b))):  # fmt: skip
        cells = ctx.con.sql(f"select {x} as x, {y} as y, value from {table} where pair_id = ?", params=[pid]).pl()
        if cells.height and la and lb:
            matrix = np.zeros((len(la), len(lb)))
            matrix[cells["x"].to_numpy(), cells["y"].to_numpy()] = cells["value"].to_numpy()
            if table == "cells":
                rows = [i for i, w in enumerate(ids_a or []) if w is not None] or list(range(len(la)))
                cols = [j for j, w in enumerate(ids_b or []) if w is not None] or list(range(len(lb)))
                return matrix[np.ix_(rows, cols)], [la[i] for i in rows], [lb[j] for j in cols], "token"
            return matrix, list(la), list(lb), "word"
    return None


def plot_examples(ctx: Context) -> Section:
    """Heatmaps of a few real pairs (_example_pairs) with xsbert_core.plots.plot_attributions."""
    from xsbert_core.plots import plot_attributions

    section = Section("examples", "Example pairs", "Fig 1 (heatmaps)")
    section.key_figure = "example-1.png"
    if not ctx.facts["n_pairs"]:
        section.status, section.reason = "skipped", "the run has no pairs"
        return section
    if ctx.facts["cells"] != "all":  # a matrix of the stored cells alone would show mostly zeros
        section.status, section.reason = "skipped", f"the run stores --cells {ctx.facts['cells']}, not every cell"
        return section
    for pid, why in _example_pairs(ctx):
        found = pair_matrix(ctx, pid)
        if found is None:
            continue
        matrix, labels_a, labels_b, level = found
        text_a, text_b, score, total = first_row(ctx.con, f"""
            select text_a, text_b, score, attribution_sum from pairs where pair_id = {quote(pid)}""")  # fmt: skip
        k = len(section.figures) + 1
        name = f"example-{k}.png"
        plot_attributions(matrix, labels_a, labels_b, ctx.out / name,
                          title=f"{why}: score {num(score, 3)}, ΣA {num(total, 3)}")  # fmt: skip
        what = "Token cells, special tokens left out" if level == "token" else "Word cells (no token cells stored)"
        section.figures.append((name, (f"{why.capitalize()} — pair {pid}; rows: “{text_a}”, columns: “{text_b}”. "
                                      f"{what}; red positive, blue negative.")))  # fmt: skip
        section.findings.append(Finding(f"Example {k} ({why}): “{text_a}” / “{text_b}”, score {num(score, 3)}.",
                                        {"pair_id": pid, "score": score, "attribution_sum": total}))  # fmt: skip
    if not section.figures:
        section.status, section.reason = "skipped", "no pair has stored cells"
    return section
