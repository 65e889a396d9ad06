"""A machine from which the Hugging Face hub cannot be reached (an air-gapped node, offline mode not set): a hub name
that nothing here holds is one line at once, and one that the hub's cache holds loads from there
(xsbert_core/models.py hub_unreachable, hub_cached). Without the check, huggingface_hub retried each request 5 times
(~23 s) and printed each retry twice: a mistyped model took over a minute and ~20 lines to reach its error.

The hub is an address nothing listens on (HF_ENDPOINT on a closed port of 127.0.0.1: the connection is refused), the
caches are the test's (HF_HOME), and each command runs in a process of its own, as a user's does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
          "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")  # fmt: skip


@pytest.fixture(scope="module")
def no_hub(tmp_path_factory) -> tuple[dict[str, str], Path, int]:
    """(environment, HF_HOME, port): the hub's address a port of 127.0.0.1 that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: connecting is refused
    home = tmp_path_factory.mktemp("hf-home")
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN}
    env.update(HF_HOME=str(home), HF_ENDPOINT=f"http://127.0.0.1:{port}", PYTHONPATH=str(ROOT))
    return env, home, port


def command(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`xsbert ARGS` (its console script), or `python ARGS` when the first is -m."""
    exe = [sys.executable] if args[0] == "-m" else [str(Path(sys.executable).with_name("xsbert"))]
    return subprocess.run([*exe, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_hub_model_nothing_here_holds_is_one_line_at_once(no_hub):
    env, _, port = no_hub
    proc = command(env, "explain", "--model", "xsbert-test-org/no-such-model", "-q")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("xsbert explain: error: Could not load model 'xsbert-test-org/no-such-model': ")
    assert (f"the hub's cache here does not hold it, and the Hugging Face hub cannot be reached (127.0.0.1:{port}: "
            "no connection (Connection refused))") in lines[0]  # fmt: skip


def test_a_hub_model_in_the_hubs_cache_loads_from_there(no_hub, tiny, tmp_path):
    """The layout huggingface_hub's cache gives a download (models--OWNER--NAME: refs/main names the snapshot)."""
    env, home, _ = no_hub
    repo = home / "hub" / "models--xsbert-test-org--tiny-bert"
    commit = "0123456789abcdef0123456789abcdef01234567"
    tiny.build("bert", n_layers=3).save(str(repo / "snapshots" / commit))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    out = tmp_path / "explain.json"
    proc = command(env, "explain", "A cat sat.", "A dog sat.", "--model",
                   "xsbert-test-org/tiny-bert", "--layer", "1", "--steps", "2", "--json", str(out), "-q")  # fmt: skip
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr[-3000:]
    assert json.loads(out.read_text())["settings"]["model"] == "xsbert-test-org/tiny-bert"


def test_a_hub_dataset_nothing_here_holds_is_one_line_at_once(no_hub, tmp_path):
    env, _, port = no_hub
    proc = command(env, "-m", "jobs.attribute", "--dataset", "xsbert-test-org/no-such-pairs", "--executor", "local",
                   "--out", str(tmp_path / "runs"), "-q")  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines == [
        "jobs.attribute: error: could not load dataset 'xsbert-test-org/no-such-pairs' (config None, split None): the "
        f"Hugging Face hub cannot be reached (127.0.0.1:{port}: no connection (Connection refused)) and no cache here "
        "holds it. Pass a local file (TSV/CSV/Parquet/JSONL) or run where the Hugging Face hub is reachable."], lines
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
