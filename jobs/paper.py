"""The paper's reference values, in one table, with the setting each was measured in.

Möller, Nikolaev & Padó (EACL 2024) report their numbers for all-mpnet-base-v2 (12 layers). jobs.report and
jobs.evaluate read them from here, and tests/test_paper_values.py checks that the numbers written in the docs
(docs/ANALYSES.md, docs/RESULTS.md) and in the sql/ headers are this table's. Settings as recorded in DESIGN.md
§4 and issue 17: the §5 analyses (Fig 2, 5, 6, 8, 10) at layer 9, Fig 3 over all pairs and at s > 0.75, Fig 4
at s > 0.5, Table 1 with cosine for every model (§4.1), the lexical ranks over every token with ≥ 30 occurrences
(special tokens and punctuation ranked). A field the paper does not state, or that was not recorded, is
"not recorded": such a value is never like-for-like.

A number is shown beside one of ours as like-for-like only when model, layer, subset and metric are all equal
(`differences`); otherwise the settings that differ are named next to it (`beside`).
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL = "all-mpnet-base-v2"
N_LAYERS = 12
NOT_RECORDED = "not recorded"
SETTINGS = ("model", "layer", "subset", "metric")


@dataclass(frozen=True)
class PaperValue:
    """One number (or claim) of the paper and the setting it was measured in."""

    key: str
    figure: str  # "Table 1", "Fig 2", ...
    text: str  # as the paper gives it: "85.8%", "0.81 ± 0.07", "87.5"
    value: float | None  # for figures and comparisons (shares as fractions); None for a claim without a number
    what: str  # what the number is, in words
    model: str  # "all-mpnet-base-v2 exact", "all-mpnet-base-v2, exact vs approximate"
    layer: str  # "9 of 12"; "-" where attributions play no part (Table 1)
    subset: str  # "STS-B test (1,379 pairs), s > 0.75"
    metric: str  # "Spearman × 100 of cosine vs gold"

    def setting(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in SETTINGS}


STSB_TEST = "STS-B test (1,379 pairs)"
ANALYSIS_LAYER = f"9 of {N_LAYERS}"

VALUES: tuple[PaperValue, ...] = (
    # ---------- Table 1: Spearman × 100 on STS-B test, cosine for every model (§4.1)
    PaperValue("table1_shelf", "Table 1", "83.4", 83.4, "Spearman × 100, off-the-shelf model", f"{MODEL} shelf",
               "-", STSB_TEST, "Spearman × 100, cos"),
    PaperValue("table1_tuned", "Table 1", "87.8", 87.8, "Spearman × 100, tuned model", f"{MODEL} tuned",
               "-", STSB_TEST, "Spearman × 100, cos"),
    PaperValue("table1_exact", "Table 1", "87.5", 87.5, "Spearman × 100, exact model (shift + cos)",
               f"{MODEL} exact", "-", STSB_TEST, "Spearman × 100, cos"),
    PaperValue("table1_orig", "Table 1", "86.0", 86.0, "Spearman × 100, orig model (shift + dot-product training)",
               f"{MODEL} orig", "-", STSB_TEST, "Spearman × 100, cos"),
    # ---------- Fig 2: reference terms of the off-the-shelf model
    PaperValue("fig2_ref_sim_near_zero", "Fig 2", "85.8%", 0.858,
               "of the reference similarities f(a, r_b), f(b, r_a) within ±0.1 of 0", f"{MODEL} shelf", ANALYSIS_LAYER,
               STSB_TEST, "share with |f| ≤ 0.1"),
    PaperValue("fig2_ref_term_below", "Fig 2", "6.7%", 0.067, "of the reference terms f(r_a, r_b) below 0.9",
               f"{MODEL} shelf", ANALYSIS_LAYER, STSB_TEST, "share with f < 0.9"),
    # ---------- Fig 3/4: exact vs approximate attributions
    PaperValue("fig3_spearman_top", "Fig 3", "0.81 ± 0.07", 0.81,
               "Spearman of exact vs approximate token matrices, mean ± std over pairs",
               f"{MODEL}, exact vs approximate", f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.75",
               "Spearman per pair, content tokens"),
    PaperValue("fig4_jaccard_top10_l11", "Fig 4", "0.83", 0.83, "top-10 Jaccard of exact vs approximate cells",
               f"{MODEL}, exact vs approximate", f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               "top-10 Jaccard by |value|, content tokens"),
    PaperValue("fig4_jaccard_top3_l11", "Fig 4", "0.88", 0.88, "top-3 Jaccard of exact vs approximate cells",
               f"{MODEL}, exact vs approximate", f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               "top-3 Jaccard by |value|, content tokens"),
    PaperValue("fig4_jaccard_top10_l8", "Fig 4", "0.60", 0.60, "top-10 Jaccard of exact vs approximate cells",
               f"{MODEL}, exact vs approximate", f"8 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               "top-10 Jaccard by |value|, content tokens"),
    # ---------- Fig 6: syntactic relations of the top 10% word pairs (a claim; no share recorded here)
    PaperValue("fig6_same_function", "Fig 6", "most top word pairs join the same syntactic function", None,
               "(the top 10% word cells of each pair, same function on both sides vs mixed)", f"{MODEL}",
               ANALYSIS_LAYER, NOT_RECORDED, "same-function share of the parsed top 10% word cells"),
    # ---------- Fig 8: negation
    PaperValue("fig8_not_negative_shelf", "Fig 8", "16%", 0.16, "of the 'not' attributions negative",
               f"{MODEL} shelf", ANALYSIS_LAYER, "STS-B test sentences with one simple 'not' (87 pairs)",
               "share of negative 'not' attributions"),
    PaperValue("fig8_not_negative_exact", "Fig 8", "9%", 0.09, "of the 'not' attributions negative",
               f"{MODEL} exact", ANALYSIS_LAYER, "STS-B test sentences with one simple 'not' (87 pairs)",
               "share of negative 'not' attributions"),
    # ---------- Fig 10, Tables 3–4: lexical ranks of two models
    PaperValue("fig10_rank_spearman", "Fig 10", "0.81", 0.81, "Spearman of the lexical ranks of two models",
               f"{MODEL}, two models ({NOT_RECORDED} which)", ANALYSIS_LAYER, NOT_RECORDED,
               "Spearman of lexical ranks, tokens with ≥ 30 same-token cells, special tokens ranked"),
)  # fmt: skip

BY_KEY: dict[str, PaperValue] = {v.key: v for v in VALUES}


def get(key: str) -> PaperValue:
    """The paper's value `key` (KeyError names the known keys)."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"no paper value {key!r}; known: {', '.join(BY_KEY)}") from None


def differences(paper: PaperValue, ours: dict[str, str]) -> list[str]:
    """The settings in which `ours` (model, layer, subset, metric, as strings) differs from the paper's, as
    'layer: ours 3 of 6, the paper's 9 of 12'; a setting the paper's record lacks differs; [] = like-for-like."""
    out = []
    for k in SETTINGS:
        theirs, mine = getattr(paper, k), ours.get(k, NOT_RECORDED)
        if NOT_RECORDED in theirs or mine != theirs:
            out.append(f"{k}: ours {mine}, the paper's {theirs}")
    return out


def beside(paper: PaperValue, ours: dict[str, str]) -> str:
    """The paper's number as it goes beside one of ours: 'Fig 2: 85.8% of reference similarities ...' followed by
    'like-for-like (its setting)' or 'not like-for-like: <the settings that differ>'."""
    head = f"{paper.figure}: {paper.text} {paper.what}"
    diff = differences(paper, ours)
    if not diff:
        return f"{head}; like-for-like ({paper.model}, layer {paper.layer}, {paper.subset}, {paper.metric})"
    return f"{head}; not like-for-like: " + "; ".join(diff)
