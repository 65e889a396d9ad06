"""bench/qqp_lexical_gpu.py on CPU: a tiny random model of mpnet's architecture, a handful of pairs in QQP's file
layout (STS-B test sentences: no QQP text ships with the repository), given by --qqp-path, in a process where Ray and
DuckDB cannot be imported (tests/test_local_executor.py's hiding)."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from test_local_executor import without_ray

from jobs.attribution import inputs as _inputs

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_script_runs_longest_first_same_token_cells_and_resumes(tiny, tmp_path):
    with gzip.open(_inputs.BUNDLED_STSB, "rt", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    test = [r for r in rows if r["split"] == "test"][:6]
    lines = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"] + [
        f"{k}\t{2 * k}\t{2 * k + 1}\t{r['sentence1']}\t{r['sentence2']}\t{int(float(r['score']) >= 4)}\n"
        for k, r in enumerate(test)]  # the header and 6 pairs, as GLUE's QQP files have them
    small = tmp_path / "qqp.tsv"
    small.write_text("".join(lines), encoding="utf-8")
    model = tiny.folder("mpnet")
    out = tmp_path / "runs"
    cmd = [sys.executable, "bench/qqp_lexical_gpu.py", "--out", str(out), "--qqp-path", str(small), "--model",
           str(model), "--layer", "1", "--steps", "2", "--wave-size", "2", "--device", "cpu",
           "--", "--quiet"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=without_ray(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "6 pairs in = 6 done + 0 quarantined" in done.stdout
    (run,) = [p for p in out.iterdir() if p.name != "_inputs"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["cells"] == "same-token" and manifest["config"]["layer"] == 1
    assert manifest["runs"][0]["resources"]["executor"] == "local"
    cells = pq.read_table(run / "cells").to_pylist()
    assert cells and all(c["token_a"] == c["token_b"] for c in cells)
    # Waves in length buckets, longest first: each wave's longest pair is no longer than the previous wave's.
    longest = []
    for part in sorted((run / "pairs").glob("part-*.parquet")):
        t = pq.read_table(part).to_pylist()
        if t:
            longest.append(max(max(r["n_tokens_a"], r["n_tokens_b"]) for r in t))
    assert len(longest) == 3 and longest == sorted(longest, reverse=True)
    # The same command resumes: nothing left to compute.
    again = subprocess.run(cmd, cwd=ROOT, env=without_ray(tmp_path), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "computed now        0 pairs" in again.stdout, again.stderr[-2000:]
