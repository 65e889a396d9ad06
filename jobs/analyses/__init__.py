"""The analyses of a run behind `python -m jobs.report`: one module per sql/ file (its applicability check, findings,
figures and the paper's number beside ours), a small base (`base`: Analysis, Context, Finding, Section; `format`;
`facts`: the runs' settings and our setting spelled as jobs.paper spells the paper's), the registry (`registry`:
the order the report walks) and the machinery that runs them and writes the report (`run`, `examples`, `page`).

Adding an analysis: docs/ANALYSES.md ("Adding an analysis")."""

from __future__ import annotations

from .registry import ANALYSES
from .run import write_report

__all__ = ["ANALYSES", "write_report"]
