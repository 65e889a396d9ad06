"""Helpers for the job tests that run `jobs.attribute` on a local Ray and read the store back."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pytest

from jobs.attribution import inputs as _inputs

ROOT = Path(__file__).resolve().parents[1]
# The engine settings of the tests that run the real model (all-MiniLM-L6-v2): its last layer, N = 2 (`xsbert explain`
# takes these too).
FAST_ENGINE = ["--layer", "-1", "--steps", "2"]
# Every test run of the job: those, on one factor actor (the default pool of a 2-CPU Ray is two, each loading the
# model, for a few pairs; a test that wants two asks with --num-actors 2: flags after FAST win).
FAST = [*FAST_ENGINE, "--num-actors", "1"]
# The fault modules' reference run (tests/conftest.py reference_run): real STS-B test pairs from the 40th on, in two
# waves of 4 pairs, batches of 4 sentences, on FAST's one factor actor (the cheapest pool that shows every fault).
REFERENCE_PAIRS = 8
REFERENCE_FLAGS = ["--wave-size", "4", "--batch-size", "4"]
TABLES = ("pairs", "cells", "word_cells", "sentences", "quarantine")
# The order that makes two stores comparable row by row.
ORDER = {"pairs": "pair_id", "cells": "pair_id, i, j", "word_cells": "pair_id, u, v", "sentences": "sentence_id",
         "quarantine": "row, reason"}  # fmt: skip


def stsb_rows(n: int, start: int = 0) -> pd.DataFrame:
    """Real STS-B test pairs from the bundled copy: id, sentence1, sentence2, score."""
    df = pd.read_csv(_inputs.BUNDLED_STSB, sep="\t", quoting=3, dtype=str, keep_default_na=False)
    df = df[df.split == "test"].iloc[start : start + n]
    return pd.DataFrame({"id": [f"p{start + k:03d}" for k in range(len(df))], "sentence1": df.sentence1.values,
                         "sentence2": df.sentence2.values, "score": df.score.values})  # fmt: skip


def qqp_file(path: Path, n: int, start: int = 40) -> Path:
    """n STS-B test pairs in the layout of GLUE's QQP files (what `--dataset qqp --qqp-path` reads), gzipped: no QQP
    text ships with the repository."""
    df = stsb_rows(n, start=start)
    lines = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
    pairs = enumerate(zip(df.sentence1, df.sentence2))
    lines += [f"{k}\t{2 * k}\t{2 * k + 1}\t{a}\t{b}\t{k % 2}" for k, (a, b) in pairs]
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def write_tsv(path: Path, df: pd.DataFrame) -> Path:
    lines = ["\t".join(df.columns)] + ["\t".join(map(str, r)) for r in df.itertuples(index=False)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def q(run_dir: Path, sql: str) -> list[tuple]:
    """Run `sql` with {pairs}, {cells}, ... replaced by read_parquet of the run's tables."""
    import duckdb

    tables = {t: f"read_parquet('{run_dir}/{t}/*.parquet')" for t in TABLES}
    return duckdb.connect().execute(sql.format(**tables)).fetchall()


def rows(run_dir: Path, table: str) -> list[tuple]:
    """Every row of a table, every column, in ORDER."""
    return q(run_dir, f"select * from {{{table}}} order by {ORDER[table]}")


def parquet_hashes(run_dir: Path) -> dict[str, str]:
    """sha256 of every Parquet part, by path relative to the run directory."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*.parquet"))}  # fmt: skip


def commit_large_rows(store, n: int = 10_000) -> dict:
    """Commit wave 0 of `pairs`, `sentences` and `cells` with `n` rows each (keys, and for `sentences` tokens and
    3-float vectors; other columns null) into the open `store`, and write wave 1's `cells` and `sentences` through
    its PartSink, as stage-2 tasks do; the tables written."""
    import pyarrow as pa

    from jobs import store as jstore

    rows = [{"pair_id": f"p{k}", "sentence_id": f"s{k:05d}", "tokens": ["[CLS]", f"t{k % 7}", "[SEP]"],
             "embedding": [k / 7.0, -k / 3.0, 0.5], "reference_embedding": [1.0, k / 11.0, -0.25]} for k in range(n)]
    tables = {t: pa.Table.from_pylist(rows, schema=jstore.SCHEMAS[t]) for t in ("pairs", "sentences", "cells")}
    store.commit(0, tables)
    sink = store.sink()
    for table in ("cells", "sentences"):
        sink.write(table, 1, 0, tables[table])
    return tables


def add_adjective_columns(run: Path) -> None:
    """Give a run's pairs the adjectives dataset's pass-through columns (triplet, kind, template), empty: what
    sql/adjectives.sql reads from pairs, on a run of another dataset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in (run / "pairs").glob("*.parquet"):
        t = pq.read_table(part)
        for name in ("triplet", "kind", "template"):
            t = t.append_column(name, pa.nulls(t.num_rows, pa.string()))
        pq.write_table(t, part)


def row_groups(path: Path) -> list[int]:
    """The number of rows of each row group of a Parquet file."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]


def run_job(out: Path, *flags: str, hooks: Any = None) -> dict:
    """`python -m jobs.attribute` in-process with the FAST settings (flags after FAST win); `hooks`: faults to inject
    (jobs.attribution.hooks.Hooks)."""
    from jobs.attribute import main, parse_args

    return main(parse_args([*FAST, *flags, "--out", str(out), "--quiet"]), hooks=hooks)


def run_cli(capsys: Any, out: Path | str, *flags: str) -> tuple[int, str, list[str]]:
    """`python -m jobs.attribute`'s command line in-process with the FAST settings and `-q`, as run_job: (exit code,
    stdout, stderr's lines), read from pytest's `capsys`."""
    from jobs.attribute import cli

    code = cli([*FAST, *flags, "--out", str(out), "-q"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def job_error(stderr: str) -> str:
    """The job's one `jobs.attribute: error:` line in a job process's stderr, among any lines that Ray's log monitor
    forwards from the workers at its own time (before it or after it); exactly one, with no traceback anywhere."""
    said = [line for line in stderr.splitlines() if line.startswith("jobs.attribute: error: ")]
    assert len(said) == 1, stderr[-3000:]
    assert "Traceback" not in stderr and 'File "' not in stderr, stderr[-3000:]
    return said[0]


def hooked(module: str, *argv: str, **hooks: Any) -> list[str]:
    """The command of a job (jobs.attribute, jobs.pipeline) in a subprocess with test hooks (tests/hooked.py): hooks
    as Hooks' fields, e.g. hold_after_wave=1 (the driver sleeps after its first commit, for kill_after_first_commit)."""
    return [sys.executable, str(Path(__file__).resolve().parent / "hooked.py"), module,
            *(f"{k}={v}" for k, v in hooks.items()), "--", *argv]  # fmt: skip


def hooked_attribute(*argv: str, **hooks: Any) -> list[str]:
    """hooked("jobs.attribute", ...)."""
    return hooked("jobs.attribute", *argv, **hooks)


def download(uri: str, dest: Path) -> Path:
    """Copy a run on object storage (s3://, gs://) into the local folder `dest`, to compare it with a local run.
    (Object by object: a GCS listing has no directory entries, so pyarrow's copy_files would not make the folders.)"""
    import pyarrow.fs as pafs

    from jobs.store import filesystem

    fs, path = filesystem(uri)
    for info in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if info.type == pafs.FileType.File:
            target = dest / info.path[len(path) :].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            with fs.open_input_stream(info.path) as src:
                target.write_bytes(src.read())
    return dest


def assert_same_rows(got: Path, want: Path) -> None:
    """Two run directories hold the same rows in every table (a run copied down from object storage vs a local one)."""
    for table in TABLES:
        assert rows(got, table) == rows(want, table), table


def check_pipeline_on_store(root: str, listing, capsys, tmp_path: Path) -> None:
    """A tiny study whose store and reports live under `root` (s3://... or gs://...): attribute -> parse -> report;
    its rerun is up to date and writes no object but the index and the pipeline state. `listing(prefix)` maps the
    keys under a prefix of the bucket to what changes when an object is rewritten (ETag, generation)."""
    import yaml

    from jobs import pipeline

    data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(3))
    config = tmp_path / "study.yaml"
    prefix = root.split("://", 1)[1].split("/", 1)[1] + "/"
    config.write_text(yaml.safe_dump({
        "study": "on-object-storage", "out": f"{root}/runs", "datasets": {"pairs": {"source": str(data)}},
        "models": {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}, "defaults": {"layer": -1, "steps": 2},
        "runs": {"minilm": {"dataset": "pairs", "model": "minilm"}}, "parse": {"parser": "spacy"},
        "report": {"out": f"{root}/reports"}, "quiet": True,
    }), encoding="utf-8")  # fmt: skip
    first = pipeline.main(pipeline.parse_args(["--config", str(config)]))
    out = capsys.readouterr().out
    run = first["runs"]["minilm"]["run_dir"]
    assert run.startswith(f"{root}/runs/") and "attribute minilm: computed 3 pairs" in out
    keys = listing(prefix)
    rid = run.rsplit("/", 1)[1]
    assert any(k.startswith(f"{prefix}runs/{rid}/parses/part-") for k in keys)  # parsed on object storage
    assert {f"{prefix}reports/{name}" for name in ("index.html", "pipeline.json", "minilm/index.html",
                                                   "minilm/report.json")} <= set(keys)  # fmt: skip
    assert f"report: {root}/reports/index.html" in out

    pipeline.main(pipeline.parse_args(["--config", str(config)]))
    out = capsys.readouterr().out
    assert "attribute minilm: up to date" in out and "parse: up to date" in out and "report minilm: up to date" in out
    after = listing(prefix)
    changed = {k for k in keys.keys() | after.keys() if keys.get(k) != after.get(k)}
    assert changed <= {f"{prefix}reports/index.html", f"{prefix}reports/pipeline.json"}, changed


def kill_after_first_commit(cmd: Sequence[str], env: dict[str, str], committed: Callable[[], bool], timeout: float,
                            poll: float = 0.1) -> None:
    """Run `cmd` (a jobs.attribute command that holds after its first commit: hooked_attribute(...,
    hold_after_wave=1)) in its own process group until `committed()` says the first wave is in the store, then
    SIGKILL the group. Fails if the run ended before it could be killed."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if committed():
                break  # the first wave has committed: kill the driver now
            time.sleep(poll)
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stdout.read().decode()[-3000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def stop_process_group(proc: subprocess.Popen, log: IO[bytes]) -> None:
    """Stop a process started with start_new_session (a blocking `ray start`): SIGTERM (it drains and stops its
    processes), up to 60 s for it to end, SIGKILL to what is left of its own group; then close its log."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers of this group only
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=10)
    log.close()


# A tmpfs's page: a file there takes whole pages.
PAGE = 4096


@contextlib.contextmanager
def tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted at `where` for the block; skips the test where mounting is not allowed."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): {done.stderr.strip()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(where)], capture_output=True)
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)
