"""The paper's reference values, in one table, each with the setting it was measured in and where the paper says it.

Möller, Nikolaev & Padó (EACL 2024) report their numbers for all-mpnet-base-v2 (12 layers). jobs.report and
jobs.evaluate read them from here, and tests/test_paper_values.py checks that the numbers written in the docs
(docs/ANALYSES.md, docs/RESULTS.md, README.md) and in the sql/ headers are this table's, and that the report's
figures and sentences take them from here.

Each value cites its section (`section`: "§4.4, Fig 3") and says what the paper says (`says`): a sentence of the
paper in quotation marks only where it is quoted word for word, else marked "paraphrase:". A claim without a number
(`value` None) is stated as the paper states it, no stronger.

The subsection numbers of §5 are read from the order of its analyses, not from the paper's full text (no copy of
it was at hand when this table was checked, only its abstract and opening): §5.4 is the lexical analysis (Fig 10,
Tables 3-4), and the abstract lists the others in the order syntactic roles, negation, opposite adjectives, so
§5.1 Fig 6, §5.2 Fig 8, §5.3 Fig 9. The figure numbers are the paper's own.

Layers: Fig 2's reference similarities and terms are forward quantities of the whole model (no layer); Fig 3/4 give
their layers on the x axis; §4 states layer 9 and §5.4 level 8 (Fig 10). Where the paper states no layer and we
assume one (Fig 6, Fig 8), the layer says "assumed". A setting the paper does not state ("not stated"), that was
not recorded ("not recorded") or that we assume ("assumed") is never like-for-like.

A number is shown beside one of ours as like-for-like only when model, layer, subset and metric are all equal
(`differences`); otherwise the settings that differ are named next to it (`beside`).
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL = "all-mpnet-base-v2"
N_LAYERS = 12
NOT_RECORDED = "not recorded"
NOT_STATED = "not stated"
ASSUMED = "assumed"
# A paper setting that holds one of these is never like-for-like: we do not know it is the paper's.
UNSURE = (NOT_RECORDED, NOT_STATED, ASSUMED)
SETTINGS = ("model", "layer", "subset", "metric")
PARAPHRASE = "paraphrase: "


@dataclass(frozen=True)
class PaperValue:
    """One number (or claim) of the paper, the setting it was measured in, and where the paper says it."""

    key: str
    figure: str  # "Table 1", "Fig 2", ...
    text: str  # as the paper gives it: "85.8%", "0.81 ± 0.07", "87.5"
    value: float | None  # for figures and comparisons (shares as fractions); None for a claim without a number
    what: str  # what the number is, in words
    model: str  # "all-mpnet-base-v2 exact", "all-mpnet-base-v2, exact vs tuned (approximate)"
    layer: str  # "9 of 12"; "-" where no layer is involved (Table 1, Fig 2)
    subset: str  # "STS-B test (1,379 pairs), s > 0.75"
    metric: str  # "Spearman × 100 of cosine vs gold"
    section: str  # where the paper says it: "§4.4, Fig 3"
    says: str  # the paper's sentence: quoted ("...") where word for word, else "paraphrase: ..."

    def setting(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in SETTINGS}


STSB_TEST = "STS-B test (1,379 pairs)"
NO_LAYER = "-"
ANALYSIS_LAYER = f"9 of {N_LAYERS}"
# §5.1-5.3 state no layer: the §4 layer is our assumption for Fig 6 and Fig 8.
ASSUMED_LAYER = f"9 of {N_LAYERS} ({ASSUMED}: §4's layer; the section states none)"
FIG3_MODEL = f"{MODEL}, exact vs tuned (approximate)"
NEGATION_SUBSET = "STS-B test sentences with one simple 'not' (87 pairs)"
NOT_TOTAL = "the total attribution to the 'not' token"
QQP_SUBSET = "QQP (148,315 pairs; N = 100, App. D)"

VALUES: tuple[PaperValue, ...] = (
    # ---------- Table 1: Spearman × 100 on STS-B test, cosine for every model (§4.1)
    PaperValue("table1_shelf", "Table 1", "83.4", 83.4, "Spearman × 100, off-the-shelf model", f"{MODEL} shelf",
               NO_LAYER, STSB_TEST, "Spearman × 100, cos", "§4.1, Table 1",
               PARAPHRASE + "every model, Orig included, is scored by the cosine of its embeddings on STS-B test"),
    PaperValue("table1_tuned", "Table 1", "87.8", 87.8, "Spearman × 100, tuned model", f"{MODEL} tuned",
               NO_LAYER, STSB_TEST, "Spearman × 100, cos", "§4.1, Table 1",
               PARAPHRASE + "the model fine-tuned on STS-B without the shift"),
    PaperValue("table1_exact", "Table 1", "87.5", 87.5, "Spearman × 100, exact model (shift + cos)",
               f"{MODEL} exact", NO_LAYER, STSB_TEST, "Spearman × 100, cos", "§4.1, Table 1",
               PARAPHRASE + "the shifted model keeps the tuned model's accuracy (87.5 against 87.8)"),
    PaperValue("table1_orig", "Table 1", "86.0", 86.0, "Spearman × 100, orig model (shift + dot-product training)",
               f"{MODEL} orig", NO_LAYER, STSB_TEST, "Spearman × 100, cos", "§4.1, Table 1",
               PARAPHRASE + "the shifted model trained with the dot product, scored with cosine like the others"),
    # ---------- Fig 2: reference terms of the off-the-shelf model (forward quantities: no layer)
    PaperValue("fig2_ref_sim_near_zero", "Fig 2", "85.8%", 0.858,
               "of the reference similarities f(a, r_b), f(b, r_a) within ±0.1 of 0", f"{MODEL} shelf", NO_LAYER,
               STSB_TEST, "share with |f| ≤ 0.1", "§4, Fig 2",
               PARAPHRASE + "the reference similarities are close to zero for most pairs, 85.8% within ±0.1"),
    PaperValue("fig2_ref_term_below", "Fig 2", "6.7%", 0.067, "of the reference terms f(r_a, r_b) below 0.9",
               f"{MODEL} shelf", NO_LAYER, STSB_TEST, "share with f < 0.9", "§4, Fig 2",
               PARAPHRASE + "the reference term is close to one; only 6.7% of the pairs fall below 0.9"),
    # ---------- Fig 3/4: exact (Exact model) vs approximate (Tuned model) attributions; Shelf and Orig left out (§4.4)
    PaperValue("fig3_spearman_top", "Fig 3", "0.81 ± 0.07", 0.81,
               "Spearman of exact vs approximate token matrices, mean ± std over pairs", FIG3_MODEL,
               f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.75",
               f"Spearman per pair; token set {NOT_STATED} (ours: content tokens)", "§4.4, Fig 3",
               PARAPHRASE + "exact attributions of the Exact model and approximate ones of the Tuned model agree "
               "with Spearman 0.81 ± 0.07 at the last layer for pairs with s > 0.75; the section says why Shelf and "
               "Orig are left out of this comparison"),
    PaperValue("fig4_jaccard_top10_l11", "Fig 4", "0.83", 0.83, "top-10 Jaccard of exact vs approximate cells",
               FIG3_MODEL, f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               f"top-10 Jaccard; ordering and token set {NOT_STATED} (ours: |value|, content tokens)",
               "§4.4, Fig 4", PARAPHRASE + "the top-10 token pairs of the two attributions overlap with Jaccard 0.83 "
               "at layer 11 for pairs with s > 0.5, falling to 0.60 at layer 8"),
    PaperValue("fig4_jaccard_top3_l11", "Fig 4", "0.88", 0.88, "top-3 Jaccard of exact vs approximate cells",
               FIG3_MODEL, f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               f"top-3 Jaccard; ordering and token set {NOT_STATED} (ours: |value|, content tokens)",
               "§4.4, Fig 4", PARAPHRASE + "the top-3 token pairs overlap with Jaccard 0.88 at layer 11, s > 0.5"),
    PaperValue("fig4_jaccard_top10_l8", "Fig 4", "0.60", 0.60, "top-10 Jaccard of exact vs approximate cells",
               FIG3_MODEL, f"8 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               f"top-10 Jaccard; ordering and token set {NOT_STATED} (ours: |value|, content tokens)",
               "§4.4, Fig 4", PARAPHRASE + "agreement falls towards shallower layers: top-10 Jaccard 0.60 at layer 8"),
    # ---------- Fig 6: syntactic relations of the top 10% word pairs (stanza parses, STS test)
    PaperValue("fig6_same_function", "Fig 6",
               "same-function pairs are the most frequent relation pairs, but not a large share of all top "
               "attributions", None,
               "(the relation pairs of the top 10% token pairs of each pair, most frequent first)",
               f"{MODEL} exact and shelf", ASSUMED_LAYER, f"STS test ({NOT_STATED} how many pairs), stanza parses",
               "the most frequent relation pairs of the top 10% cells", "§5.1, Fig 6",
               PARAPHRASE + "pairs of the same function (nsubj–nsubj, about 7%) are the most frequent, \"not a large "
               "share of all top attributions\"; the models \"regard a wide range of relations\""),
    PaperValue("fig6_nsubj_share", "Fig 6", "7%", 0.07,
               "of the top attributions join nsubj with nsubj, the most frequent relation pair (approximately)",
               f"{MODEL} exact and shelf", ASSUMED_LAYER, f"STS test ({NOT_STATED} how many pairs), stanza parses",
               "share of the top 10% cells with relation pair nsubj–nsubj", "§5.1, Fig 6",
               PARAPHRASE + "the most frequent relation pair, nsubj–nsubj, holds about 7% of the top attributions"),
    # ---------- Fig 8: negation (the total attribution to the 'not' token; its size relative to the prediction)
    PaperValue("fig8_not_negative_shelf", "Fig 8", "16%", 0.16, "of the 'not' attributions negative",
               f"{MODEL} shelf", ASSUMED_LAYER, NEGATION_SUBSET, f"share of negative 'not' attributions ({NOT_TOTAL})",
               "§5.2, Fig 8", PARAPHRASE + "the total attribution to the 'not' token is negative in 16% of the "
               "cases for Shelf and 9% for Exact"),
    PaperValue("fig8_not_negative_exact", "Fig 8", "9%", 0.09, "of the 'not' attributions negative",
               f"{MODEL} exact", ASSUMED_LAYER, NEGATION_SUBSET, f"share of negative 'not' attributions ({NOT_TOTAL})",
               "§5.2, Fig 8", PARAPHRASE + "negative in 9% of the cases for Exact"),
    PaperValue("fig8_not_relative_shelf", "Fig 8", "8%", 0.08,
               "of the prediction f(a, b) bounds |not attribution| in 90% of the cases", f"{MODEL} shelf",
               ASSUMED_LAYER, NEGATION_SUBSET, f"90th percentile of |not / f(a, b)| ({NOT_TOTAL})", "§5.2, Fig 8",
               PARAPHRASE + "for 90% of the cases the 'not' attribution is under 8% (Shelf) and 14% (Exact) of the "
               "prediction: the models mostly ignore negation"),
    PaperValue("fig8_not_relative_exact", "Fig 8", "14%", 0.14,
               "of the prediction f(a, b) bounds |not attribution| in 90% of the cases", f"{MODEL} exact",
               ASSUMED_LAYER, NEGATION_SUBSET, f"90th percentile of |not / f(a, b)| ({NOT_TOTAL})", "§5.2, Fig 8",
               PARAPHRASE + "for 90% of the cases under 14% of the prediction for Exact"),
    # ---------- §5.4: the lexical example (Shelf scores, forward only: no layer)
    PaperValue("s54_places_above", "§5.4", "> 0.3", 0.3,
               "score of 'A puppy was born in X.' vs 'How many hurricanes occur in X each year?' for X = Auckland, "
               "Cambodia, Granville (each)", f"{MODEL} shelf", NO_LAYER, "the §5.4 sentence pair, 5 places",
               "cosine score", "§5.4",
               PARAPHRASE + "the unrelated sentences score above 0.3 for Auckland, Cambodia and Granville"),
    PaperValue("s54_usa", "§5.4", "0.13", 0.13, "score of the §5.4 sentence pair for X = the USA", f"{MODEL} shelf",
               NO_LAYER, "the §5.4 sentence pair, 5 places", "cosine score", "§5.4",
               PARAPHRASE + "0.13 for the USA"),
    PaperValue("s54_europe", "§5.4", "0.19", 0.19, "score of the §5.4 sentence pair for X = Europe",
               f"{MODEL} shelf", NO_LAYER, "the §5.4 sentence pair, 5 places", "cosine score", "§5.4",
               PARAPHRASE + "0.19 for Europe"),
    # ---------- Fig 10, Tables 3–4: lexical ranks of Exact and Shelf at level 8 on QQP
    PaperValue("fig10_rank_spearman", "Fig 10", "0.81", 0.81, "Spearman of the lexical ranks of two models",
               f"{MODEL}, exact vs shelf", f"8 of {N_LAYERS}", QQP_SUBSET,
               f"Spearman of lexical ranks, words appearing 30 and more times (occurrences or same-token cells: "
               f"{NOT_STATED}), special tokens ranked", "§5.4, Fig 10, Tables 3–4, App. D",
               PARAPHRASE + "the lexical ranks of Exact and Shelf at level 8, over words appearing 30 and more times "
               "in 148,315 QQP pairs (N = 100), correlate with Spearman 0.81"),
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
    'layer: ours 3 of 6, the paper's 9 of 12'; a setting the paper does not state, that was not recorded or that
    we assume differs; [] = like-for-like."""
    out = []
    for k in SETTINGS:
        theirs, mine = getattr(paper, k), ours.get(k, NOT_RECORDED)
        if any(word in theirs for word in UNSURE) or mine != theirs:
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
