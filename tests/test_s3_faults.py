"""A flaky object store: the run store and jobs.attribute behind a fault-injecting HTTP proxy (tests/faultproxy.py)
in front of moto_server on 127.0.0.1. The job's own clients (pyarrow's S3 filesystem, boto3) get seeded 503s, 500s,
connection resets, lost responses (the request done, its answer dropped) and blackouts.

- the store's calls (the lock's small GET and conditional PUT, listings, parts, the manifest) are retried with
  backoff, so at 20% of requests failed a job finishes with the store of a fault-free run;
- a lock create whose answer was lost is recognised as this writer's own lock (by its token), not refused;
- a call that keeps failing past the deadline (--store-retry-s) is one line naming the operation, the key and what
  came back (the HTTP status), exit 2; an unfinished multipart upload is aborted; the rerun resumes to the same
  store and rewrites a manifest that disagrees with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from faultproxy import FaultProxy
from jobtools import FAST, REFERENCE_FLAGS, REFERENCE_PAIRS, assert_same_rows, download, run_cli, run_job

from jobs import store as jstore

ROOT = Path(__file__).resolve().parents[1]
N_PAIRS = REFERENCE_PAIRS
FLAGS = REFERENCE_FLAGS  # the reference run's (tests/conftest.py reference_run)


@pytest.fixture()
def proxy(s3, monkeypatch):
    """A fresh fault proxy in front of the moto fixture, faultless until a test sets its faults; this process's
    S3 clients talk to it (AWS_ENDPOINT_URL)."""
    with FaultProxy(s3.endpoint_url, seed=7) as px:
        for key, value in s3.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", px.url)
        yield px


def uploads(s3, prefix: str) -> list[str]:
    """Keys of the unfinished multipart uploads under `prefix` (asked of moto directly)."""
    return [u["Key"] for u in s3.client().list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix).get("Uploads", [])]


def keys(s3, prefix: str) -> set[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def pairs_table(ids: list[str]) -> pa.Table:
    return pa.Table.from_pylist([{"pair_id": i} for i in ids], schema=jstore.SCHEMAS["pairs"])


# --------------------------------------------------------------------------- the store's calls, no Ray
def test_lost_answer_to_the_lock_create_is_our_own_lock(proxy, s3):
    """The conditional PUT of _lock.json lands but its answer is lost; the client's retry gets 412. The writer
    reads the lock, finds its own token and goes on (before: 'another run is writing ... lock held by pid <own>')."""
    proxy.set(rate=1.0, kinds=("lost",), match=r"^PUT .*/_lock\.json", limit=1)
    store = jstore.open_store(s3.uri("lost-lock"), "r", retry_s=20).open()
    try:
        assert proxy.faults["lost"] == 1
        store.commit(0, {"pairs": pairs_table(["a"])})
    finally:
        store.close()
    assert keys(s3, "lost-lock/r/") == {"lost-lock/r/pairs/part-000000.parquet"}  # the lock is gone with its writer


def test_store_calls_at_20_percent_faults_all_succeed(proxy, s3):
    """Every kind of call the driver makes (lock GET/PUT/DELETE, listings, part PUTs and GETs, the manifest) through
    a proxy that fails 20% of requests, seeded: the same objects as without faults."""
    proxy.set(rate=0.2)
    store = jstore.open_store(s3.uri("flaky"), "r", retry_s=60).open()
    try:
        for seq in range(3):
            store.commit(seq, {"quarantine": jstore.SCHEMAS["quarantine"].empty_table(),
                               "pairs": pairs_table([f"p{seq}{k}" for k in range(3)])}, keep_empty=True)  # fmt: skip
            store.sink().write("cells", seq, 0, jstore.SCHEMAS["cells"].empty_table())
        store.write_manifest({"runs": [], "n": 3})
        assert store.read_manifest() == {"runs": [], "n": 3}
        assert store.done_pair_ids() == {f"p{s}{k}" for s in range(3) for k in range(3)}
        assert store.counts()["pairs"] == 9
    finally:
        store.close()
    assert sum(proxy.faults.values()) >= 5, proxy.faults  # the faults really happened
    assert not uploads(s3, "flaky/")
    assert len([k for k in keys(s3, "flaky/r/") if k.endswith(".parquet")]) == 9 and "flaky/r/_lock.json" not in keys(
        s3, "flaky/r/"
    )


@pytest.mark.parametrize("kind", ["503", "500", "reset"])
def test_a_call_failing_past_the_deadline_is_one_line_with_key_and_status(proxy, s3, kind):
    """The manifest's upload fails on every try: a StoreError that names the operation, the key and what came back
    (the HTTP status, or no response), with the tries and the setting; no credentials hint; no unfinished upload."""
    store = jstore.open_store(s3.uri(f"deadline-{kind}"), "r", retry_s=2).open()
    try:
        proxy.set(rate=1.0, kinds=(kind,), match=r"^(PUT|POST) \S*/manifest\.json")
        t0 = time.monotonic()
        with pytest.raises(jstore.StoreError) as err:
            store.write_manifest({"runs": []})
        waited = time.monotonic() - t0
        proxy.set(rate=0.0)
    finally:
        store.close()
    text = str(err.value)
    want = {"503": "HTTP 503", "500": "HTTP 500", "reset": "no response"}[kind]
    assert "cannot write manifest.json" in text and want in text and "given up after" in text, text
    assert "--store-retry-s" in text and "credentials" not in text and "\n" not in text
    assert waited < 30
    assert not uploads(s3, f"deadline-{kind}/")


def test_unfinished_multipart_upload_is_aborted(proxy, s3):
    """A part's upload whose parts keep failing: the upload pyarrow opened is aborted, not left behind."""
    store = jstore.open_store(s3.uri("multipart"), "r", retry_s=1).open()
    try:
        proxy.set(rate=1.0, kinds=("500",), match=r"^(PUT|POST) .*pairs/part-000000\.parquet\?.*uploadId=")
        with pytest.raises(jstore.StoreError, match=r"cannot write pairs/part-000000\.parquet: .*HTTP 500"):
            store.commit(0, {"pairs": pairs_table(["a"])})
        proxy.set(rate=0.0)
        assert not uploads(s3, "multipart/")
    finally:
        store.close()


def test_lost_answer_to_an_abort_is_done_not_retried_until_the_deadline(proxy, s3):
    """An unfinished multipart upload is aborted, but the abort's answer is lost: the client's own retry finds no
    such upload (404 NoSuchUpload), which means the abort is done. Before, NoSuchUpload counted as transient: the
    abort was retried until the deadline, then given up (and every later upload of the listing skipped)."""
    from jobs.store.clients import abort_uploads

    key = "abort-lost/r/cells/part-000000-0000000.parquet"
    s3.client().create_multipart_upload(Bucket=s3.bucket, Key=key)
    assert uploads(s3, "abort-lost/") == [key]
    proxy.set(rate=1.0, kinds=("lost",), match=r"^DELETE .*uploadId=", limit=1)
    t0 = time.monotonic()
    aborted = abort_uploads(s3.uri("abort-lost"), f"{s3.bucket}/abort-lost/r", deadline_s=30)
    assert proxy.faults["lost"] == 1
    assert aborted == [f"{s3.bucket}/{key}"] and time.monotonic() - t0 < 10
    assert not uploads(s3, "abort-lost/")


_COMMIT_ONE = """
import sys
if sys.argv[2] == "entry-point":
    from jobs.console import quiet_console
    quiet_console()  # what jobs.attribute, jobs.parse, jobs.pipeline and xsbert sql/serve/show do first
import pyarrow as pa
from jobs import store as jstore
store = jstore.open_store(sys.argv[1], "r", retry_s=30).open()
store.commit(0, {"pairs": pa.Table.from_pylist([{"pair_id": "a"}], schema=jstore.SCHEMAS["pairs"])})
store.close()
print("committed")
"""


def test_pyarrows_own_s3_retry_notices_stay_off_the_console(proxy, s3):
    """A SlowDown answer to completing an upload: pyarrow's S3 client retries it itself and prints
    `s3fs.cc:NNN: CompletedMultipartUpload got error embedded in a 200 OK response: SlowDown ..., retry = 1` on fd 2.
    The write succeeds either way; the command-line entry points keep the line off the console (before: it reached
    the job's output), and nothing else of stderr is dropped."""
    env = {**os.environ, **s3.env, "AWS_ENDPOINT_URL": proxy.url, "PYTHONPATH": str(ROOT)}
    seen = {}
    for mode in ("bare", "entry-point"):
        proxy.set(rate=1.0, kinds=("503",), match=r"^POST .*pairs/part-000000\.parquet\?uploadId=", limit=1)
        done = subprocess.run([sys.executable, "-c", _COMMIT_ONE, s3.uri(f"notices-{mode}"), mode], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and "committed" in done.stdout, done.stderr[-2000:]
        assert proxy.faults["503"] >= 1
        seen[mode] = done.stderr
    assert "s3fs.cc" in seen["bare"] and "SlowDown" in seen["bare"], seen["bare"]  # the fault makes the notice
    assert "s3fs.cc" not in seen["entry-point"] and "SlowDown" not in seen["entry-point"], seen["entry-point"]


def test_denied_is_the_only_failure_with_a_credentials_hint(proxy, s3):
    """403 (moto checking signatures): access denied, with where a cluster gets credentials; never runtime_env."""
    with s3.auth_enforced():
        with pytest.raises(jstore.StoreError) as err:
            jstore.open_store(s3.uri("denied"), "r", retry_s=2).open()
    text = str(err.value)
    assert "access denied (HTTP 403" in text and "instance profile" in text and "runtime_env" not in text, text


# --------------------------------------------------------------------------- the job
@pytest.fixture(scope="module")
def data(reference_run) -> Path:
    return reference_run[0]


@pytest.fixture(scope="module")
def clean(s3_ray, reference_run) -> Path:
    """The fault-free run (tests/conftest.py reference_run; s3_ray: the module's Ray)."""
    return reference_run[1]


@pytest.mark.slow
def test_job_at_20_percent_faults_equals_a_fault_free_run(s3_ray, proxy, s3, data, clean, tmp_path):
    """Every request of the driver and of the stage-2 tasks (they reach the store through the same proxy: the
    driver's endpoint travels to them) fails with probability 0.2: the job finishes, the store holds the fault-free
    run's rows, no lock or unfinished upload is left, and a rerun (still at 20%) computes nothing."""
    proxy.set(rate=0.2)
    out = s3.uri("flaky-job")
    s = run_job(out, "--dataset", str(data), *FLAGS, "--store-retry-s", "60")  # type: ignore[arg-type]
    assert s["computed_pairs"] == N_PAIRS and sum(proxy.faults.values()) >= 10, proxy.faults
    again = run_job(out, "--dataset", str(data), *FLAGS, "--store-retry-s", "60")  # type: ignore[arg-type]
    assert again["computed_pairs"] == 0
    proxy.set(rate=0.0)
    assert_same_rows(download(s["run_dir"], tmp_path / "copy"), clean)
    left = keys(s3, "flaky-job/")
    assert not [k for k in left if k.endswith("_lock.json")] and not uploads(s3, "flaky-job/")


def _job_process(out: str, data: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    """jobs.attribute in a process of its own (a lock it cannot remove stays behind it, for the next run to take
    over); in this process: jobtools.run_cli."""
    cmd = [sys.executable, "-m", "jobs.attribute", "--dataset", str(data), *FAST, *FLAGS, "--out", out, "-q", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_blackout_mid_run_stops_in_one_line_and_the_rerun_resumes(s3_ray, proxy, s3, data, clean, tmp_path,
                                                                   capsys):  # fmt: skip
    """The endpoint goes dark once wave 1 is committed: the job (a process of its own) stops after --store-retry-s
    in one line (exit 2, what failed and after how long), wave 1 stays committed, and the same command then resumes
    to the fault-free store, taking over the lock the dark endpoint kept."""
    out = s3.uri("blackout")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": s3_ray.get_runtime_context().gcs_address}
    stop = threading.Event()

    def darken() -> None:  # watches the store directly (not through the proxy) for wave 1's commit
        while not stop.is_set():
            if any("/pairs/" in k for k in keys(s3, "blackout/")):
                proxy.blackout(600)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=darken, daemon=True)
    watcher.start()
    try:
        failed = _job_process(out, data, env, "--store-retry-s", "3")
    finally:
        stop.set()
        watcher.join(timeout=10)
        proxy.blackout(0)
    err = failed.stderr.strip().splitlines()
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert err[-1].startswith("jobs.attribute: error: ") and "Traceback" not in failed.stderr, err[-5:]
    assert "no response" in err[-1] and "--store-retry-s" in err[-1], err[-1]
    assert proxy.faults["blackout"] > 0
    rid = clean.name
    assert len(jstore.open_store(out, rid).done_pair_ids()) == 4  # wave 1 committed, wave 2 not

    code, stdout, err = run_cli(capsys, out, "--dataset", str(data), *FLAGS)
    assert code == 0, err[-20:]
    assert f"{N_PAIRS} pairs in = {N_PAIRS} done" in stdout
    assert_same_rows(download(f"{out}/{rid}", tmp_path / "copy"), clean)


@pytest.mark.slow
def test_failed_manifest_write_is_one_line_and_the_rerun_rewrites_it(s3_ray, proxy, s3, data, clean, capsys):
    """Every PUT of manifest.json fails (500) after the pairs are committed: one line naming manifest.json and
    HTTP 500, exit 2 (before: a raw traceback, exit 1). The rerun has nothing to compute, yet it sees that the
    manifest disagrees with the store (there is none) and writes it (before: the manifest stayed stale). The driver
    writes the manifest, whatever the executor: --executor local, no actor to start."""
    out = s3.uri("manifest")
    proxy.set(rate=1.0, kinds=("500",), match=r"^(PUT|POST) \S*/manifest\.json")
    code, _, err = run_cli(capsys, out, "--dataset", str(data), *FLAGS, "--store-retry-s", "2", "--executor", "local")
    proxy.set(rate=0.0)
    assert code == 2 and not any("Traceback" in line for line in err), err[-20:]
    assert "manifest.json" in err[-1] and "HTTP 500" in err[-1], err[-1]
    rid = clean.name
    assert jstore.open_store(out, rid).read_manifest() is None

    code, stdout, err = run_cli(capsys, out, "--dataset", str(data), *FLAGS)
    assert code == 0 and "computed now        0 pairs" in stdout, stdout + "\n".join(err[-20:])
    manifest = jstore.open_store(out, rid).read_manifest()
    assert manifest["tables"]["pairs"]["rows"] == N_PAIRS and manifest["tables"]["pairs"]["parts"] == 2


def test_a_job_that_dies_mid_wave_on_s3_leaves_readers_the_committed_waves(proxy, s3, data, capsys):
    """Wave 2's `pairs` part cannot be written (every try answered 500) and, after the job stopped in one line, its
    other parts cannot be deleted either: they stay on S3. `xsbert sql` reads the committed wave only (4 pairs and
    their cells; before: the cells of 8 pairs against 4 in `pairs`); the rerun removes them and completes the run."""
    from jobs.attribute import cli as attribute_cli
    from jobs.cli import main as xsbert

    out = s3.uri("mid-wave")
    argv = ["--dataset", str(data), *FAST, *FLAGS, "--executor", "local", "--cpus-per-actor", "1", "--out", out, "-q"]
    proxy.set(rate=1.0, kinds=("500",), match=r"^((PUT|POST) \S*/pairs/part-000001\.parquet|DELETE \S*/part-000001)")
    code = attribute_cli([*argv, "--store-retry-s", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    proxy.set(rate=0.0)
    assert code == 2 and err[-1].startswith("jobs.attribute: error: ") and "pairs/part-000001.parquet" in err[-1], err
    left = keys(s3, "mid-wave/")
    assert [k for k in left if "/cells/part-000001" in k] and not [k for k in left if "/pairs/part-000001" in k], left
    run = next(k for k in left if "/pairs/part-000000" in k).split("/pairs/")[0]
    uri = f"s3://{s3.bucket}/{run}"
    counts = "select (select count(*) from pairs), (select count(distinct pair_id) from cells), " \
             "(select count(distinct pair_id) from word_cells)"  # fmt: skip
    assert xsbert(["sql", "--run", uri, counts, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "4,4,4"
    assert attribute_cli(argv) == 0
    capsys.readouterr()
    assert xsbert(["sql", "--run", uri, counts, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{N_PAIRS},{N_PAIRS},{N_PAIRS}"

