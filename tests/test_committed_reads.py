"""Readers see only committed waves (docs/STORE.md, "Reading"): a wave's cells, word cells and sentences are written
before its `pairs` part commits it, so a job that stops part-way (a full disk, a kill, an object store that stopped
answering) can leave parts of a wave that never committed. `xsbert sql` (its views and every sql/ file), `xsbert
serve`, jobs.report, jobs.parse and the pipeline's up-to-date check read exactly the parts the commits made visible,
as Delta and Iceberg readers read what their log lists; the duckdb CLI's globs give the same answers (each sql/
file reads a wave table through the pairs it belongs to); and a job that fails removes its failed wave's parts at
once.

The runs are real: `--executor local` runs of 12 bundled STS-B pairs in waves of 4 (all-MiniLM-L6-v2, N = 2; no Ray).
`leftover` is such a run (parsed, so that every sql/ file has what it reads) as a commit cut short before its last
`pairs` part leaves it (that part removed, the wave's other parts in place); `reference` holds the two committed
waves only. Every reader gives `leftover` the answers of
`reference`. The same on S3 (moto on 127.0.0.1), and a job that really dies mid-wave on a full tmpfs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jobtools import PAGE, add_adjective_columns, assert_same_rows, q, run_job, stsb_rows, tmpfs, write_tsv
from test_s3_sql import same_csv

from jobs import sqlrun

ROOT = Path(__file__).resolve().parents[1]
DUCKDB_CLI = Path(sys.executable).parent / "duckdb"
N_PAIRS = 12
FLAGS = ["--wave-size", "4", "--batch-size", "4", "--executor", "local", "--cpus-per-actor", "1"]
FILES = sorted(p.name for p in (ROOT / "sql").glob("*.sql"))
# What an STS-B run has none of: adjective triplets, pairs that differ by one 'not'. Every other file answers rows.
NO_ROWS_HERE = {"adjectives.sql", "negation.sql", "negation_signs.sql"}


def file_args(name: str) -> list[str]:
    return ["--var", "min_count=1"] if name.startswith("lexical") else []


def wave_parts(run: Path, wave: int) -> list[Path]:
    return sorted(p for t in ("cells", "word_cells", "sentences") for p in (run / t).glob(f"part-{wave:06d}*.parquet"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_tsv(tmp_path_factory.mktemp("committed-data") / "pairs.tsv", stsb_rows(N_PAIRS, start=40))


@pytest.fixture(scope="module")
def clean(data, tmp_path_factory) -> Path:
    s = run_job(tmp_path_factory.mktemp("committed-clean"), "--dataset", str(data), *FLAGS)
    run = Path(s["run_dir"])
    assert len(list((run / "pairs").glob("*.parquet"))) == 3 and wave_parts(run, 2)
    return run


@pytest.fixture(scope="module")
def complete(clean, tmp_path_factory) -> Path:
    """The clean run with what every sql/ file reads: its parses (jobs.parse, spaCy) and the adjectives dataset's
    pass-through columns, empty here (adjectives.sql reads them from pairs)."""
    from jobs import parse

    run = tmp_path_factory.mktemp("committed-complete") / clean.name
    shutil.copytree(clean, run)
    parse.main(parse.parse_args(["--run", str(run), "--parser", "spacy", "--executor", "local", "-q"]), echo=False)
    add_adjective_columns(run)
    return run


@pytest.fixture(scope="module")
def runs(complete, tmp_path_factory) -> dict[str, Path]:
    """`leftover`: the complete run as a commit of its wave 2 cut short before the pairs part leaves it (from a
    rerun that grew the dataset: its manifest lists the 8 pairs committed before); `reference`: waves 0-1 only."""
    root = tmp_path_factory.mktemp("committed-runs")
    out = {}
    for name in ("leftover", "reference"):
        run = root / name / complete.name
        shutil.copytree(complete, run)
        (run / "pairs" / "part-000002.parquet").unlink()
        if name == "reference":
            for part in wave_parts(run, 2):
                part.unlink()
        manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
        manifest["tables"]["pairs"]["rows"] = 8
        (run / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        out[name] = run
    assert wave_parts(out["leftover"], 2) and not wave_parts(out["reference"], 2)
    return out


def xsbert_sql(capsys, *argv: str) -> tuple[int, str, str]:
    from jobs.cli import main as xsbert

    code = xsbert(["sql", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


COUNTS = ("select (select count(*) from pairs), (select count(distinct pair_id) from cells), (select count(*) from cells), "
          "(select count(distinct pair_id) from word_cells), (select count(*) from sentences)")  # fmt: skip


def test_xsbert_sql_views_and_every_sql_file_read_the_committed_waves(runs, capsys):
    """The views count 8 pairs and their cells (before: the cells of 12 pairs against 8 in `pairs`), and every
    sql/ file answers on `leftover` what it answers on `reference`."""
    leftover, reference = runs["leftover"], runs["reference"]
    got = sqlrun.connect(leftover).sql(COUNTS).fetchall()
    want = sqlrun.connect(reference).sql(COUNTS).fetchall()
    assert got == want and got[0][:2] == (8, 8), (got, want)
    for name in FILES:
        answers = []
        for run in (leftover, reference):
            argv = ["--run", str(run), "--run2", str(run), "--file", name, "--csv", *file_args(name)]
            code, out, err = xsbert_sql(capsys, *argv)
            answers.append((code, out, err.replace(str(run), "RUN")))
        (code, out, err), (code_ref, out_ref, err_ref) = answers
        assert code == code_ref == 0, (name, err, err_ref)
        assert same_csv(out, out_ref) and (len(out.splitlines()) > 1) == (name not in NO_ROWS_HERE), (name, out)



def test_a_list_of_runs_reads_the_committed_parts_of_each(runs):
    """read_parquet over a list of runs' globs (negation_signs.sql reads run and other_runs so) reads the committed
    parts of every run in the list: `leftover` among them counts its 8 committed pairs' cells, not 12."""
    leftover, reference = runs["leftover"], runs["reference"]
    query = ("select count(distinct pair_id), count(*) from read_parquet(list_transform(getvariable('other_runs'), "
             "lambda r: r || '/cells/*.parquet'))")  # fmt: skip
    assert "committed_parts_list(list_transform(" in sqlrun.committed_sql(query)
    got = sqlrun.connect(reference, variables={"other_runs": [str(leftover)]}).sql(sqlrun.committed_sql(query)).fetchall()
    want = sqlrun.connect(reference).sql("select count(distinct pair_id), count(*) from cells").fetchall()
    assert got == want and got[0][0] == 8, (got, want)

def test_duckdb_cli_gives_the_committed_answers_too(runs):
    """The documented `duckdb -cmd "set variable run = ..." -f sql/<file>`: its globs see the leftover parts, and
    each file still answers as on `reference` (every wave table is read through the pairs it belongs to)."""
    for name in FILES:
        answers = []
        for run in (runs["leftover"], runs["reference"]):
            cmds = ["-cmd", f"set variable run = '{run}'", "-cmd", f"set variable run2 = '{run}'"]
            cmds += ["-cmd", "set variable min_count = 1"] if name.startswith("lexical") else []
            done = subprocess.run([str(DUCKDB_CLI), "-csv", *cmds, "-f", f"sql/{name}"], cwd=ROOT, capture_output=True,
                                  text=True, timeout=120)  # fmt: skip
            answers.append((done.returncode, done.stdout, done.stderr.replace(str(run), "RUN")))
        (code, out, err), (code_ref, out_ref, err_ref) = answers
        assert code == code_ref == 0, (name, err, err_ref)
        assert same_csv(out, out_ref) and (len(out.splitlines()) > 1) == (name not in NO_ROWS_HERE), (name, out)


def test_serve_parse_and_the_pipeline_read_the_committed_waves(runs):
    """`xsbert serve` counts and lists the committed pairs and its same-token cells are theirs; jobs.parse reads the
    committed sentences (RunStore.read_table); the pipeline's up-to-date check lists the committed parts."""
    from jobs import serve
    from jobs.store import run_at
    from jobs.study import state as study_state

    apps = {name: serve.App(run) for name, run in runs.items()}
    assert apps["leftover"].run.counts == apps["reference"].run.counts
    assert apps["leftover"].run.counts["pairs"] == 8 and apps["leftover"].run.note is None
    for app in apps.values():
        assert app.same_tokens.wait(60)
    tokens = {name: app.con.sql("select count(*), sum(value) from same_token_cells").fetchall() for name, app in
              apps.items()}  # fmt: skip
    assert tokens["leftover"] == tokens["reference"]
    sentences = {name: run_at(run).read_table("sentences", ["sentence_id"]).column(0).to_pylist()
                 for name, run in runs.items()}  # fmt: skip
    assert sorted(sentences["leftover"]) == sorted(sentences["reference"])
    assert run_at(runs["leftover"]).counts() == run_at(runs["reference"]).counts()
    names = {name: {t: [p[0] for p in v] for t, v in study_state.run_state(str(run)).items()} for name, run in
             runs.items()}  # fmt: skip
    assert names["leftover"] == names["reference"]


def test_readers_on_s3_read_the_committed_waves(runs, s3, capsys):
    """The same two runs on S3 (moto): `xsbert sql` and `xsbert serve` give `leftover` the answers of `reference`."""
    uris = {name: s3.upload(run, f"committed/{name}") for name, run in runs.items()}
    with s3.environ():
        got = sqlrun.connect(uris["leftover"]).sql(COUNTS).fetchall()
        want = sqlrun.connect(uris["reference"]).sql(COUNTS).fetchall()
        assert got == want and got[0][:2] == (8, 8), (got, want)
        for name in ("table1.sql", "lexical_ranks.sql", "reference_terms.sql"):
            answers = [xsbert_sql(capsys, "--run", uri, "--file", name, "--csv", *file_args(name))[:2]
                       for uri in (uris["leftover"], uris["reference"])]  # fmt: skip
            assert answers[0][0] == answers[1][0] == 0 and same_csv(answers[0][1], answers[1][1]), name
        from jobs import serve

        counts = [serve.App(uri).run.counts for uri in (uris["leftover"], uris["reference"])]
        assert counts[0] == counts[1] and counts[0]["pairs"] == 8


def test_committed_sql_reads_each_table_glob_through_the_snapshot_and_nothing_else():
    """The rewrite of a sql/ file's reads: the first argument of each read_parquet that ends with a table's glob,
    whatever expression names the run (a variable, a macro's parameter); never text in a string or a comment,
    another file, or another function."""
    sql = ("-- read_parquet(getvariable('run') || '/cells/*.parquet')\n"
           "select 'read_parquet(''x'' || ''/cells/*.parquet'')' as s, * "
           "from read_parquet(getvariable('run') || '/cells/*.parquet', filename = true), "
           "read_parquet('elsewhere/part.parquet'), READ_PARQUET (coalesce(getvariable('pairs_of'), run) || "
           "'/pairs/*.parquet') /* read_parquet(run || '/pairs/*.parquet') */, my_read_parquet(run || '/pairs/*.parquet')")
    want = ("-- read_parquet(getvariable('run') || '/cells/*.parquet')\n"
            "select 'read_parquet(''x'' || ''/cells/*.parquet'')' as s, * "
            "from read_parquet(committed_parts(getvariable('run') || '/cells/*.parquet'), filename = true), "
            "read_parquet('elsewhere/part.parquet'), READ_PARQUET (committed_parts(coalesce(getvariable('pairs_of'), "
            "run) || '/pairs/*.parquet')) /* read_parquet(run || '/pairs/*.parquet') */, "
            "my_read_parquet(run || '/pairs/*.parquet')")
    assert sqlrun.committed_sql(sql) == want


# --------------------------------------------------------------------------- a job that really dies mid-wave
def pages(paths: list[Path]) -> int:
    return sum(-(-p.stat().st_size // PAGE) for p in paths)


def test_a_job_that_fills_the_disk_in_wave_2_leaves_only_committed_waves(data, clean, tmp_path, capsys):
    """The disk holds wave 1 and the cells of wave 2, not its sentences: the job stops in one line (exit 2) while
    committing wave 2; the cells and word cells of wave 2 are removed at once (before: they stayed until a later
    run, and `xsbert sql` counted the cells of 8 pairs against 4 in `pairs`); `xsbert sql` counts 4 pairs and their
    cells; after space is freed the same command gives the clean run."""
    from jobs.attribute import cli as attribute_cli
    from jobs.store import part_seq

    by_wave = {w: [p for p in clean.rglob("part-*.parquet") if part_seq(p.name) == w] for w in (0, 1)}
    second_cells = [p for p in by_wave[1] if p.parent.name in ("cells", "word_cells")]
    second_sentences = [p for p in by_wave[1] if p.parent.name == "sentences"]
    budget = pages(by_wave[0]) + pages(second_cells) + pages(second_sentences) // 2
    with tmpfs(tmp_path / "disk", 64 * PAGE + budget * PAGE * 4) as mnt:
        out = mnt / "runs"
        run = out / clean.name
        run.mkdir(parents=True)
        ballast = mnt / "ballast"
        import os

        st = os.statvfs(mnt)
        ballast.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - budget * PAGE))
        code = attribute_cli(["--dataset", str(data), "--layer", "-1", "--steps", "2", *FLAGS, "--out", str(out), "-q"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and not any("Traceback" in line for line in err), err[-5:]
        assert "[Errno 28] No space left on device" in err[-1] and str(run) in err[-1], err[-1]
        assert [p.name for p in (run / "pairs").glob("*.parquet")] == ["part-000000.parquet"], err[-1]
        assert not wave_parts(run, 1) and not list(run.rglob("*.tmp")) and not (run / "_staging").exists()
        assert q(run, "select count(*), (select count(distinct pair_id) from {cells}) from {pairs}") == [(4, 4)]
        code, out_text, _ = xsbert_sql(capsys, "--run", str(run), COUNTS, "--csv")
        assert code == 0 and out_text.splitlines()[1].split(",")[:2] == ["4", "4"], out_text
        ballast.unlink()
        s = run_job(out, "--dataset", str(data), *FLAGS)
        assert (s["n_in"], s["n_done"], s["computed_pairs"]) == (N_PAIRS, N_PAIRS, 8)
        assert_same_rows(run, clean)


def test_the_duckdb_cli_sees_leftover_parts_only_through_an_ad_hoc_glob(runs):
    """What the docs say of the CLI: a query of its own over `cells/*.parquet` counts the leftover cells (there is no
    commit log a plain glob could read); the sql/ files do not (test above), nor `xsbert sql`'s views."""
    cells = runs["leftover"] / "cells" / "*.parquet"
    done = subprocess.run([str(DUCKDB_CLI), "-csv", "-noheader", "-c",
                           f"select count(distinct pair_id) from read_parquet('{cells}')"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert re.fullmatch(r"12\s*", done.stdout), done.stdout + done.stderr
