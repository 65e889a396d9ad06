"""Fig 2: how far the reference terms of approximate mode are from their ideal values (sql/reference_terms.sql)."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import paper
from .base import Analysis, Context, Finding, Headline, needs_pairs
from .facts import (
    cite,
    model_label,
    subset_label,
)
from .format import num, pct


def check_reference_terms(ctx: Context) -> str | None:
    if reason := needs_pairs(ctx):
        return reason
    if ctx.facts["mode"] == "exact":
        return ("an exact-mode run: its reference terms are 0 by definition (this analysis is for approximate "
                "runs, --mode approx)")  # fmt: skip
    if not ctx.scalar("select count(*) from pairs where ref_sim_a <> 0 or ref_sim_b <> 0 or ref_term <> 0"):
        return "the run's reference similarities and terms are all 0 or missing (as in an exact-mode run)"
    return None


def reference_terms(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    rows = {r["quantity"]: r for r in df.iter_rows(named=True)}
    sim, term = rows["ref_sim"], rows["ref_term"]
    # forward quantities of the whole model: no layer, as the paper's Fig 2 (jobs.paper)
    setting = (model_label(ctx.facts), paper.NO_LAYER, subset_label(ctx.facts))
    return [
        Finding(f"{pct(sim['share_near_zero'])} of the reference similarities f(a, r_b), f(b, r_a) lie within "
                f"±{num(sim['near_zero'])} of 0 (median {num(sim['median'], 3)}, n = {sim['n']}).",
                {"share_near_zero": sim["share_near_zero"], "near_zero": sim["near_zero"], "n": sim["n"]},
                **cite("fig2_ref_sim_near_zero", *setting, f"share with |f| ≤ {sim['near_zero']:g}"),
                headline=Headline(f"reference similarities within ±{num(sim['near_zero'])} of 0",
                                  pct(sim["share_near_zero"]))),
        Finding(f"{pct(term['share_below_threshold'])} of the reference terms f(r_a, r_b) are below "
                f"{num(term['term_threshold'])} (median {num(term['median'], 3)}).",
                {"share_below_threshold": term["share_below_threshold"], "term_threshold": term["term_threshold"],
                 "n": term["n"]},
                **cite("fig2_ref_term_below", *setting, f"share with f < {term['term_threshold']:g}"),
                headline=Headline(f"reference terms below {num(term['term_threshold'])}",
                                  pct(term["share_below_threshold"]))),
    ]  # fmt: skip


def plot_reference_terms(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_cdfs, plot_histograms

    rows = {r["quantity"]: r for r in df.iter_rows(named=True)}
    nz, th = rows["ref_sim"]["near_zero"], rows["ref_term"]["term_threshold"]
    data = ctx.frame("select ref_sim_a, ref_sim_b, ref_term from pairs")
    a, b, t = (data[c].to_numpy() for c in ("ref_sim_a", "ref_sim_b", "ref_term"))
    plot_histograms({"f(a, r_b)": a, "f(b, r_a)": b}, ctx.out / "reference_terms-similarities.png",
                    "Reference similarities (ideal: 0)", "cosine similarity", vlines={f"−{nz:g}": -nz, f"+{nz:g}": nz})
    plot_histograms({"f(r_a, r_b)": t}, ctx.out / "reference_terms-term.png", "Reference term (ideal: 1)",
                    "cosine similarity of the two references", vlines={f"{th:g}": th})
    plot_cdfs({"|f(a, r_b)|": np.abs(a), "|f(b, r_a)|": np.abs(b), "1 − f(r_a, r_b)": 1 - t},
              ctx.out / "reference_terms-cdf.png", "Distance of the reference terms from their ideal values",
              "distance from the ideal value", vlines={f"{nz:g}": nz})  # fmt: skip
    return [
        ("reference_terms-similarities.png", "Histogram of the reference similarities of every pair."),
        ("reference_terms-term.png", "Histogram of the reference term f(r_a, r_b)."),
        ("reference_terms-cdf.png", ("Cumulative share of pairs by distance of each reference term from its "
         "ideal value (0 for the similarities, 1 for the term).")),
    ]  # fmt: skip


ANALYSIS = Analysis("reference_terms", "Reference terms", "Fig 2", check_reference_terms, reference_terms,
                    plot_reference_terms,
                    serve_page="/pairs?sort=error", key_figure="reference_terms-similarities.png")
