"""One test body, every object-store backend of the store: jobs.attribute and the pipeline with `--out` on S3
(moto's standalone server on 127.0.0.1, tests/s3tools.py) or GCS (gcp-storage-emulator on 127.0.0.1 with GCS's
ifGenerationMatch precondition, tests/gcstools.py), reached over HTTP by the same pyarrow, boto3 and
google-cloud-storage code a cluster uses. The same guarantees on each, checked on values against a local run (the
local store's own: tests/test_job.py and tests/test_job_faults.py). A test that needs what one backend has (moto
checks credentials, the emulator does not) runs on that one. (Reading S3 runs with `xsbert sql` and jobs.report:
tests/test_s3_sql.py.)

Adding a backend: a fixture in tests/conftest.py whose server has .family, .env, .uri(), .listing(), .upload()
(tests/s3tools.py, tests/gcstools.py), and its name in OBJECT below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jobtools import (
    FAST,
    REFERENCE_FLAGS,
    REFERENCE_PAIRS,
    assert_same_rows,
    check_pipeline_on_store,
    commit_large_rows,
    download,
    hooked_attribute,
    kill_after_first_commit,
    row_groups,
    run_job,
    stsb_rows,
    write_tsv,
)

from jobs import store as jstore

ROOT = Path(__file__).resolve().parents[1]
N_PAIRS = REFERENCE_PAIRS
FLAGS = REFERENCE_FLAGS  # the reference run's (tests/conftest.py reference_run)
OBJECT = ("s3", "gcs")  # the backends: each with a bucket, an endpoint and a writer-lock object
SCHEME = {"s3": "s3", "gcs": "gs"}


# --------------------------------------------------------------------------- the fixture layer
@dataclass
class Backend:
    """One backend as the tests use it: where runs go (`uri`), what is stored under a prefix (`listing`: name ->
    what changes when the object is rewritten)."""

    name: str
    server: Any  # S3Server / GcsServer

    @property
    def bucket(self) -> str:
        return self.server.bucket

    def uri(self, *parts: str) -> str:
        return self.server.uri(*parts)

    def listing(self, prefix: str = "") -> dict[str, Any]:
        return self.server.listing(prefix)

    def lock(self, key: str) -> jstore.LockObject:
        """The writer-lock object `key` of the bucket, through the store's own client."""
        return jstore.LockObject(self.server.family, self.bucket, key)

    def subprocess_env(self) -> dict[str, str]:
        return self.server.subprocess_env()


@pytest.fixture()
def backend(request, monkeypatch) -> Backend:
    """The backend named by the test's parameter, its endpoint and credentials in this process's environment."""
    name = request.param
    server = request.getfixturevalue(name)
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    if name == "gcs":
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return Backend(name, server)


def on(*names: str):
    return pytest.mark.parametrize("backend", names, indirect=True)


@pytest.fixture(scope="module")
def data(reference_run) -> Path:
    return reference_run[0]


@pytest.fixture(scope="module")
def local_clean(s3_ray, reference_run) -> Path:
    """The uninterrupted local run every backend's store is compared with (tests/conftest.py reference_run; s3_ray:
    the module's Ray, its workers with the S3 endpoint and credentials of their own)."""
    return reference_run[1]


# --------------------------------------------------------------------------- the job on every backend
@pytest.mark.slow
@on(*OBJECT)
def test_job_equals_local_reruns_without_changes_and_grows(backend, data, local_clean, tmp_path):
    """Workers write the cells (they get the endpoint, not the driver's environment); a run grown from the first 4
    pairs to all 8 (--limit is not in the run id: the same run; grown by the driver alone, --executor local, which is
    not in it either) computes only the new ones, and the store equals the local run's cell by cell; a rerun writes
    nothing (ETags, generations and MD5s unchanged). (A local store: the reference run is one; its growth and its
    rerun that writes nothing, tests/test_job.py.)"""
    out = backend.uri("job/runs")
    first = run_job(out, "--dataset", str(data), *FLAGS, "--limit", "4")  # type: ignore[arg-type]
    s = run_job(out, "--dataset", str(data), *FLAGS, "--executor", "local")  # type: ignore[arg-type]
    assert first["run_dir"] == s["run_dir"] == f"{out}/{local_clean.name}"
    assert (first["computed_pairs"], s["computed_pairs"], s["n_done"]) == (4, N_PAIRS - 4, N_PAIRS)
    assert_same_rows(download(s["run_dir"], tmp_path / "copy"), local_clean)

    before = backend.listing("job/runs/")
    assert f"job/runs/{local_clean.name}/manifest.json" in before and not any("_lock" in k for k in before)
    assert any(f"/{local_clean.name}/cells/part-" in k for k in before)
    again = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]
    assert again["computed_pairs"] == 0 and again["wrote_files"] == 0
    assert backend.listing("job/runs/") == before  # no object written, rewritten or left behind


@pytest.mark.slow
@on("s3")
def test_driver_killed_mid_run_resumes_to_the_same_store(s3_ray, backend, data, local_clean, tmp_path):
    """SIGKILL the driver (a process of its own, joined to the module's Ray) after its first commit: its lock stays
    behind (a dead pid on this host), the rerun takes it over, recomputes only the second wave, and the store equals
    the uninterrupted local run. (A local run's killed driver: tests/test_job_faults.py. On GCS: a lock is taken over
    by the same steps whatever made it stale, test_expired_lock_is_taken_over_and_the_old_writer_is_fenced, and a job
    resumes there as it grows, test_job_equals_local_reruns_without_changes_and_grows.)"""
    out = backend.uri("killed/runs")
    env = {**backend.subprocess_env(), "PYTHONPATH": str(ROOT)}
    cmd = hooked_attribute("--dataset", str(data), *FAST, *FLAGS, "--out", out, "-q", "--ray-address",
                           s3_ray.get_runtime_context().gcs_address,
                           hold_after_wave=1)  # the driver holds after its first commit: killed between the waves
    kill_after_first_commit(cmd, env, lambda: bool(backend.listing(f"killed/runs/{local_clean.name}/pairs/")),
                            timeout=240, poll=0.2)  # fmt: skip
    assert f"killed/runs/{local_clean.name}/_lock.json" in backend.listing("killed/runs/")  # the killed writer's
    assert 4 <= len(jstore.open_store(out, local_clean.name).done_pair_ids()) < N_PAIRS

    s = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]
    assert s["computed_pairs"] == N_PAIRS - 4 and (s["n_in"], s["n_done"]) == (N_PAIRS, N_PAIRS)
    assert_same_rows(download(s["run_dir"], tmp_path / "copy"), local_clean)
    assert not any(k.endswith("_lock.json") for k in backend.listing(f"killed/runs/{local_clean.name}/"))


@on(*OBJECT)
def test_parts_have_the_local_row_groups_and_bytes(backend, tmp_path):
    """Parts PUT by the store's own code (the driver's commit and a stage-2 task's PartSink) are the bytes a local
    store writes: `sentences` in row groups of 4,096 rows, the rest in one."""
    store = jstore.open_store(backend.uri("groups"), "r").open()
    commit_large_rows(store)
    store.close()
    local = jstore.RunStore(tmp_path / "local", "r").open()
    commit_large_rows(local)
    local.close()
    got = download(backend.uri("groups", "r"), tmp_path / "copy")
    for name in ("part-000000.parquet", "part-000001-0000000.parquet"):
        assert row_groups(got / "sentences" / name) == [4096, 4096, 1808]
        for table in ("sentences", "cells"):
            assert (got / table / name).read_bytes() == (tmp_path / "local" / "r" / table / name).read_bytes()


# --------------------------------------------------------------------------- the writer lock on object storage
@on(*OBJECT)
def test_two_writers_on_one_run_one_fails_cleanly(backend):
    first = jstore.open_store(backend.uri("locks"), "r").open()
    try:
        assert "locks/r/_lock.json" in backend.listing("locks/")
        with pytest.raises(jstore.StoreError,
                           match=rf"another run is writing {SCHEME[backend.name]}://.*/locks/r \(lock held by pid"):  # fmt: skip
            jstore.open_store(backend.uri("locks"), "r").open()
    finally:
        first.close()
    assert not backend.listing("locks/")  # released
    again = jstore.open_store(backend.uri("locks"), "r").open()  # the next writer gets it
    again.close()


@on(*OBJECT)
def test_lock_is_created_only_if_absent_on_the_endpoint(backend):
    """The conditional create itself, without the store's read-before-create: the second create is refused by
    the endpoint (S3 If-None-Match: * and GCS ifGenerationMatch=0 -> 412), not by a check on our side."""
    lock = backend.lock("cond/_lock.json")
    assert lock.create(b'{"token": "a"}') is True
    assert lock.create(b'{"token": "b"}') is False
    assert json.loads(lock.read()) == {"token": "a"}
    lock.delete()
    assert lock.read() is None and lock.create(b'{"token": "c"}') is True
    lock.delete()


@on(*OBJECT)
def test_expired_lock_is_taken_over_and_the_old_writer_is_fenced(backend, monkeypatch):
    """A writer whose lock expired (killed on another host) is replaced; if it comes back, it cannot commit."""
    import pyarrow as pa

    old = jstore.open_store(backend.uri("fence"), "r").open()
    old._beat[0].set()  # its heartbeat stops, as if its host died
    monkeypatch.setattr(old, "_lock", {**old._lock, "host": "elsewhere"})
    backend.lock("fence/r/_lock.json").put(jstore.canonical_json({**old._lock, "expires": 0}).encode())
    new = jstore.open_store(backend.uri("fence"), "r").open()
    table = pa.Table.from_pylist([{"pair_id": "a"}], schema=jstore.SCHEMAS["pairs"])
    with pytest.raises(jstore.StoreError, match="no longer this run's"):
        old.commit(0, {"pairs": table})
    new.commit(0, {"pairs": table})
    new.close()
    old.close()  # not its lock any more: nothing removed
    assert jstore.open_store(backend.uri("fence"), "r").done_pair_ids() == {"a"}


@on("s3")
def test_workers_write_parts_while_the_driver_renews_the_lock(backend):
    """A stage-2 task checks the writer lock before each part it PUTs while the driver's heartbeat overwrites that
    lock: a read that races an overwrite must still see the lock as this run's. (pyarrow reads an object with a
    HEAD for its size and a ranged GET: a renewal in between, one byte longer, once aborted a 404k-pair run.)"""
    import threading

    import pyarrow as pa

    store = jstore.open_store(backend.uri("renewals"), "r").open()
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


# --------------------------------------------------------------------------- a bad store: one line, exit 2
# (backend, setup) -> what the line says. The emulator checks no credentials: denied credentials on S3 only.
BAD = {
    ("s3", "missing-bucket"): "the bucket 'no-such-bucket' does not exist",
    ("s3", "no-endpoint"): "cannot reach the storage endpoint",
    ("s3", "credentials-in-uri"): "put credentials and options in the environment",
    ("s3", "denied"): "access denied",
    ("gcs", "missing-bucket"): "the bucket 'no-such-bucket' does not exist",
    ("gcs", "no-endpoint"): "cannot reach the storage endpoint (STORAGE_EMULATOR_HOST / network)",
    ("gcs", "credentials-in-uri"): "put credentials and options in the environment",
}


@pytest.mark.parametrize(("backend", "setup"), list(BAD), indirect=["backend"])
def test_bad_store_is_one_line_exit_2_and_nothing_written(backend, setup, monkeypatch, capsys, tmp_path):
    from jobs.attribute import cli

    scheme = SCHEME[backend.name]
    out = backend.uri("bad")
    if setup == "missing-bucket":
        out = f"{scheme}://no-such-bucket/runs"
    elif setup == "no-endpoint":
        monkeypatch.setenv("XSBERT_STORE_RETRY_S", "1")  # the store's retries of an unreachable endpoint: 1 s
        endpoint = {"s3": "AWS_ENDPOINT_URL", "gcs": "STORAGE_EMULATOR_HOST"}[backend.name]
        monkeypatch.setenv(endpoint, "http://127.0.0.1:9")  # nothing listens on the discard port
        monkeypatch.setenv("XSBERT_GCS_RETRY_S", "1")
    elif setup == "credentials-in-uri":
        out = f"{scheme}://AKIAXXX:secret@{backend.bucket}/runs"
    data = write_tsv(tmp_path / "p.tsv", stsb_rows(2))
    if setup == "denied":  # moto checks signatures: the environment's dummy key is unknown to it
        with backend.server.auth_enforced():
            assert cli(["--dataset", str(data), *FAST, "--out", out, "-q"]) == 2
    else:
        assert cli(["--dataset", str(data), *FAST, "--out", out, "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("jobs.attribute: error: ") and BAD[backend.name, setup] in err[-1], err
    assert "secret" not in "\n".join(err)
    assert not backend.listing("bad/") and not backend.listing("runs/")  # (listed at the server's own endpoint)


@pytest.mark.slow
@on("s3")
def test_workers_without_credentials_of_their_own_fail_in_one_line(s3_ray, backend, monkeypatch, capsys, tmp_path):
    """The driver holds a key moto lets in; the Ray workers have only the dummy key of their environment. The
    stage-2 tasks cannot write their parts: one line that says where credentials come from, exit 2, no wave
    committed, no credential in the output."""
    from jobs.attribute import cli

    out = backend.uri("workers-denied")
    data = write_tsv(tmp_path / "p.tsv", stsb_rows(2))
    with backend.server.auth_enforced() as (key_id, secret):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        assert cli(["--dataset", str(data), *FAST, "--out", out, "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("jobs.attribute: error: a stage-2 task could not write its part of the store"), err[-3:]
    assert "credentials of their own" in err[-1] and secret not in "\n".join(err)
    assert not [k for k in backend.listing("workers-denied/") if "/pairs/" in k or "/cells/" in k]


@pytest.mark.slow
@on(*OBJECT)
def test_pipeline_with_store_and_reports_on_object_storage(backend, tmp_path, capsys):
    """A tiny study whose store and reports live on object storage (tests/jobtools.py: check_pipeline_on_store)."""
    check_pipeline_on_store(backend.uri("study"), backend.listing, capsys, tmp_path)


# --------------------------------------------------------------------------- reading gs:// runs
# (The same for s3:// runs, with faults: tests/test_s3_sql.py.)
@pytest.fixture(scope="module")
def hand(tmp_path_factory, gcs) -> dict[str, tuple[Path, Path | None, str, str | None]]:
    """tests/test_sql.py's hand-built run (and second run) for each sql/ file, locally and on GCS."""
    from test_sql import FILES, store_for

    root = tmp_path_factory.mktemp("gcs-hand")
    stores = {}
    for name in FILES:
        stem = name.removesuffix(".sql")
        run, run2 = store_for(name, root / stem)
        stores[name] = (run, run2, gcs.upload(run, f"hand/{stem}"),
                        gcs.upload(run2, f"hand/{stem}") if run2 is not None else None)  # fmt: skip
    return stores


@on("gcs")
def test_xsbert_sql_gives_the_local_rows_for_every_file(hand, backend, capsys):
    from test_s3_sql import file_vars, same_csv
    from test_sql import xsbert_sql

    for name, (run, run2, uri, uri2) in hand.items():
        args = ["--file", name, "--csv", *[f"--var={k}={v}" for k, v in file_vars(name).items()]]
        local = xsbert_sql(capsys, "--run", str(run), *(["--run2", str(run2)] if run2 else []), *args)
        remote = xsbert_sql(capsys, "--run", uri, *(["--run2", uri2] if uri2 else []), *args)
        assert local[0] == remote[0] == 0 and local[1].strip(), (name, local, remote)
        assert same_csv(remote[1], local[1]), name


@on("gcs")
def test_report_on_a_remote_run_states_the_local_findings(tmp_path_factory, backend, tmp_path):
    import numpy as np
    from test_s3_sql import same
    from test_sql import random_parses, random_run, write_table

    from jobs import report

    rng = np.random.default_rng(21)
    main, data = random_run(tmp_path_factory.mktemp("gcs-report"), "main", rng, n_pairs=30, bias={"cat": 1.0})
    write_table(main, "parses", random_parses(data, rng))
    uri = backend.server.upload(main, "report")
    assert report.cli(["--run", str(main), "--var", "min_count=3", "--out", str(tmp_path / "local"), "-q"]) == 0
    assert report.cli(["--run", uri, "--var", "min_count=3", "--out", str(tmp_path / "gcs"), "-q"]) == 0
    local = json.loads((tmp_path / "local" / "report.json").read_text(encoding="utf-8"))
    text = (tmp_path / "gcs" / "report.json").read_text(encoding="utf-8")
    remote = json.loads(text.replace(uri, str(main)))
    assert uri in text
    for doc in (local, remote):
        doc.pop("command")
    assert same(remote, local)
    assert {"table1", "syntactic_relations", "lexical_ranks"} <= {s["name"] for s in local["sections"]
                                                                   if s["status"] == "ok"}  # fmt: skip


@on("gcs")
def test_bad_remote_locations_are_one_line_exit_2(backend, monkeypatch, capsys):
    from test_sql import xsbert_sql

    cases = [(backend.uri("nowhere/run"), "no such directory"), ("gs://no-such-bucket/run", "no such bucket"),
             ("gs://user:top-secret@b/run", "URI with credentials in it: not accepted")]  # fmt: skip
    for uri, want in cases:
        code, out, err = xsbert_sql(capsys, "--run", uri, "select 1")
        assert code == 2 and not out and len(err.strip().splitlines()) == 1 and err.startswith("xsbert sql: error: ")
        assert want in err and "top-secret" not in err, err
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("XSBERT_GCS_RETRY_S", "1")
    monkeypatch.setenv("XSBERT_STORE_RETRY_S", "1")  # the read side's own retries (jobs/store/retry.py)
    code, out, err = xsbert_sql(capsys, "--run", backend.uri("nowhere/run"), "select 1")
    assert code == 2 and "cannot reach the object store at http://127.0.0.1:9" in err, err
