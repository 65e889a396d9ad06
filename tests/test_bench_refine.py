"""bench/refine.py on all-MiniLM-L6-v2 at a small start N: both refinements on the same questions, the work each
paid as xsbert_core.refine counts it, the questions above --reference-from against the fixed reference."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import refine as bench  # noqa: E402

from xsbert_core.quadrature import Panel  # noqa: E402
from xsbert_core.refine import node_passes  # noqa: E402

A, B, C = "Hi.", "A man is playing a guitar on stage.", "Someone performs music with an instrument."


def test_the_bench_runs_both_refinements_and_compares_the_hard_questions(minilm_folder, tmp_path):
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"text_a": [A, B], "text_b": [B, C]}), pairs)
    stem = tmp_path / "refine"
    assert bench.main(["--model", str(minilm_folder), "--layer", "3", "--pairs", str(pairs), "--steps", "2",
                       "--tolerance", "3e-3", "--max-steps", "64", "--reference", "64", "--reference-from", "12",
                       "--out-stem", str(stem)]) == 0  # fmt: skip
    r = json.loads(stem.with_suffix(".json").read_text())
    for k in ("double", "panels"):
        rows = r["runs"][k]["rows"]
        assert [x["text"] for x in rows] == [A, B, C]  # the unique questions, pair by pair
        assert all(x["converged"] and x["error"] <= 3e-3 for x in rows)
        for x in rows:
            panels = [Panel(a, b, 2) for a, b in x["panels"]] if x["panels"] else None
            assert x["passes"] == node_passes(x["n"], panels, 2)
    assert all(x["panels"] is None for x in r["runs"]["double"]["rows"])
    assert all(x["panels"] and x["n"] == 2 * len(x["panels"]) for x in r["runs"]["panels"]["rows"])
    hard = [x["text"] for x in r["runs"]["double"]["rows"] if x["n"] >= 12]
    assert hard and [x["text"] for x in r["reference"]] == hard
    for x in r["reference"]:
        assert x["reference_error"] < 1e-5 and 0 < x["double"]["rel_fro"] < 1e-2 and 0 < x["panels"]["rel_fro"] < 1e-2
    md = stem.with_suffix(".md").read_text()
    assert "Doubling / panels" in md and "Against a fixed Gauss-Legendre N = 64" in md
