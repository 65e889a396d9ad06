"""Faults of the attribution job, checked on values against a run that was never interrupted.

Every run here attributes the same 8 real STS-B pairs with the same flags (all-MiniLM-L6-v2, last layer,
N = 2, waves of 4 pairs, batches of 4 sentences, one factor actor) on one local 2-CPU Ray, so every
store must hold the same rows, cell by cell. The reference is `clean`: one uninterrupted run into a fresh directory
(made once per session for the fault modules: tests/conftest.py reference_run).

- the same config into another fresh directory gives byte-identical Parquet (the store's determinism claim), even
  with stage 1 as one pipeline per wave (a pool start each; the reference run's two waves had one pool);
- a run in which one factor actor and one cell task were killed (and retried) equals it, on an S3 store (moto on
  127.0.0.1, the `s3_ray` cluster whose workers have the endpoint and keys);
- a driver killed after its first commit, then rerun, equals it (byte for byte);
- a batch that kills every actor fails the run with one clear line after --max-retries restarts,
  leaves nothing of its wave, and the rerun equals it (on S3; a driver killed mid-run on S3 is in
  tests/test_store_backends.py);
- retried copies of a stage-2 row are counted and dropped when equal, and fail the run when they differ.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from jobtools import (
    FAST,
    REFERENCE_FLAGS,
    REFERENCE_PAIRS,
    TABLES,
    download,
    hooked_attribute,
    job_error,
    kill_after_first_commit,
    parquet_hashes,
    q,
    rows,
    run_job,
    stsb_rows,
)

from jobs import store as jstore
from jobs.attribution.hooks import Hooks

ROOT = Path(__file__).resolve().parents[1]
N_PAIRS = REFERENCE_PAIRS
FLAGS = REFERENCE_FLAGS  # the reference run's (tests/conftest.py reference_run)


def assert_same_store(got: Path | str, want: Path, tmp_path: Path | None = None) -> None:
    """Every table of the two runs holds the same rows, every column exactly equal (an s3:// run is downloaded)."""
    if str(got).startswith("s3://"):
        got = download(str(got), tmp_path / "copy")
    for table in TABLES:
        assert rows(got, table) == rows(want, table), table
    assert q(got, "select count(*) from {pairs}") == [(N_PAIRS,)]


def out_root(s3, tmp_path: Path) -> str:
    """A fresh store root: a fresh prefix of the moto bucket."""
    return f"s3://{s3.bucket}/faults/{tmp_path.name}/runs"


@pytest.fixture(scope="module")
def data(reference_run) -> Path:
    return reference_run[0]


@pytest.fixture(scope="module")
def clean(s3_ray, reference_run) -> Path:
    """The uninterrupted run: its run directory (tests/conftest.py reference_run; s3_ray: the module's Ray)."""
    return reference_run[1]


@pytest.mark.slow
def test_same_config_into_a_fresh_directory_in_groups_of_waves_is_byte_identical(clean, data, tmp_path, monkeypatch):
    """The reference run's config into a fresh directory, with stage 1 as one pipeline per group of waves
    (attribution.stage1.STAGE1_GROUP_BLOCKS; each wave here is 2 factor batches): at 1, the first wave, larger than a
    group, still makes one group, and the second does not fit beside it (a group of 2 or 3 takes the same two steps),
    so a pool starts for each wave where the reference run started one for both (tests/conftest.py reference_run).
    The store is the reference run's, byte for byte: neither the directory nor the grouping is in the numbers."""
    from jobs.attribution import stage1

    starts = tmp_path / "actor-starts.log"
    monkeypatch.setattr(stage1, "STAGE1_GROUP_BLOCKS", 1)
    s = run_job(tmp_path, "--dataset", str(data), *FLAGS, hooks=Hooks(start_log=str(starts)))
    assert s["waves"] == 2 and len(starts.read_text().splitlines()) == 2  # a pool for each group
    fresh = Path(s["run_dir"])
    assert fresh.name == clean.name and fresh != clean
    hashes = parquet_hashes(fresh)
    assert hashes == parquet_hashes(clean)
    assert {h.split("/")[0] for h in hashes} == set(TABLES)
    manifest = json.loads((clean / "manifest.json").read_text())
    waves = manifest["runs"][-1]["waves"]
    assert [w["duplicates_dropped"] for w in waves] == [0, 0]  # an uninterrupted run returns each row once


@pytest.mark.slow
def test_killed_factor_actor_and_cell_task_give_the_same_store(s3, clean, data, tmp_path):
    """On an S3 store, where the killed cell task's writes go over the network (the store is one seam for every
    backend: a local store's retried wave takes the same steps; its own faults are tests/test_disk_faults.py's)."""
    actor_marker, cells_marker = tmp_path / "actor-killed", tmp_path / "cells-killed"
    hooks = Hooks(kill_once=str(actor_marker), kill_cells_once=str(cells_marker))
    s = run_job(out_root(s3, tmp_path), "--dataset", str(data), *FLAGS, hooks=hooks)  # type: ignore[arg-type]
    assert actor_marker.read_text().startswith("killed pid")  # a factor actor really died mid-batch
    assert cells_marker.read_text().startswith("killed pid")  # and a stage-2 task
    assert s["computed_pairs"] == N_PAIRS
    assert_same_store(s["run_dir"], clean, tmp_path)
    # Each retried batch came back once: the killed calls had returned nothing.
    manifest = jstore.open_store(*s["run_dir"].rsplit("/", 1)).read_manifest()
    assert s["duplicates_dropped"] == 0 == sum(w["duplicates_dropped"] for w in manifest["runs"][-1]["waves"])


@pytest.mark.slow
def test_killed_driver_resumes_to_the_same_store(s3_ray, clean, data, tmp_path):
    out = tmp_path / "runs"
    cmd = hooked_attribute("--dataset", str(data), *FAST, *FLAGS, "--out", str(out), "--quiet", "--ray-address",
                           s3_ray.get_runtime_context().gcs_address, hold_after_wave=1)  # killed between the waves
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    kill_after_first_commit(cmd, env, lambda: bool(list(out.glob("*/pairs/part-*.parquet"))), timeout=240)
    run_dir = out / clean.name
    assert 4 <= len(jstore.RunStore(out, clean.name).done_pair_ids()) < N_PAIRS  # killed between waves

    s = run_job(out, "--dataset", str(data), *FLAGS)
    assert s["computed_pairs"] == N_PAIRS - 4 and (s["n_in"], s["n_done"]) == (N_PAIRS, N_PAIRS)
    assert_same_store(run_dir, clean)
    assert parquet_hashes(run_dir) == parquet_hashes(clean)  # same waves, same parts: the same bytes
    assert not (run_dir / jstore.STAGING).exists()


@pytest.mark.slow
def test_a_batch_that_kills_every_actor_fails_the_run_clearly(s3, s3_ray, clean, data, tmp_path):
    """The command as a user runs it (a process of its own, its console as it is; joined to the module's Ray), on an
    S3 store. (A local store's failed wave, whatever failed it: tests/test_disk_faults.py's disk full in mid-run,
    only whole waves committed, and the rerun leaves no staging.)"""
    out, log = out_root(s3, tmp_path), tmp_path / "deaths.log"
    poison = stsb_rows(N_PAIRS, start=40).sentence1.iat[6]  # a sentence of the second wave
    cmd = hooked_attribute("--dataset", str(data), *FAST, *FLAGS, "--max-retries", "1", "--out", str(out), "-q",
                           "--ray-address", s3_ray.get_runtime_context().gcs_address, kill_text=poison,
                           kill_log=str(log))  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    said = job_error(done.stderr)  # (Ray Data's own account, with its traceback, stays in its log file)
    assert done.returncode == 2 and said.startswith("jobs.attribute: error: wave 2/2 failed: a batch killed its worker "
                                                    "2 times (--max-retries 1"), said  # fmt: skip
    assert "1 earlier wave(s) of this run are committed, nothing of wave 2 was written" in said
    assert "Loading weights" not in done.stderr  # the actors' model loads: no bar each in the job's console
    assert len(log.read_text().splitlines()) == 2  # the first try and one retry on a restarted actor

    # Nothing half-written: wave 1 committed, no part of wave 2 in any table, no staging left.
    store = jstore.open_store(out, clean.name)
    assert [p.name for p in store.parts("pairs")] == ["part-000000.parquet"]
    for table in ("cells", "word_cells", "sentences"):
        assert {jstore.part_seq(p.name) for p in store.parts(table)} == {0}, table
    assert len(store.done_pair_ids()) == 4

    s = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]  # the cause gone: the same command resumes
    assert s["computed_pairs"] == N_PAIRS - 4
    assert_same_store(s["run_dir"], clean, tmp_path)


# --------------------------------------------------------------------------- duplicates (no Ray)
def _stage2_rows(n: int) -> pa.Table:
    from jobs.attribution.actors import PAIR_SCHEMA

    data = {name: [None] * n for name in PAIR_SCHEMA.names}
    data.update(ord=list(range(n)), pair_id=[f"p{k}" for k in range(n)], score=[0.5 + k for k in range(n)],
                cell_value=[[0.1 * k, 0.2] for k in range(n)])  # fmt: skip
    return pa.table(data, schema=PAIR_SCHEMA)


def test_duplicate_rows_are_counted_and_dropped_when_equal():
    from jobs.attribution.stage2 import exactly_once

    rows_ = _stage2_rows(4)
    doubled = pa.concat_tables([rows_.slice(2, 2), rows_, rows_.slice(1, 1)])  # a retried batch, any order
    out, dropped = exactly_once(doubled)
    assert dropped == 3
    assert out.to_pylist() == rows_.to_pylist()  # one row per ord, in ord order
    once, none = exactly_once(rows_)
    assert none == 0 and once.equals(rows_)


def test_duplicate_rows_that_differ_fail_the_run():
    from jobs.attribution.stage2 import JobFailedError, exactly_once

    rows_ = _stage2_rows(3)
    retried = rows_.slice(1, 1)  # pair p1 again, its score one ulp off
    retried = retried.set_column(retried.schema.get_field_index("score"), "score", pa.array([np.nextafter(1.5, 2)]))
    with pytest.raises(JobFailedError, match="'p1' came back twice from stage 2 with different values"):
        exactly_once(pa.concat_tables([rows_, retried]))
