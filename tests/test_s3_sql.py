"""Runs on S3: `xsbert sql`, the duckdb CLI and jobs.report read `s3://bucket/prefix/<run id>` as a local run.

A real S3 endpoint: moto's server on 127.0.0.1 (the `s3` fixture, tests/s3tools.py), reached the standard way
(AWS_* variables, AWS_ENDPOINT_URL). The runs are tests/test_sql.py's hand-built stores (known answers, no Ray)
copied up with S3Server.upload, and its small real runs (all-MiniLM-L6-v2 through the job: slow). Every answer on
S3 equals the one on the local copy (the same rows; floats to 1e-9: DuckDB's parallel sums differ in the last
bit between two runs on the same files, local or not); the Python side reads through pyarrow (jobs/sqlrun/), the CLI
through httpfs from PyPI (jobs/_duckdb_cli.py, sql/init/s3.sql). A missing bucket or run, an endpoint that does
not answer and denied credentials (moto checking signatures) are one line and exit 2, with no secret in it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from s3tools import DUMMY_SECRET, free_port
from test_sql import FILES, make_run, random_parses, random_run, store_for, write_table, xsbert_sql

from jobs import _duckdb_cli, report, sqlrun
from xsbert_core import InputError

ROOT = Path(__file__).resolve().parents[1]
DUCKDB_CLI = Path(sys.executable).parent / "duckdb"
INIT = _duckdb_cli.S3_INIT.relative_to(ROOT).as_posix()  # sql/init/s3.sql, as the docs write it


def same(a, b) -> bool:
    """Equal, floats to a relative 1e-9 (DuckDB's parallel aggregates are not bit-reproducible), in any nesting."""
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def same_csv(a: str, b: str) -> bool:
    """Two CSV texts hold the same table (same() on the parsed cells)."""
    fa, fb = (pl.read_csv(t.encode(), infer_schema_length=None, null_values=["NULL", ""]) for t in (a, b))
    return fa.columns == fb.columns and fa.height == fb.height and same(fa.rows(), fb.rows())


def file_vars(name: str) -> dict[str, int]:
    return {"min_count": 2} if name.startswith("lexical") else {}


@pytest.fixture(scope="module")
def hand(tmp_path_factory, s3) -> dict[str, tuple[Path, Path | None, str, str | None]]:
    """For each sql/ file: a hand-built run (and second run) on which it returns rows, locally and on S3."""
    root = tmp_path_factory.mktemp("s3-hand")
    stores = {}
    for name in FILES:
        stem = name.removesuffix(".sql")
        run, run2 = store_for(name, root / stem)
        uri = s3.upload(run, f"hand/{stem}")
        stores[name] = (run, run2, uri, s3.upload(run2, f"hand/{stem}") if run2 is not None else None)
    return stores


def sql_args(run, run2, name: str) -> list[str]:
    argv = ["--run", str(run), *(["--run2", str(run2)] if run2 is not None else []), "--file", name, "--csv"]
    return argv + [f"--var={k}={v}" for k, v in file_vars(name).items()]


# --------------------------------------------------------------------------- xsbert sql / jobs.sqlrun
@pytest.mark.parametrize("name", FILES)
def test_xsbert_sql_on_s3_gives_the_local_rows(hand, s3, capsys, name):
    run, run2, uri, uri2 = hand[name]
    local = xsbert_sql(capsys, *sql_args(run, run2, name))
    with s3.environ():
        remote = xsbert_sql(capsys, *sql_args(uri, uri2, name))
    assert local[0] == 0 and not local[2] and local[1].count("\n") > 1
    assert remote[0] == 0 and not remote[2], remote[2]
    assert same_csv(remote[1], local[1])


def test_connect_on_s3_views_variables_and_checks(hand, s3):
    run, _, uri, _ = hand["syntactic_relations.sql"]  # a run with parses
    other, _, other_uri, _ = hand["table1.sql"]  # one without
    with s3.environ():
        assert sqlrun.check_run(uri + "/") == uri  # a trailing slash is dropped; a URI stays a str
        assert sqlrun.has_table(uri, "parses") and not sqlrun.has_table(other_uri, "parses")
        assert sqlrun.is_file(sqlrun.join(uri, "manifest.json")) and not sqlrun.is_file(sqlrun.join(uri, "nope.json"))
        assert json.loads(sqlrun.read_text(sqlrun.join(uri, "manifest.json"))) == json.loads(
            (run / "manifest.json").read_text())  # fmt: skip
        assert sqlrun.read_text(sqlrun.join(uri, "nope.json")) is None and sqlrun.run_name(uri) == run.name
        con = sqlrun.connect(uri, other_uri, {"min_count": 3})
        views = {r[0] for r in con.sql("select view_name from duckdb_views() where not internal").fetchall()}
        assert views == {"pairs", "cells", "word_cells", "sentences", "quarantine", "parses", "pairs_2", "cells_2",
                         "word_cells_2", "sentences_2", "quarantine_2"}  # fmt: skip
        got = con.sql("select getvariable('run'), getvariable('run2'), getvariable('min_count'), "
                      "(select count(*) from word_cells), (select count(*) from parses), (select count(*) from pairs_2)"
                      ).fetchall()[0]  # fmt: skip
    local = sqlrun.connect(run, other)
    expected = local.sql("select (select count(*) from word_cells), (select count(*) from parses), "
                         "(select count(*) from pairs_2)").fetchall()[0]  # fmt: skip
    assert got == (uri, other_uri, 3, *expected) and expected[0] > 0
    # s3a:// is the same store (the scheme the Hadoop world writes); the views read through it too
    with s3.environ():
        s3a = sqlrun.connect(uri.replace("s3://", "s3a://", 1))
        assert s3a.sql("select count(*) from word_cells").fetchall()[0][0] == expected[0]


def test_locations_local_or_object_store():
    locations = ("runs/a", "/abs/runs/a", "s3://b/p", "S3A://b/p", "gs://b/p", "gcs://b")
    assert [sqlrun.run_location(x).scheme for x in locations] == [
        None, None, "s3", "s3a", "gs", "gcs"]  # fmt: skip
    assert sqlrun.as_run("s3://b/p/run/") == "s3://b/p/run" and sqlrun.as_run("runs/x") == Path("runs/x")
    assert sqlrun.join("s3://b/p/run/", "cells", "*.parquet") == "s3://b/p/run/cells/*.parquet"
    assert sqlrun.join(Path("runs/x"), "manifest.json") == Path("runs/x/manifest.json")
    assert sqlrun.run_name("gs://b/p/abc123/") == "abc123" and sqlrun.run_name("runs/abc123") == "abc123"
    for bad in ("http://host/x", "file:///tmp/x", "s3://key:secret@bucket/x"):
        with pytest.raises(InputError) as info:
            sqlrun.run_location(bad)
        assert "secret" not in str(info.value)


# --------------------------------------------------------------------------- the duckdb CLI with httpfs
@pytest.fixture(scope="module")
def httpfs() -> Path:
    """httpfs in the CLI's extension directory (what `make setup` does; idempotent)."""
    return _duckdb_cli.install_httpfs()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(DUCKDB_CLI), *args], cwd=ROOT, capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=300, check=False)  # fmt: skip


def cli_cmds(run, run2, name: str) -> list[str]:
    cmds = ["-cmd", f"set variable run = '{run}'"]
    if run2 is not None:
        cmds += ["-cmd", f"set variable run2 = '{run2}'"]
    for key, value in file_vars(name).items():
        cmds += ["-cmd", f"set variable {key} = {value}"]
    return cmds


def test_httpfs_comes_from_the_pinned_package(httpfs):
    assert _duckdb_cli.httpfs_extension().is_file() and httpfs.is_file()
    assert httpfs.parent.parent.name == f"v{_duckdb_cli.cli_version()}"
    assert httpfs.is_relative_to(_duckdb_cli.cli_extension_dir())
    assert _duckdb_cli.install_httpfs() == httpfs  # a second install changes nothing
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith(f"v{_duckdb_cli.cli_version()} ")


@pytest.mark.parametrize("name", FILES)
def test_duckdb_cli_on_s3_gives_the_local_rows(hand, s3, httpfs, name):
    run, run2, uri, uri2 = hand[name]
    local = cli("-csv", *cli_cmds(run, run2, name), "-f", f"sql/{name}")
    remote = cli("-csv", "-cmd", f".read {INIT}", *cli_cmds(uri, uri2, name), "-f", f"sql/{name}",
                 env=s3.subprocess_env())  # fmt: skip
    assert local.returncode == 0 and local.stdout.count("\n") > 1, local.stderr
    assert remote.returncode == 0 and not remote.stderr, remote.stderr
    assert same_csv(remote.stdout, local.stdout)
    # the documented form (a table, not CSV)
    shown = cli("-cmd", f".read {INIT}", *cli_cmds(uri, uri2, name), "-f", f"sql/{name}", env=s3.subprocess_env())
    assert shown.returncode == 0 and not shown.stderr and shown.stdout.strip()


def test_duckdb_cli_s3_secret_follows_the_environment(hand, s3, httpfs):
    _, _, uri, _ = hand["table1.sql"]
    query = f"select count(*) from read_parquet('{uri}/pairs/*.parquet')"
    count = ["-csv", "-noheader", "-cmd", f".read {INIT}", "-c", query]
    assert cli(*count, env=s3.subprocess_env()).stdout.strip() == "20"
    # AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL (the AWS SDKs' order)
    moved = s3.subprocess_env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", AWS_ENDPOINT_URL_S3=s3.endpoint_url)
    assert cli(*count, env=moved).stdout.strip() == "20"
    with s3.auth_enforced() as (key_id, secret):
        denied = cli(*count, env=s3.subprocess_env())
        allowed = cli(*count, env=s3.subprocess_env(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret))
    assert denied.returncode != 0 and "403" in denied.stderr and DUMMY_SECRET not in denied.stderr + denied.stdout
    assert allowed.returncode == 0 and allowed.stdout.strip() == "20", allowed.stderr


# --------------------------------------------------------------------------- jobs.report
@pytest.fixture(scope="module")
def report_stores(tmp_path_factory, s3) -> dict[str, tuple[Path, str]]:
    """tests/test_report.py's stores: 'main' (labels, reference terms, parses, a planted bias), 'second'."""
    root = tmp_path_factory.mktemp("s3-report")
    rng = np.random.default_rng(21)
    main, data = random_run(root, "main", rng, n_pairs=30, bias={"cat": 1.0})
    write_table(main, "parses", random_parses(data, rng))
    cells2 = [{**c, "value": c["value"] * 0.5 + 0.01 * (c["i"] - c["j"])} for c in data["cells"]]
    second = make_run(root, "second", data["pairs"], cells2, [], data["sentences"])
    return {name: (path, s3.upload(path, "report")) for name, path in (("main", main), ("second", second))}


@pytest.mark.slow
def test_report_on_s3_runs_states_the_local_findings(report_stores, s3, tmp_path):
    (main, main_uri), (second, second_uri) = report_stores["main"], report_stores["second"]
    assert report.cli(["--run", str(main), "--run2", str(second), "--var", "min_count=3", "--out",
                       str(tmp_path / "local"), "-q"]) == 0  # fmt: skip
    with s3.environ():
        assert report.cli(["--run", main_uri, "--run2", second_uri, "--var", "min_count=3", "--out",
                           str(tmp_path / "s3"), "-q"]) == 0  # fmt: skip
    local = json.loads((tmp_path / "local" / "report.json").read_text(encoding="utf-8"))
    text = (tmp_path / "s3" / "report.json").read_text(encoding="utf-8")
    remote = json.loads(text.replace(main_uri, str(main)).replace(second_uri, str(second)))  # the paths differ only
    assert remote["run"]["path"] == str(main) and main_uri in text
    for doc in (local, remote):
        doc.pop("command")
    assert same(remote, local)
    ok = [s["name"] for s in local["sections"] if s["status"] == "ok"]
    assert {"table1", "agreement", "syntactic_relations", "lexical_ranks", "lexical_ranks_compare"} <= set(ok)
    for path in sorted((tmp_path / "local").glob("*.csv")):
        assert same_csv((tmp_path / "s3" / path.name).read_text(), path.read_text()), path.name
    assert (tmp_path / "s3" / "index.html").is_file()


# --------------------------------------------------------------------------- what goes wrong: one line, exit 2
def one_line_error(capsys, argv: list[str]) -> str:
    code, out, err = xsbert_sql(capsys, *argv)
    assert code == 2 and not out, (argv, out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("xsbert sql: error: "), (argv, err)
    assert DUMMY_SECRET not in err
    return err


def test_bad_s3_locations_are_one_line_exit_2(hand, s3, capsys, tmp_path):
    _, _, uri, _ = hand["table1.sql"]
    cases = [
        (["--run", s3.uri("no-such-run"), "select 1"], "no such directory"),
        (["--run", "s3://no-such-bucket/runs/x", "select 1"], "no such bucket 'no-such-bucket'"),
        (["--run", "s3://no-such-bucket", "select 1"], "no such bucket 'no-such-bucket'"),
        (["--run", s3.uri("hand/table1"), "select 1"], "not a run directory (no pairs/*.parquet); it holds the runs r"),
        (["--run", uri + "/manifest.json", "select 1"], "not a directory"),
        (["--run", uri, "--run2", "s3://no-such-bucket/y", "select 1"], "--run2 s3://no-such-bucket/y: no such bucket"),
        (["--run", "ftp://host/runs/x", "select 1"], "--run ftp://host/runs/x: unsupported location"),
        (["--run", "s3://AKIAKEY:top-secret-value@bucket/x", "select 1"], "URI with credentials in it: not accepted"),
        (["--run", uri, "select * from parses"], f"python -m jobs.parse --run {uri}"),
    ]
    with s3.environ():
        for argv, message in cases:
            err = one_line_error(capsys, argv)
            assert message in err and "top-secret-value" not in err, argv
        code, _, err = report_cli_error(["--run", uri, "--out", s3.uri("reports/x")], capsys)
        assert code == 2 and "a local folder" in err and len(err.strip().splitlines()) == 1
        code, _, err = report_cli_error(["--run", "s3://no-such-bucket/x", "--out", str(tmp_path / "r")], capsys)
        assert code == 2 and err.startswith("jobs.report: error: --run s3://no-such-bucket/x: no such bucket")


def test_pairs_of_on_s3_beside_a_local_run(hand, s3, capsys, tmp_path):
    """`pairs_of` (a run directory: the pairs it holds too) may lie on S3 while --run is local: it is checked as
    --run is and its store registered, and the rows equal those with a local `pairs_of` (a subset: the filter
    changes the answer, so an ignored variable would show)."""
    import shutil

    import pyarrow.parquet as pq

    run, _, _, _ = hand["reference_terms.sql"]
    subset = shutil.copytree(run, tmp_path / "subset")
    for part in (subset / "pairs").glob("*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.slice(0, 8), part)  # 8 of the run's 20 pairs
    uri = s3.upload(subset, "pairs-of")
    for name, count, expected in (("reference_terms.sql", "n", (16, 40)), ("pos_neg_sums.sql", "n_pairs", (8, 20))):
        argv = sql_args(run, None, name)
        code, every, _ = xsbert_sql(capsys, *argv)
        code_local, local, _ = xsbert_sql(capsys, *argv, f"--var=pairs_of={subset}")
        with s3.environ():
            code_s3, remote, err = xsbert_sql(capsys, *argv, f"--var=pairs_of={uri}")
        assert (code, code_local, code_s3) == (0, 0, 0), err
        assert same_csv(local, remote), name
        # reference_terms: n per quantity (ref_sim counts both sides); pos_neg_sums: pairs per bin, the "all" row
        counted = pl.read_csv(local.encode())[count].max(), pl.read_csv(every.encode())[count].max()
        assert counted == expected, (name, counted)
    with s3.environ():
        for value, message in ((s3.uri("pairs-of", "nope"), "--var pairs_of s3://"),
                               ("s3://no-such-bucket/x", "--var pairs_of s3://no-such-bucket/x: no such bucket"),
                               (str(tmp_path / "nope"), "no such directory")):  # fmt: skip
            err = one_line_error(capsys, ["--run", str(run), "--file", "reference_terms.sql", f"--var=pairs_of={value}"])
            assert message in err, (value, err)


def report_cli_error(argv: list[str], capsys) -> tuple[int, str, str]:
    code = report.cli([*argv, "-q"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_unreachable_endpoint_is_one_line_exit_2(hand, s3, capsys):
    _, _, uri, _ = hand["table1.sql"]
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with s3.environ(AWS_ENDPOINT_URL=closed, XSBERT_STORE_RETRY_S="2"):  # retried as every store call, 2 s here
        err = one_line_error(capsys, ["--run", uri, "select count(*) from pairs"])
    assert f"--run {uri}: cannot reach the object store at {closed}" in err and "XSBERT_STORE_RETRY_S" in err


def test_denied_credentials_are_one_line_exit_2(hand, s3, capsys):
    _, _, uri, _ = hand["table1.sql"]
    with s3.auth_enforced() as (key_id, secret):
        with s3.environ():  # the dummy key: unknown to moto's IAM
            unknown = one_line_error(capsys, ["--run", uri, "select count(*) from pairs"])
        with s3.environ(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY="not-" + secret):  # a wrong secret
            wrong = one_line_error(capsys, ["--run", uri, "select count(*) from pairs"])
        with s3.environ(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret):  # the right one is let in
            code, out, err = xsbert_sql(capsys, "--run", uri, "select count(*) as n from pairs", "--csv")
    for err in (unknown, wrong):
        assert f"--run {uri}: access denied by the object store at {s3.endpoint_url}" in err and secret not in err
    assert code == 0 and out.split() == ["n", "20"], err


# --------------------------------------------------------------------------- a flaky store (tests/faultproxy.py)
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_xsbert_sql_through_20_percent_faults_answers_as_without(hand, s3, capsys, seed):
    """Every request of `xsbert sql` (the run's listings, the views, the sql/ files' reads through DuckDB) fails with
    probability 0.2 (503s, 500s, resets, lost answers; seeded): each is retried as the store's calls are, and every
    answer equals the local run's (before: 1 run in 3 died in a traceback while creating the views)."""
    from faultproxy import FaultProxy

    names = ("table1.sql", "lexical_ranks.sql")  # the pairs and the manifest; the cells and sentences in a macro
    local = {name: xsbert_sql(capsys, *sql_args(hand[name][0], hand[name][1], name)) for name in names}
    with FaultProxy(s3.endpoint_url, seed=seed, rate=0.2) as proxy:
        with s3.environ(AWS_ENDPOINT_URL=proxy.url, XSBERT_STORE_RETRY_S="60"):
            for name in names:
                _, _, uri, uri2 = hand[name]
                code, out, err = xsbert_sql(capsys, *sql_args(uri, uri2, name))
                assert code == 0 and not err, (name, err)
                assert same_csv(out, local[name][1]), name
            code, out, err = xsbert_sql(capsys, "--run", hand["table1.sql"][2], "select count(*) as n from cells", "--csv")
            assert code == 0 and out.split()[1] == str(sqlrun.connect(hand["table1.sql"][0]).sql(
                "select count(*) from cells").fetchall()[0][0])  # fmt: skip
        assert sum(proxy.faults.values()) >= 3, proxy.faults  # the faults really happened


def test_xsbert_sql_on_a_store_that_stops_answering_is_one_line(hand, s3, capsys):
    """A store that answers every read with 500 past XSBERT_STORE_RETRY_S: one line that says what could not be
    read, what came back and after how many tries; exit 2, no traceback."""
    from faultproxy import FaultProxy

    _, _, uri, _ = hand["table1.sql"]
    with FaultProxy(s3.endpoint_url, seed=1) as proxy, s3.environ(AWS_ENDPOINT_URL=proxy.url, XSBERT_STORE_RETRY_S="2"):
        proxy.set(rate=1.0, kinds=("500",), match=r"^GET \S*/cells/part-")
        err = one_line_error(capsys, ["--run", uri, "select count(*) from cells"])
    assert "cells/part-" in err and "HTTP 500" in err and "given up after" in err and "Traceback" not in err, err


def test_a_long_wait_on_the_store_is_said_before_its_error(hand, s3):
    """Retries past retry.RETRY_NOTICE_S (5 s) are said on the console while they go on, once, then the error line
    at the deadline (before: a silent wait of XSBERT_STORE_RETRY_S, 120 s by default). A process of its own: the
    console is the user's."""
    import os

    from faultproxy import FaultProxy

    _, _, uri, _ = hand["table1.sql"]
    with FaultProxy(s3.endpoint_url, seed=1) as proxy, s3.environ(AWS_ENDPOINT_URL=proxy.url, XSBERT_STORE_RETRY_S="6"):
        proxy.set(rate=1.0, kinds=("503",), match=r"^GET \S*/cells/part-")
        done = subprocess.run([sys.executable, "-m", "jobs.cli", "sql", "--run", uri, "select count(*) from cells"],
                              cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120)  # fmt: skip
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 2, done.stderr
    assert err[0].startswith("WARNING jobs.store: a store call keeps failing (HTTP 503 "), err[0]
    assert "trying again for up to 6 s in all (--store-retry-s / XSBERT_STORE_RETRY_S)" in err[0], err[0]
    assert err[1].startswith("xsbert sql: error: ") and "given up after" in err[1] and "in 6 s" in err[1], err[1]


def test_the_read_side_sends_one_request_per_try(hand, s3):
    """One layer of retries on the read side: each of retry.retried's tries is one request, the S3 client trying
    none again under it (before: three per try, each fault also costing the AWS SDK's backoff), so
    XSBERT_STORE_RETRY_S is the whole wait and the tries said in the error are the requests made."""
    import re

    from faultproxy import FaultProxy

    uri = hand["table1.sql"][2] + "/manifest.json"
    with FaultProxy(s3.endpoint_url, seed=1) as proxy, s3.environ(AWS_ENDPOINT_URL=proxy.url, XSBERT_STORE_RETRY_S="2"):
        proxy.set(rate=1.0, kinds=("reset",), match=r"^GET \S*/manifest\.json")
        with pytest.raises(InputError) as err:
            sqlrun.read_text(uri)
    tries = int(re.search(r"given up after (\d+) tr", str(err.value)).group(1))
    gets = sum(n for key, n in proxy._seen.items() if key.startswith("GET ") and "manifest.json" in key)
    assert tries >= 2 and gets == tries, (tries, gets, str(err.value))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_serve_through_20_percent_faults_answers_every_page(s3, tmp_path, seed):
    """`xsbert serve` over S3 with 20% of its requests failing: it opens, and every page is a 200 with the rows and
    heatmaps of the same run served from disk (before: 2 pages in 18 were 500s whose body was a traceback)."""
    from faultproxy import FaultProxy
    from test_serve import Served, heatmap_values, listed_ids, make_store, q

    run, data = make_store(tmp_path, f"flaky-{seed}", n_pairs=12, seed=seed)
    uri = s3.upload(run, f"serve-flaky-{seed}")
    paths = ["/pairs?sort=label&order=asc", "/tokens?min_count=1", f"/token?t={q('[CLS]')}",
             f"/pair?id={q(data['pairs'][1]['pair_id'])}"]  # fmt: skip
    local = Served(run)
    try:
        want = {path: local.get(path) for path in paths}
    finally:
        local.close()
    with FaultProxy(s3.endpoint_url, seed=seed, rate=0.2) as proxy:
        with s3.environ(AWS_ENDPOINT_URL=proxy.url, XSBERT_STORE_RETRY_S="60"):
            remote = Served(uri)
            try:
                for path in paths:
                    status, page, _ = remote.get(path)
                    assert status == want[path][0] == 200 and "Traceback" not in page, (path, status, page[-500:])
                    if path.startswith("/pair?"):
                        np.testing.assert_allclose(heatmap_values(page, "run"), heatmap_values(want[path][1], "run"))
                    else:
                        assert listed_ids(page) == listed_ids(want[path][1]), path
            finally:
                remote.close()
        assert sum(proxy.faults.values()) >= 3, proxy.faults


# --------------------------------------------------------------------------- small real runs (all-MiniLM-L6-v2)
@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> dict[str, Path]:
    from test_sql import make_real_runs

    return make_real_runs(tmp_path_factory)


@pytest.mark.slow
def test_real_runs_on_s3_answer_as_local_ones(real_runs, s3, httpfs, capsys, tmp_path):
    uris = {name: s3.upload(path, "real") for name, path in real_runs.items()}
    checks = [("stsb", name) for name in ("table1.sql", "lexical_ranks.sql", "reference_terms.sql",
                                          "pos_neg_sums.sql", "syntactic_relations.sql")]  # fmt: skip
    checks += [("negation", "negation.sql"), ("adjectives", "adjectives.sql")]
    for run, name in checks:
        local = xsbert_sql(capsys, *sql_args(real_runs[run], None, name))
        with s3.environ():
            remote = xsbert_sql(capsys, *sql_args(uris[run], None, name))
        assert local[0] == remote[0] == 0 and local[1].count("\n") > 1, (run, name, remote[2])
        assert same_csv(remote[1], local[1]), (run, name)
        on_disk = cli("-csv", *cli_cmds(real_runs[run], None, name), "-f", f"sql/{name}")
        on_s3 = cli("-csv", "-cmd", f".read {INIT}", *cli_cmds(uris[run], None, name), "-f", f"sql/{name}",
                    env=s3.subprocess_env())  # fmt: skip
        assert on_disk.returncode == on_s3.returncode == 0, (name, on_s3.stderr)
        assert same_csv(on_s3.stdout, on_disk.stdout), name
    assert report.cli(["--run", str(real_runs["stsb"]), "--out", str(tmp_path / "local"), "-q"]) == 0
    with s3.environ():
        assert report.cli(["--run", uris["stsb"], "--out", str(tmp_path / "s3"), "-q"]) == 0
    local = json.loads((tmp_path / "local" / "report.json").read_text(encoding="utf-8"))
    remote = json.loads((tmp_path / "s3" / "report.json").read_text(encoding="utf-8")
                        .replace(uris["stsb"], str(real_runs["stsb"])))  # fmt: skip
    assert same(remote["sections"], local["sections"]) and same(remote["run"], local["run"])
