"""Helpers for the job tests that run `jobs.attribute` on a local Ray and read the store back."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd

from jobs import _inputs

FAST = ["--layer", "-1", "--steps", "2"]  # attribution settings of every Ray test run (all-MiniLM-L6-v2)
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


def run_job(out: Path, *flags: str) -> dict:
    """`python -m jobs.attribute` in-process with the FAST settings (flags after FAST win)."""
    from jobs.attribute import main, parse_args

    return main(parse_args([*FAST, *flags, "--out", str(out), "--quiet"]))


def download(uri: str, dest: Path) -> Path:
    """Copy a run on object storage (s3://, gs://) into the local folder `dest`, to compare it with a local run.
    (Object by object: a GCS listing has no directory entries, so pyarrow's copy_files would not make the folders.)"""
    import pyarrow.fs as pafs

    from jobs._store import filesystem

    fs, path = filesystem(uri)
    for info in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if info.type == pafs.FileType.File:
            target = dest / info.path[len(path) :].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            with fs.open_input_stream(info.path) as src:
                target.write_bytes(src.read())
    return dest
