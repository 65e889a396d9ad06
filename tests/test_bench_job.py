"""bench/job.py end to end on a tiny model: the job run as the bench runs it (in a subprocess, here with --executor
local so that the test needs no Ray start), its store read back with DuckDB, the engine-alone baseline built from
the job's own command line and resources, and the table written into its section of the results file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _value(table: str, metric: str) -> str:
    found = re.findall(rf"^\| {re.escape(metric)}[^|]* \| ([^|]+) \|$", table, flags=re.MULTILINE)
    assert len(found) == 1, metric
    return found[0].strip()


def test_the_job_bench_measures_the_job_beside_its_engine_alone(tmp_path, tiny):
    results = tmp_path / "job.md"
    gpu = "<!-- bench/job.py gpu -->\nkept\n<!-- /bench/job.py gpu -->"
    results.write_text(f"# Job benchmark (bench/job.py)\n\n{gpu}\n")
    done = subprocess.run(
        [sys.executable, "bench/job.py", "--dataset", "stsb", "--pairs", "6", "--model", str(tiny.folder("bert", 2)),
         "--layer", "1", "--steps", "4", "--executor", "local", "--engine-sentences", "5", "--results", str(results),
         "--out", str(tmp_path / "runs")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = results.read_text()
    assert gpu in text  # the other mode's section stays
    cpu = text[text.index("<!-- bench/job.py cpu -->"):]
    # every flag that sets what was measured, the model and dataset included; not where the results went
    model = tiny.folder("bert", 2)
    assert (f"`python bench/job.py --pairs 6 --dataset stsb --model {model} --layer 1 --steps 4 --executor local "
            "--engine-sentences 5`") in cpu, cpu[:400]
    assert _value(cpu, "actors").endswith("on cpu, executor local")
    assert _value(cpu, "pairs stored (quarantined)") == "6 (0)"
    sentences = int(_value(cpu, "unique sentences"))
    assert 0 < sentences <= 12
    # the baseline: the sampled sentences (all of them, when the run has fewer), and a finite ratio to it
    engine = _value(cpu, "engine alone, one actor")
    assert float(engine) > 0
    assert f"{min(5, sentences):,} of the unique sentences" in cpu
    assert float(_value(cpu, "job compute sentences/s / (engine alone x").strip("*")) > 0
    assert int(_value(cpu, "store bytes per pair").replace(",", "")) > 0
