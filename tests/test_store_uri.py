"""One parser of store locations (jobs.store.Location.parse): a URI whose scheme has no backend (az://, http://, ...)
given as a run or a store root is one clear error, exit 2, at every entry point -- never a local folder named
`az:`. Before, the store and jobs.sqlrun each had an is_remote, with different rules: `--out az://b/x` made a local
folder `az:/b/x` and wrote a run there."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from jobtools import FAST, stsb_rows, write_tsv

from jobs import sqlrun
from jobs import store as jstore
from xsbert_core import InputError

URI = "az://container/runs"


def test_one_rule_for_store_and_sql():
    for location, want in (("s3://b/x", "s3"), ("S3A://b/x", "s3a"), ("gs://b/x", "gs"), ("gcs://b", "gcs"),
                           ("runs/x", None), ("/abs/runs", None)):  # fmt: skip
        assert jstore.Location.parse(location).scheme == want and sqlrun.run_location(location).scheme == want
        assert jstore.Location.parse(location).is_remote == (want is not None)
    for location in (URI, "http://host/x", "file:///tmp/x"):
        with pytest.raises(jstore.StoreError, match="unsupported location"):
            jstore.Location.parse(location)
        with pytest.raises(InputError, match="unsupported location"):
            sqlrun.run_location(location)


def test_a_location_is_parsed_once_into_scheme_path_and_filesystem(tmp_path):
    """The value the store takes: scheme, path in its filesystem, the filesystem itself; joins and parents keep the
    scheme; the store's classes and sinks are made from it (one kind per backend, no flag)."""
    import pyarrow.fs as pafs

    loc = jstore.Location.parse("s3://bucket/runs/")
    assert (loc.scheme, loc.path, loc.family, loc.bucket, loc.uri) == ("s3", "bucket/runs", "s3", "bucket",
                                                                        "s3://bucket/runs")  # fmt: skip
    assert loc.join("abc", "pairs").uri == "s3://bucket/runs/abc/pairs" and loc.join("abc").parent == loc
    assert jstore.Location.parse(loc) is loc and jstore.Location.parse("gcs://b/x").family == "gcs"
    local = jstore.Location.parse(tmp_path / "runs")
    fs, path = local.filesystem()
    assert not local.is_remote and isinstance(fs, pafs.LocalFileSystem) and path == str((tmp_path / "runs").resolve())
    assert local.join("abc").name == "abc"
    store = jstore.open_store(tmp_path / "runs", "abc")
    assert type(store) is jstore.RunStore and store.location == local.join("abc")
    assert type(jstore.open_store("s3://bucket/runs", "abc")) is jstore.ObjectRunStore
    assert isinstance(store.open().sink(), jstore.LocalPartSink)
    store.close()
    with pytest.raises(jstore.StoreError, match="credentials in it"):
        jstore.Location.parse("s3://key:secret@bucket/x")


def _attribute(tmp_path: Path) -> list[str]:
    data = write_tsv(tmp_path / "p.tsv", stsb_rows(2))
    return ["--dataset", str(data), *FAST, "--out", URI, "-q"]


def _pipeline(tmp_path: Path) -> list[str]:
    data = write_tsv(tmp_path / "p.tsv", stsb_rows(2))
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump({
        "study": "az", "out": URI, "datasets": {"pairs": {"source": str(data)}},
        "models": {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}, "defaults": {"layer": -1, "steps": 2},
        "runs": {"minilm": {"dataset": "pairs", "model": "minilm"}}, "report": {"out": str(tmp_path / "reports")},
        "quiet": True,
    }), encoding="utf-8")  # fmt: skip
    return ["--config", str(config)]


@pytest.mark.parametrize("entry", ["attribute", "parse", "report", "sql", "serve", "show", "pipeline"])
def test_a_scheme_without_a_backend_is_one_line_exit_2_everywhere(entry, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if entry == "attribute":
        from jobs.attribute import cli

        code = cli(_attribute(tmp_path))
    elif entry == "parse":
        from jobs.parse import cli

        code = cli(["--run", f"{URI}/0123456789abcdef"])
    elif entry == "report":
        from jobs.report import cli

        code = cli(["--run", f"{URI}/0123456789abcdef", "--out", str(tmp_path / "report")])
    elif entry == "sql":
        from jobs.cli import main

        code = main(["sql", "--run", f"{URI}/0123456789abcdef", "select 1"])
    elif entry in ("serve", "show"):
        from jobs.cli import main

        extra = ["--port", "0"] if entry == "serve" else ["--pair", "p1"]
        code = main([entry, "--run", f"{URI}/0123456789abcdef", *extra])
    else:
        from jobs.pipeline import cli

        code = cli(_pipeline(tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err[-5:]
    assert "az://container/runs" in err[-1] and "unsupported location" in err[-1], err[-5:]
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "az:").exists()  # nothing written to a local folder named after the URI


def test_a_number_of_seconds_from_the_environment_that_is_none_is_one_line_naming_it(monkeypatch):
    """XSBERT_LOCK_TTL_S was read with float() when jobs.store was imported: `abc` made every command, xsbert explain
    included, a traceback; XSBERT_GCS_RETRY_S=x was pyarrow's "could not convert string to float" without the name."""
    import os
    import subprocess
    import sys

    from jobs.store.lock import lock_ttl_s
    from jobs.store.uri import env_seconds, filesystem

    monkeypatch.delenv("XSBERT_LOCK_TTL_S", raising=False)
    assert lock_ttl_s() == jstore.LOCK_TTL_S == 120.0
    for text, want in (("30", 30.0), (" 0.5 ", 0.5), ("", 120.0)):
        monkeypatch.setenv("XSBERT_LOCK_TTL_S", text)
        assert lock_ttl_s() == want
    for text in ("abc", "2m", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("XSBERT_LOCK_TTL_S", text)
        with pytest.raises(jstore.StoreError, match=rf"^XSBERT_LOCK_TTL_S='{text}': not a number of seconds above 0$"):
            lock_ttl_s()
    monkeypatch.setenv("XSBERT_X_S", "0")
    assert env_seconds("XSBERT_X_S", 5.0) == 0.0  # a retry deadline may be 0: no retry
    monkeypatch.setenv("XSBERT_GCS_RETRY_S", "x")
    with pytest.raises(jstore.StoreError, match=r"^XSBERT_GCS_RETRY_S='x': not a number of seconds from 0$"):
        filesystem("gs://bucket/runs")
    env = {"XSBERT_LOCK_TTL_S": "abc", "XSBERT_GCS_RETRY_S": "x", "XSBERT_STORE_RETRY_S": "y"}
    proc = subprocess.run([sys.executable, "-m", "jobs.attribute", "--help"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, **env}, timeout=120)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr  # a local command never reads them
