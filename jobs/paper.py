"""The paper's reference values, in one table, each with the setting it was measured in and where the paper says it.

Möller, Nikolaev & Padó (EACL 2024) report their numbers for all-mpnet-base-v2 (12 layers). jobs.report and
jobs.evaluate read them from here, and tests/test_paper_values.py checks that the numbers written in the docs
(docs/ANALYSES.md, docs/RESULTS.md, README.md) and in the sql/ headers are this table's, and that the report's
figures and sentences take them from here.

Each value cites its section (`section`: "§4.4, Fig 3") and says what the paper says (`says`): the paper's own
sentences in quotation marks, word for word (its italics and math markup dropped: *Shelf* is Shelf, $r_S$ is r_S,
\\pm is ±, footnote marks left out), with anything of ours after them marked "paraphrase:". The sections, figure
numbers, values and quotations were read against the paper's full text; the sentences quoted here are kept in
tests/data/paper_sentences.txt, word for word, and tests/test_paper_values.py checks every quotation against them.
A claim without a number (`value` None) is stated as the paper states it, no stronger.

Layers: Fig 2's reference similarities and terms are forward quantities of the whole model (no layer); Fig 3 is
"layer eleven", Fig 4 layers eleven "down to the seventh" (its quoted values eleven to eight); §4 states layer nine
for its attributions and App. D level 8 for §5.4 (Fig 10). §5.1-5.3 state no layer: where we set §4's layer beside
Fig 6, 8 and 9 the layer says "assumed". A setting the paper does not state ("not stated"), that was not recorded
("not recorded") or that we assume ("assumed") is never like-for-like.

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
# The score subsets of the agreement (§4.4): Fig 3's headline is for pairs of mean score s > 0.75, Fig 4's values for
# s > 0.5.
TOP_SCORE = 0.75
FIG4_SCORE_ABOVE = 0.5


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
# §5.1-5.3 state no layer: the §4 layer is our assumption for Fig 6, Fig 8 and Fig 9.
ASSUMED_LAYER = f"9 of {N_LAYERS} ({ASSUMED}: §4's layer; the section states none)"
FIG3_MODEL = f"{MODEL}, exact vs tuned (approximate)"
# §5.1 parses "all sentence pairs from the STS test set" with stanza (footnote 4).
FIG6_SUBSET = f"{STSB_TEST}, stanza parses"
NEGATION_SUBSET = "STS-B test sentences with one simple 'not' (87 pairs)"
NOT_TOTAL = "the total attribution to the 'not' token"
# §5.2's "relative attributions ... of the prediction": the prediction is f(a, b) (§3.1); whether an absolute value is
# taken is not written out.
NOT_RELATIVE = (f"90th percentile of |not / f(a, b)| ({NOT_TOTAL} relative to the prediction f(a, b); the absolute "
                f"value {ASSUMED})")
# §5.3: "two sentence pairs per triplet (Appendix C) built from the same sentence template"; App. C gives one example
# ("This house is beautiful.", "This house is pretty."), not the template set.
ADJECTIVES_SUBSET = (f"Table 2's 23 triplets, two pairs each from one template (46 pairs; the template {NOT_STATED}: "
                     "App. C's example is This house is beautiful. / This house is pretty.)")
QQP_SUBSET = "QQP (148,315 pairs; N = 100, App. D)"
COSINE = ('"We evaluate all models on the STS test set using the standard metric of Spearman correlation between the '
          'cosine similarity of embeddings and annotations."')

VALUES: tuple[PaperValue, ...] = (
    # ---------- Table 1: Spearman × 100 on STS-B test, cosine for every model (§4.2)
    PaperValue("table1_shelf", "Table 1", "83.4", 83.4, "Spearman × 100, off-the-shelf model", f"{MODEL} shelf",
               NO_LAYER, STSB_TEST, "Spearman × 100, cos", "§4.2, Table 1",
               '"Shelf refers to the unmodified off-the-shelf version." ' + COSINE),
    PaperValue("table1_tuned", "Table 1", "87.8", 87.8, "Spearman × 100, tuned model", f"{MODEL} tuned",
               NO_LAYER, STSB_TEST, "Spearman × 100, cos", "§4.2, Table 1",
               '"Tuned undergoes the same training as the other fine-tuned models but keeps its unmodified '
               'architecture." "The Tuned model achieves the best performance."'),
    PaperValue("table1_exact", "Table 1", "87.5", 87.5, "Spearman × 100, exact model (shift + cos)",
               f"{MODEL} exact", NO_LAYER, STSB_TEST, "Spearman × 100, cos", "§4.2, Table 1",
               '"The Orig. and Exact models sacrifice 1.8 and 0.3 points in average correlation, respectively."'),
    PaperValue("table1_orig", "Table 1", "86.0", 86.0, "Spearman × 100, orig model (shift + dot-product training)",
               f"{MODEL} orig", NO_LAYER, STSB_TEST, "Spearman × 100, cos", "§4.2, Table 1",
               '"Finally, Orig. is the configuration from Möller et al. (2023) with a dot product as the similarity '
               'measure." ' + COSINE),
    # ---------- Fig 2: reference terms of the off-the-shelf model (forward quantities: no layer)
    PaperValue("fig2_ref_sim_near_zero", "Fig 2", "85.8%", 0.858,
               "of the reference similarities f(a, r_b), f(b, r_a) within ±0.1 of 0", f"{MODEL} shelf", NO_LAYER,
               STSB_TEST, "share with |f| ≤ 0.1", "§4.3, Fig 2",
               '"Figure 2 (left) shows the distribution of similarities between all STS test set sentences and '
               'corresponding reference inputs consisting of padding tokens." "85.8% of all similarities are within '
               'an interval of ± 0.1 around zero."'),
    PaperValue("fig2_ref_term_below", "Fig 2", "6.7%", 0.067, "of the reference terms f(r_a, r_b) below 0.9",
               f"{MODEL} shelf", NO_LAYER, STSB_TEST, "share with f < 0.9", "§4.3, Fig 2",
               '"Only 6.7% of all contributions are smaller than 0.9."'),
    # ---------- Fig 3/4: exact (Exact model) vs approximate (Tuned model) attributions; Shelf and Orig left out (§4.4)
    PaperValue("fig3_spearman_top", "Fig 3", "0.81 ± 0.07", 0.81,
               "Spearman of exact vs approximate token matrices, mean over pairs (what its ± is: not stated)",
               FIG3_MODEL,
               f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.75",
               f"Spearman per pair; token set {NOT_STATED} (ours: content tokens)", "§4.4, Fig 3",
               '"In Figure 3, we plot Spearman correlation values of attributions to layer eleven against the average '
               'similarity score predicted by the two models." "For scores s > 0.75 it reaches r_S = 0.81 ± 0.07." '
               '"Therefore, we do not compare attributions of the Shelf or Orig. model in this experiment."'),
    PaperValue("fig4_jaccard_top10_l11", "Fig 4", "0.83 ± 0.10", 0.83, "top-10 Jaccard of exact vs approximate cells",
               FIG3_MODEL, f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               f"top-10 Jaccard; ordering and token set {NOT_STATED} (ours: |value|, content tokens)",
               "§4.4, Fig 4", '"The Jaccard coefficient starts at 0.83 ± 0.10 (0.88 ± 0.17) in layer eleven and '
               'decreases to 0.60 ± 0.14 (0.75 ± 0.20) in layer eight." "We compute Spearman and Pearson '
               'correlations, as well as the intersections between the top-3 and top-10 attributions for different '
               'layers and similarity scores s > 0.5."'),
    PaperValue("fig4_jaccard_top3_l11", "Fig 4", "0.88 ± 0.17", 0.88, "top-3 Jaccard of exact vs approximate cells",
               FIG3_MODEL, f"11 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               f"top-3 Jaccard; ordering and token set {NOT_STATED} (ours: |value|, content tokens)",
               "§4.4, Fig 4", '"The Jaccard coefficient starts at 0.83 ± 0.10 (0.88 ± 0.17) in layer eleven"'),
    PaperValue("fig4_jaccard_top10_l8", "Fig 4", "0.60 ± 0.14", 0.60, "top-10 Jaccard of exact vs approximate cells",
               FIG3_MODEL, f"8 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               f"top-10 Jaccard; ordering and token set {NOT_STATED} (ours: |value|, content tokens)",
               "§4.4, Fig 4", '"and decreases to 0.60 ± 0.14 (0.75 ± 0.20) in layer eight."'),
    PaperValue("fig4_jaccard_top3_l8", "Fig 4", "0.75 ± 0.20", 0.75, "top-3 Jaccard of exact vs approximate cells",
               FIG3_MODEL, f"8 of {N_LAYERS}", f"{STSB_TEST}, s > 0.5",
               f"top-3 Jaccard; ordering and token set {NOT_STATED} (ours: |value|, content tokens)",
               "§4.4, Fig 4", '"and decreases to 0.60 ± 0.14 (0.75 ± 0.20) in layer eight."'),
    PaperValue("fig4_spearman_l10", "Fig 4", "0.60 ± 0.13", 0.60,
               "Spearman of exact vs approximate token matrices", FIG3_MODEL, f"10 of {N_LAYERS}",
               f"{STSB_TEST}, s > 0.5", f"Spearman per pair; token set {NOT_STATED} (ours: content tokens)",
               "§4.4, Fig 4", '"Figure 4 summarizes the results for similarity scores s > 0.5." "Spearman '
               'correlation declines to r_S = 0.60 ± 0.13 and r_S = 0.40 ± 0.17 in layer ten and nine, '
               'respectively."'),
    PaperValue("fig4_spearman_l9", "Fig 4", "0.40 ± 0.17", 0.40,
               "Spearman of exact vs approximate token matrices", FIG3_MODEL, f"9 of {N_LAYERS}",
               f"{STSB_TEST}, s > 0.5", f"Spearman per pair; token set {NOT_STATED} (ours: content tokens)",
               "§4.4, Fig 4", '"Spearman correlation declines to r_S = 0.60 ± 0.13 and r_S = 0.40 ± 0.17 in layer '
               'ten and nine, respectively."'),
    PaperValue("fig4_pearson_l8", "Fig 4", "0.80 ± 0.11", 0.80,
               "Pearson of exact vs approximate token matrices", FIG3_MODEL, f"8 of {N_LAYERS}",
               f"{STSB_TEST}, s > 0.5", f"Pearson per pair; token set {NOT_STATED} (ours: content tokens)",
               "§4.4, Fig 4", '"Pearson correlation, on the other hand, which remains relatively high with r_P = '
               '0.80 ± 0.11 in layer eight, is technically not suitable because we cannot presuppose a linear '
               'relation between attributions."'),
    # ---------- Fig 6: syntactic relations of the top 10% word pairs (stanza parses of all STS test pairs)
    PaperValue("fig6_same_function", "Fig 6",
               "top-contributing pairs are based on words with identical syntactic function; the models regard a "
               "wide range of relations", None,
               "(the relation pairs of the top 10% word cells of each pair, most frequent first)",
               f"{MODEL} exact and shelf", ASSUMED_LAYER, FIG6_SUBSET,
               "the most frequent relation pairs of the top 10% cells", "§5.1, Fig 6",
               '"Notably, top-contributing pairs are based on words with identical syntactic function, which '
               'suggests that models begin by matching major syntactic roles before considering mixed relations." '
               '"Therefore, we can conclude that the models regard a wide range of relations between syntactic roles '
               'and do not overly focus on specific ones."'),
    PaperValue("fig6_nsubj_share", "Fig 6", "7%", 0.07,
               "of the top attributions join nsubj with nsubj (around; the most frequent relation pair, \"not a "
               "large share of all top attributions\")",
               f"{MODEL} exact or shelf ({NOT_STATED} which: the sentence follows the Exact model's rank 14)",
               ASSUMED_LAYER, FIG6_SUBSET,
               f"share of the top 10% cells with relation pair nsubj–nsubj (of all top cells or of those between "
               f"parsed words: {NOT_STATED})", "§5.1, Fig 6",
               '"With a fraction of around 7% subject–subject attributions are by far the most frequent." '
               '"Nevertheless, this is not a large share of all top attributions, and the rest of the distribution '
               'does not decline steeply." ' + PARAPHRASE + 'the sentence before it is "In the exact model, somewhat '
               'surprisingly, this relation only appears on rank 14." (of nsubj–root), so whether the 7% is the '
               "Exact model's, the Shelf model's or both is not stated"),
    # ---------- Fig 8: negation (the total attribution to the 'not' token; its size relative to the prediction)
    PaperValue("fig8_not_negative_shelf", "Fig 8", "16%", 0.16, "of the 'not' attributions negative (approximately)",
               f"{MODEL} shelf", ASSUMED_LAYER, NEGATION_SUBSET, f"share of negative 'not' attributions ({NOT_TOTAL})",
               "§5.2, Fig 8", '"In the Shelf (Exact) model only approximately 16% (9%) of all not-attributions are '
               'negative." "We then derive attributions for the similarity to the identical but non-negated sentence '
               'and compute the total attribution to the not-token."'),
    PaperValue("fig8_not_negative_exact", "Fig 8", "9%", 0.09, "of the 'not' attributions negative (approximately)",
               f"{MODEL} exact", ASSUMED_LAYER, NEGATION_SUBSET, f"share of negative 'not' attributions ({NOT_TOTAL})",
               "§5.2, Fig 8", '"In the Shelf (Exact) model only approximately 16% (9%) of all not-attributions are '
               'negative."'),
    PaperValue("fig8_not_relative_shelf", "Fig 8", "8%", 0.08,
               "of the prediction bounds the relative 'not' attribution in 90% of the cases", f"{MODEL} shelf",
               ASSUMED_LAYER, NEGATION_SUBSET, NOT_RELATIVE, "§5.2, Fig 8",
               '"In 90% of the cases relative attributions to the not-token account for less than 8% (14%) of the '
               'prediction." ' + PARAPHRASE + "the prediction is f(a, b), the term §3.1 defines (the sum over A is "
               "exactly equal to the model prediction, f(a, b)); whether the absolute value is taken is not written "
               "out; |not / (f(a, b) + 1)| (Eq. 4's sum) and |not / ΣA| are ours beside it"),
    PaperValue("fig8_not_relative_exact", "Fig 8", "14%", 0.14,
               "of the prediction bounds the relative 'not' attribution in 90% of the cases", f"{MODEL} exact",
               ASSUMED_LAYER, NEGATION_SUBSET, NOT_RELATIVE, "§5.2, Fig 8",
               '"In 90% of the cases relative attributions to the not-token account for less than 8% (14%) of the '
               'prediction."'),
    # ---------- Fig 9: adjective synonyms vs opposites (Table 2's triplets; the template set is not stated)
    PaperValue("fig9_opposites_lower", "Fig 9",
               "opposite adjective pairs generally receive lower, but only rarely negative attributions", None,
               "(the word-level attribution to the two adjectives, synonym vs opposite pairs)",
               f"{MODEL} exact and shelf", ASSUMED_LAYER, ADJECTIVES_SUBSET,
               "the attribution of the adjective pair (token to word by averaging)", "§5.3, Fig 9, Table 2, App. C",
               '"In both cases the distributions show that opposite adjective pairs, generally, do receive lower, '
               'but only rarely negative attributions." "From a total of 23 such triplets, we then build a synthetic '
               'data set consisting of two sentence pairs per triplet (Appendix C) built from the same sentence '
               'template."'),
    # ---------- §5.4: the lexical example (Shelf scores, forward only: no layer)
    PaperValue("s54_places_above", "§5.4", "> 0.3", 0.3,
               "score of 'A puppy was born in X.' vs 'How many hurricanes occur in X each year?' for X = Auckland, "
               "Cambodia, Granville (each)", f"{MODEL} shelf", NO_LAYER, "the §5.4 sentence pair, 5 places",
               "cosine score", "§5.4",
               '"However, the Shelf model predicts scores above 0.3 when X is in Auckland, Cambodia, Granville but '
               'only 0.13 for the USA and 0.19 for Europe."'),
    PaperValue("s54_usa", "§5.4", "0.13", 0.13, "score of the §5.4 sentence pair for X = the USA", f"{MODEL} shelf",
               NO_LAYER, "the §5.4 sentence pair, 5 places", "cosine score", "§5.4",
               '"However, the Shelf model predicts scores above 0.3 when X is in Auckland, Cambodia, Granville but '
               'only 0.13 for the USA and 0.19 for Europe."'),
    PaperValue("s54_europe", "§5.4", "0.19", 0.19, "score of the §5.4 sentence pair for X = Europe",
               f"{MODEL} shelf", NO_LAYER, "the §5.4 sentence pair, 5 places", "cosine score", "§5.4",
               '"However, the Shelf model predicts scores above 0.3 when X is in Auckland, Cambodia, Granville but '
               'only 0.13 for the USA and 0.19 for Europe."'),
    # ---------- Fig 10, Tables 3–4: lexical ranks of Exact and Shelf at level 8 on QQP
    PaperValue("fig10_rank_spearman", "Fig 10", "0.81", 0.81, "Spearman of the lexical ranks of two models",
               f"{MODEL}, exact vs shelf", f"8 of {N_LAYERS}", QQP_SUBSET,
               f"Spearman of lexical ranks, words appearing 30 and more times (occurrences or same-token cells: "
               f"{NOT_STATED}), special tokens ranked", "§5.4, Fig 10, Tables 3–4, App. D",
               '"Overall, the attribution ranks show high agreement (Spearman\'s r = 0.81) between the two models" '
               '"We compute attribution matrices for 148315 sentence pairs at level 8; N = 100." "We then extract all '
               'attributions for words appearing 30 and more times and assign them ranks based on their average '
               'attributions."'),
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
