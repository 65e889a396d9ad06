"""The analyses jobs.report runs, in the paper's order (docs/DESIGN.md §4): one module per sql/ file, each with its
`ANALYSIS` (jobs.analyses.base.Analysis). A sql/ file without a module here still gets a section (its table)."""

from __future__ import annotations

from . import (
               adjectives,
               agreement,
               lexical_ranks,
               lexical_ranks_compare,
               negation,
               negation_signs,
               pos_neg_sums,
               reference_terms,
               syntactic_relations,
               syntactic_relations_pairs,
               table1,
)
from .base import Analysis

ANALYSES: tuple[Analysis, ...] = (
    table1.ANALYSIS,
    reference_terms.ANALYSIS,
    agreement.ANALYSIS,
    pos_neg_sums.ANALYSIS,
    syntactic_relations.ANALYSIS,
    syntactic_relations_pairs.ANALYSIS,
    negation.ANALYSIS,
    negation_signs.ANALYSIS,
    adjectives.ANALYSIS,
    lexical_ranks.ANALYSIS,
    lexical_ranks_compare.ANALYSIS,
)
