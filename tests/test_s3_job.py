"""The store on object storage: jobs.attribute and the pipeline with `--out s3://...` against a real S3 endpoint
(moto's standalone server on 127.0.0.1, started by the `s3` fixture), reached over HTTP by the same pyarrow and
boto3 code a cluster uses. The same guarantees as on a local disk, checked on values against a local run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobtools import (
    FAST,
    assert_same_rows,
    check_pipeline_on_store,
    commit_large_rows,
    download,
    row_groups,
    run_job,
    stsb_rows,
    write_tsv,
)

from jobs import store as jstore

ROOT = Path(__file__).resolve().parents[1]
N_PAIRS = 8
FLAGS = ["--wave-size", "4", "--batch-size", "4", "--num-actors", "1"]


@pytest.fixture()
def s3env(s3, monkeypatch):
    """The fixture's endpoint and dummy credentials in this process's environment."""
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    return s3


def listing(s3, prefix: str) -> dict[str, str]:
    """key -> ETag of every object under `prefix` (what a rerun must leave unchanged)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3.endpoint_url)
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix):
        out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_tsv(tmp_path_factory.mktemp("s3-data") / "pairs.tsv", stsb_rows(N_PAIRS, start=40))


@pytest.fixture(scope="module")
def local_clean(s3_ray, data, tmp_path_factory) -> Path:
    s = run_job(tmp_path_factory.mktemp("local"), "--dataset", str(data), *FLAGS)
    return Path(s["run_dir"])


@pytest.mark.slow
def test_job_on_s3_equals_local_reruns_without_changes_and_grows(s3env, data, local_clean, tmp_path):
    out = f"s3://{s3env.bucket}/job/runs"
    s = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]
    assert s["run_dir"] == f"{out}/{local_clean.name}" and s["computed_pairs"] == N_PAIRS and s["waves"] == 2
    assert_same_rows(download(s["run_dir"], tmp_path / "copy"), local_clean)

    before = listing(s3env, "job/runs/")
    assert f"job/runs/{local_clean.name}/manifest.json" in before and not any("_lock" in k for k in before)
    again = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]
    assert again["computed_pairs"] == 0 and again["wrote_files"] == 0
    assert listing(s3env, "job/runs/") == before  # no object written, rewritten or left behind

    # A grown dataset (the same file with more rows: the same run id) computes only its new pairs.
    grown = tmp_path / "grown.tsv"
    write_tsv(grown, stsb_rows(N_PAIRS, start=40))
    first = run_job(out, "--dataset", str(grown), *FLAGS)  # type: ignore[arg-type]
    write_tsv(grown, stsb_rows(N_PAIRS + 2, start=40))
    second = run_job(out, "--dataset", str(grown), *FLAGS)  # type: ignore[arg-type]
    assert first["computed_pairs"] == N_PAIRS and second["computed_pairs"] == 2 and second["n_done"] == N_PAIRS + 2
    assert second["run_dir"] == first["run_dir"]


@pytest.mark.slow
def test_driver_killed_mid_run_on_s3_resumes_to_the_same_store(s3env, data, local_clean, tmp_path):
    """SIGKILL the driver after its first commit on S3: its lock stays behind (dead pid on this host), the
    rerun takes it over, recomputes only the second wave, and the store equals the uninterrupted local run."""
    out = f"s3://{s3env.bucket}/killed/runs"
    env = {**os.environ, **s3env.env, "PYTHONPATH": str(ROOT), "XSBERT_TEST_HOLD_AFTER_WAVE": "1"}  # kill it between the waves
    cmd = [sys.executable, "-m", "jobs.attribute", "--dataset", str(data), *FAST, *FLAGS, "--out", out, "-q"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    prefix = f"killed/runs/{local_clean.name}/pairs/"
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if listing(s3env, prefix):
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stdout.read().decode()[-3000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    left = listing(s3env, f"killed/runs/{local_clean.name}/")
    assert any(k.endswith("_lock.json") for k in left)  # the killed writer's lock is still there
    store = jstore.open_store(out, local_clean.name)
    assert 4 <= len(store.done_pair_ids()) < N_PAIRS

    s = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]
    assert s["computed_pairs"] == N_PAIRS - 4 and (s["n_in"], s["n_done"]) == (N_PAIRS, N_PAIRS)
    assert_same_rows(download(s["run_dir"], tmp_path / "copy"), local_clean)
    assert not any(k.endswith("_lock.json") for k in listing(s3env, f"killed/runs/{local_clean.name}/"))


def test_parts_on_s3_have_the_local_row_groups_and_bytes(s3env, tmp_path):
    """Parts PUT by the store's own code (the driver's commit and a stage-2 task's PartSink) are the bytes a local
    store writes: `sentences` in row groups of 4,096 rows, the rest in one."""
    store = jstore.open_store(f"s3://{s3env.bucket}/groups", "r").open()
    commit_large_rows(store)
    store.close()
    local = jstore.RunStore(tmp_path / "local", "r").open()
    commit_large_rows(local)
    local.close()
    got = download(f"s3://{s3env.bucket}/groups/r", tmp_path / "copy")
    for name in ("part-000000.parquet", "part-000001-0000000.parquet"):
        assert row_groups(got / "sentences" / name) == [4096, 4096, 1808]
        for table in ("sentences", "cells"):
            assert (got / table / name).read_bytes() == (tmp_path / "local" / "r" / table / name).read_bytes()


def test_two_writers_on_one_s3_run_one_fails_cleanly(s3env):
    first = jstore.open_store(f"s3://{s3env.bucket}/locks", "r").open()
    try:
        with pytest.raises(jstore.StoreError, match=r"another run is writing s3://.*/locks/r \(lock held by pid"):
            jstore.open_store(f"s3://{s3env.bucket}/locks", "r").open()
    finally:
        first.close()
    again = jstore.open_store(f"s3://{s3env.bucket}/locks", "r").open()  # released: the next writer gets it
    again.close()


def test_expired_lock_is_taken_over_and_the_old_writer_is_fenced(s3env, monkeypatch):
    """A writer whose lock expired (killed on another host) is replaced; if it comes back, it cannot commit."""
    import pyarrow as pa

    old = jstore.open_store(f"s3://{s3env.bucket}/fence", "r").open()
    old._beat[0].set()  # its heartbeat stops, as if its host died
    monkeypatch.setattr(old, "_lock", {**old._lock, "host": "elsewhere"})
    import boto3

    body = jstore.canonical_json({**old._lock, "expires": 0}).encode()
    boto3.client("s3").put_object(Bucket=s3env.bucket, Key="fence/r/_lock.json", Body=body)
    new = jstore.open_store(f"s3://{s3env.bucket}/fence", "r").open()
    table = pa.Table.from_pylist([{"pair_id": "a"}], schema=jstore.SCHEMAS["pairs"])
    with pytest.raises(jstore.StoreError, match="no longer this run's"):
        old.commit(0, {"pairs": table})
    new.commit(0, {"pairs": table})
    new.close()
    old.close()  # not its lock any more: nothing removed
    assert jstore.open_store(f"s3://{s3env.bucket}/fence", "r").done_pair_ids() == {"a"}


def test_workers_write_parts_while_the_driver_renews_the_lock(s3env):
    """A stage-2 task checks the writer lock before each part it PUTs while the driver's heartbeat overwrites that
    lock: a read that races an overwrite must still see the lock as this run's. (pyarrow reads an object with a
    HEAD for its size and a ranged GET: a renewal in between, one byte longer, once aborted a 404k-pair run.)"""
    import threading

    import pyarrow as pa

    store = jstore.open_store(f"s3://{s3env.bucket}/renewals", "r").open()
    stop = threading.Event()
    beats = [0]

    def heartbeat() -> None:
        while not stop.is_set():
            store.renew_lock()
            beats[0] += 1

    thread = threading.Thread(target=heartbeat, daemon=True)
    try:
        sink = store.sink()
        table = pa.Table.from_pylist([], schema=jstore.SCHEMAS["cells"])
        thread.start()
        names = [sink.write("cells", 1, first, table) for first in range(200)]
    finally:
        stop.set()
        thread.join(timeout=30)
        store.close()
    assert len(set(names)) == 200 and beats[0] >= 20  # the lock was overwritten throughout


@pytest.mark.parametrize(
    "setup,message",
    [
        ("missing-bucket", "the bucket 'no-such-bucket' does not exist"),
        ("no-endpoint", "cannot reach the storage endpoint"),
        ("credentials-in-uri", "put credentials and options in the environment"),
        ("denied", "access denied"),
    ],
)
def test_bad_store_is_one_line_exit_2_and_nothing_written(s3env, monkeypatch, capsys, tmp_path, setup, message):
    from jobs.attribute import cli

    out = f"s3://{s3env.bucket}/x"
    if setup == "missing-bucket":
        out = "s3://no-such-bucket/runs"
    elif setup == "no-endpoint":
        monkeypatch.setenv("XSBERT_STORE_RETRY_S", "1")  # the store's retries of an unreachable endpoint: 1 s
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    elif setup == "credentials-in-uri":
        out = f"s3://AKIAXXX:secret@{s3env.bucket}/runs"
    data = write_tsv(tmp_path / "p.tsv", stsb_rows(2))
    if setup == "denied":  # moto checks signatures: the environment's dummy key is unknown to it
        with s3env.auth_enforced():
            assert cli(["--dataset", str(data), *FAST, "--out", out, "-q"]) == 2
    else:
        assert cli(["--dataset", str(data), *FAST, "--out", out, "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("jobs.attribute: error: ") and message in err[-1], err
    assert "secret" not in "\n".join(err)
    if setup != "no-endpoint":
        assert not listing(s3env, "x/") and not listing(s3env, "runs/")


@pytest.mark.slow
def test_workers_without_credentials_of_their_own_fail_in_one_line(s3_ray, s3env, monkeypatch, capsys, tmp_path):
    """The driver holds a key moto lets in; the Ray workers have only the dummy key of their environment. The
    stage-2 tasks cannot write their parts: one line that says where credentials come from, exit 2, no wave
    committed, no credential in the output."""
    from jobs.attribute import cli

    out = f"s3://{s3env.bucket}/workers-denied"
    data = write_tsv(tmp_path / "p.tsv", stsb_rows(2))
    with s3env.auth_enforced() as (key_id, secret):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        assert cli(["--dataset", str(data), *FAST, "--out", out, "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("jobs.attribute: error: a stage-2 task could not write its part of the store"), err[-3:]
    assert "credentials of their own" in err[-1] and secret not in "\n".join(err)
    assert not [k for k in listing(s3env, "workers-denied/") if "/pairs/" in k or "/cells/" in k]


@pytest.mark.slow
def test_pipeline_with_store_and_reports_on_s3(s3env, tmp_path, capsys):
    """A tiny study whose store and reports live on S3 (tests/jobtools.py: check_pipeline_on_store)."""
    check_pipeline_on_store(s3env.uri("study"), lambda prefix: listing(s3env, prefix), capsys, tmp_path)
