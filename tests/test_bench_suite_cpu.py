"""bench/suite_cpu.py: its sampler in a real process, and its report's sums by kind, file and test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import suite_cpu  # noqa: E402


def test_a_process_started_with_the_site_writes_its_record_and_the_report_sums_it(tmp_path):
    env = {**os.environ, "XSBERT_SUITE_CPU": str(tmp_path), "PYTEST_CURRENT_TEST": "tests/test_x.py::test_a (call)",
           "PYTHONPATH": str(suite_cpu.SITE)}  # fmt: skip
    code = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(1.2)"
    done = subprocess.run([sys.executable, "-c", code, "burn"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "procs").glob("*.json")]
    assert record["argv"][:2] == ["-c", "burn"] and record["test"].startswith("tests/test_x.py::test_a")
    assert record["cpu"] >= 0.25 and record["ancestors"][0] == os.getpid()
    assert not record["sentence_transformers"] and not record["torch"]

    # a test process (pid 10) ran two tests; a Ray worker under it (its raylet, pid 11) started during the second
    t = record["t0"]
    tests = [{"worker": "gw0", "pid": 10, "test": "tests/test_x.py::test_a", "t0": t - 10, "t1": t - 5, "own": 2.0,
              "children": 1.0},
             {"worker": "gw0", "pid": 10, "test": "tests/test_y.py::test_b", "t0": t - 5, "t1": t + 5, "own": 1.0,
              "children": 0.0}]  # fmt: skip
    (tmp_path / "tests-gw0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in tests))
    worker = {**record, "pid": 12, "ancestors": [11, 10, 1], "argv": [".../ray/_private/workers/default_worker.py"],
              "sentence_transformers": True, "torch": True, "cpu": 7.0}  # fmt: skip
    (tmp_path / "procs" / "12.json").write_text(json.dumps(worker))
    text = suite_cpu.report(tmp_path)
    assert "2 tests; their processes' own CPU 3 s, the children they reaped 1 s" in text
    assert "| Ray workers that imported sentence_transformers (factor actors, trainings) | 1 | 7.0 |" in text
    assert "| commands: python -c burn | 1 |" in text
    assert "| tests/test_y.py | 8 |" in text and "| tests/test_x.py | 3 |" in text  # the worker: test_b's
