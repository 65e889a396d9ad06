"""The store on Google Cloud Storage: jobs.attribute writes `--out gs://...`, `xsbert sql` and jobs.report read it,
against a real GCS endpoint (gcp-storage-emulator on 127.0.0.1, the `gcs` fixture, tests/gcstools.py) reached over
HTTP by the same pyarrow and google-cloud-storage code a cluster uses (STORAGE_EMULATOR_HOST is the standard way to
point both at another endpoint). The same guarantees as on a local disk and on S3, checked on values against a
local run. (The emulator checks no credentials, so denied credentials are tested on S3 only: tests/test_s3_job.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobtools import FAST, assert_same_rows, check_pipeline_on_store, download, run_job, stsb_rows, write_tsv

from jobs import store as jstore

ROOT = Path(__file__).resolve().parents[1]
N_PAIRS = 8
FLAGS = ["--wave-size", "4", "--batch-size", "4", "--num-actors", "1"]


@pytest.fixture()
def gcsenv(gcs, monkeypatch):
    """The emulator's endpoint in this process's environment (STORAGE_EMULATOR_HOST)."""
    for key, value in gcs.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return gcs


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_tsv(tmp_path_factory.mktemp("gcs-data") / "pairs.tsv", stsb_rows(N_PAIRS, start=40))


@pytest.fixture(scope="module")
def local_clean(ray_cluster, data, tmp_path_factory) -> Path:
    s = run_job(tmp_path_factory.mktemp("local"), "--dataset", str(data), *FLAGS)
    return Path(s["run_dir"])


@pytest.mark.slow
def test_job_on_gcs_equals_local_reruns_without_changes_and_grows(gcsenv, data, local_clean, tmp_path):
    """Workers write the cells (they get the endpoint, not the driver's environment); the store equals the local
    run's cell by cell; a rerun writes no object (generations and MD5s unchanged); a grown dataset computes only
    its new pairs."""
    out = gcsenv.uri("job/runs")
    s = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]
    assert s["run_dir"] == f"{out}/{local_clean.name}" and s["computed_pairs"] == N_PAIRS and s["waves"] == 2
    assert_same_rows(download(s["run_dir"], tmp_path / "copy"), local_clean)

    before = gcsenv.listing("job/runs/")
    assert f"job/runs/{local_clean.name}/manifest.json" in before and not any("_lock" in k for k in before)
    assert any(f"/{local_clean.name}/cells/part-" in k for k in before)
    again = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]
    assert again["computed_pairs"] == 0 and again["wrote_files"] == 0
    assert gcsenv.listing("job/runs/") == before  # no object written, rewritten or left behind

    grown = tmp_path / "grown.tsv"
    write_tsv(grown, stsb_rows(N_PAIRS, start=40))
    first = run_job(out, "--dataset", str(grown), *FLAGS)  # type: ignore[arg-type]
    write_tsv(grown, stsb_rows(N_PAIRS + 2, start=40))
    second = run_job(out, "--dataset", str(grown), *FLAGS)  # type: ignore[arg-type]
    assert first["computed_pairs"] == N_PAIRS and second["computed_pairs"] == 2 and second["n_done"] == N_PAIRS + 2


@pytest.mark.slow
def test_driver_killed_mid_run_on_gcs_resumes_to_the_same_store(gcsenv, data, local_clean, tmp_path):
    """SIGKILL the driver after its first commit: its lock stays behind (a dead pid on this host), the rerun takes
    it over, recomputes only the second wave, and the store equals the uninterrupted local run."""
    out = gcsenv.uri("killed/runs")
    env = {**gcsenv.subprocess_env(), "PYTHONPATH": str(ROOT), "XSBERT_TEST_HOLD_AFTER_WAVE": "1"}  # kill it between the waves
    cmd = [sys.executable, "-m", "jobs.attribute", "--dataset", str(data), *FAST, *FLAGS, "--out", out, "-q"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if gcsenv.listing(f"killed/runs/{local_clean.name}/pairs/"):
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stdout.read().decode()[-3000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert f"killed/runs/{local_clean.name}/_lock.json" in gcsenv.listing("killed/runs/")
    assert 4 <= len(jstore.open_store(out, local_clean.name).done_pair_ids()) < N_PAIRS

    s = run_job(out, "--dataset", str(data), *FLAGS)  # type: ignore[arg-type]
    assert s["computed_pairs"] == N_PAIRS - 4 and (s["n_in"], s["n_done"]) == (N_PAIRS, N_PAIRS)
    assert_same_rows(download(s["run_dir"], tmp_path / "copy"), local_clean)
    assert not any(k.endswith("_lock.json") for k in gcsenv.listing(f"killed/runs/{local_clean.name}/"))


def test_two_writers_on_one_gcs_run_one_fails_cleanly(gcsenv):
    first = jstore.open_store(gcsenv.uri("locks"), "r").open()
    try:
        assert "locks/r/_lock.json" in gcsenv.listing("locks/")
        with pytest.raises(jstore.StoreError, match=r"another run is writing gs://.*/locks/r \(lock held by pid"):
            jstore.open_store(gcsenv.uri("locks"), "r").open()
    finally:
        first.close()
    assert not gcsenv.listing("locks/")  # released
    again = jstore.open_store(gcsenv.uri("locks"), "r").open()  # the next writer gets it
    again.close()


def test_lock_is_created_only_if_absent_on_the_endpoint(gcsenv):
    """The conditional create itself, without the store's read-before-create: the second create is refused by
    the endpoint (ifGenerationMatch=0 -> 412), not by a check on our side."""
    lock = jstore.LockObject("gcs", gcsenv.bucket, "cond/_lock.json")
    assert lock.create(b'{"token": "a"}') is True
    assert lock.create(b'{"token": "b"}') is False
    assert json.loads(lock.read()) == {"token": "a"}
    lock.delete()
    assert lock.read() is None and lock.create(b'{"token": "c"}') is True
    lock.delete()


def test_expired_lock_is_taken_over_and_the_old_writer_is_fenced(gcsenv, monkeypatch):
    """A writer whose lock expired (killed on another host) is replaced; if it comes back, it cannot commit."""
    import pyarrow as pa

    old = jstore.open_store(gcsenv.uri("fence"), "r").open()
    old._beat[0].set()  # its heartbeat stops, as if its host died
    monkeypatch.setattr(old, "_lock", {**old._lock, "host": "elsewhere"})
    jstore.LockObject("gcs", gcsenv.bucket, "fence/r/_lock.json").put(
        jstore.canonical_json({**old._lock, "expires": 0}).encode()
    )
    new = jstore.open_store(gcsenv.uri("fence"), "r").open()
    table = pa.Table.from_pylist([{"pair_id": "a"}], schema=jstore.SCHEMAS["pairs"])
    with pytest.raises(jstore.StoreError, match="no longer this run's"):
        old.commit(0, {"pairs": table})
    new.commit(0, {"pairs": table})
    new.close()
    old.close()  # not its lock any more: nothing removed
    assert jstore.open_store(gcsenv.uri("fence"), "r").done_pair_ids() == {"a"}


@pytest.mark.parametrize(
    "setup,message",
    [
        ("missing-bucket", "the bucket 'no-such-bucket' does not exist"),
        ("no-endpoint", "cannot reach the storage endpoint (STORAGE_EMULATOR_HOST / network)"),
        ("credentials-in-uri", "put credentials and options in the environment"),
    ],
)
def test_bad_gcs_store_is_one_line_exit_2_and_nothing_written(gcsenv, monkeypatch, capsys, tmp_path, setup,
                                                              message):  # fmt: skip
    from jobs.attribute import cli

    out = gcsenv.uri("bad")
    if setup == "missing-bucket":
        out = "gs://no-such-bucket/runs"
    elif setup == "no-endpoint":
        monkeypatch.setenv("XSBERT_STORE_RETRY_S", "1")  # the store's retries of an unreachable endpoint: 1 s
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens on the discard port
        monkeypatch.setenv("XSBERT_GCS_RETRY_S", "1")
    elif setup == "credentials-in-uri":
        out = f"gs://user:secret@{gcsenv.bucket}/runs"
    data = write_tsv(tmp_path / "p.tsv", stsb_rows(2))
    assert cli(["--dataset", str(data), *FAST, "--out", out, "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("jobs.attribute: error: ") and message in err[-1], err
    assert "secret" not in "\n".join(err)
    assert not gcsenv.listing("bad/") and not gcsenv.listing("runs/")


# --------------------------------------------------------------------------- reading gs:// runs
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


def test_xsbert_sql_on_gcs_gives_the_local_rows_for_every_file(hand, gcsenv, capsys):
    from test_s3_sql import file_vars, same_csv
    from test_sql import xsbert_sql

    for name, (run, run2, uri, uri2) in hand.items():
        args = ["--file", name, "--csv", *[f"--var={k}={v}" for k, v in file_vars(name).items()]]
        local = xsbert_sql(capsys, "--run", str(run), *(["--run2", str(run2)] if run2 else []), *args)
        remote = xsbert_sql(capsys, "--run", uri, *(["--run2", uri2] if uri2 else []), *args)
        assert local[0] == remote[0] == 0 and local[1].strip(), (name, local, remote)
        assert same_csv(remote[1], local[1]), name


def test_report_on_a_gcs_run_states_the_local_findings(tmp_path_factory, gcsenv, tmp_path):
    import numpy as np
    from test_s3_sql import same
    from test_sql import random_parses, random_run, write_table

    from jobs import report

    rng = np.random.default_rng(21)
    main, data = random_run(tmp_path_factory.mktemp("gcs-report"), "main", rng, n_pairs=30, bias={"cat": 1.0})
    write_table(main, "parses", random_parses(data, rng))
    uri = gcsenv.upload(main, "report")
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


def test_bad_gcs_locations_are_one_line_exit_2(gcsenv, monkeypatch, capsys):
    from test_sql import xsbert_sql

    cases = [(gcsenv.uri("nowhere/run"), "no such directory"), ("gs://no-such-bucket/run", "no such bucket"),
             ("gs://user:top-secret@b/run", "URI with credentials in it: not accepted")]  # fmt: skip
    for uri, want in cases:
        code, out, err = xsbert_sql(capsys, "--run", uri, "select 1")
        assert code == 2 and not out and len(err.strip().splitlines()) == 1 and err.startswith("xsbert: error: ")
        assert want in err and "top-secret" not in err, err
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("XSBERT_GCS_RETRY_S", "1")
    code, out, err = xsbert_sql(capsys, "--run", gcsenv.uri("nowhere/run"), "select 1")
    assert code == 2 and "cannot reach the object store at http://127.0.0.1:9" in err, err


@pytest.mark.slow
def test_pipeline_with_store_and_reports_on_gcs(gcsenv, tmp_path, capsys):
    """A tiny study whose store and reports live on GCS (tests/jobtools.py: check_pipeline_on_store)."""
    check_pipeline_on_store(gcsenv.uri("study"), gcsenv.listing, capsys, tmp_path)
