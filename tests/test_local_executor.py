"""`python -m jobs.attribute --executor local`: stages 1-2 in the driver's process, where Ray is not installed.

The local runs here go through a subprocess in which Ray (and DuckDB, psutil and the other packages a GPU machine
with only torch, transformers, sentence-transformers, pyarrow and pandas lacks) cannot be imported: a
sitecustomize that hides them from the import system (find_spec says None, importlib.metadata finds no
distribution), as if they were not installed. The store such a run writes is checked against a Ray run of the same
settings on the local 2-CPU Ray (same run id, same rows, same part files byte for byte), a run killed between waves
resumes to it, and `xsbert sql` reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jobtools import (
    FAST,
    TABLES,
    hooked_attribute,
    kill_after_first_commit,
    parquet_hashes,
    rows,
    run_job,
    stsb_rows,
    write_tsv,
)

from jobs import store as jstore

ROOT = Path(__file__).resolve().parents[1]
N_PAIRS = 10
# Three waves (4, 4, 2 pairs), batches of 4 sentences; one torch thread in the Ray actor and in the local process.
FLAGS = ["--wave-size", "4", "--batch-size", "4", "--cpus-per-actor", "1"]
# What the GPU machine of the lexical study lacks (and what the local path must so never import).
MISSING = ("ray", "duckdb", "psutil", "polars", "boto3", "botocore", "google", "matplotlib", "jinja2", "pydantic",
           "datasets", "accelerate")  # fmt: skip

# The sitecustomize that hides packages from a subprocess. $HIDDEN_ONLY_FROM (folders, os.pathsep-separated) names
# where the hidden packages' modules may still be found, as a machine's own installs of them (none by default).
HIDE = textwrap.dedent('''
    import importlib.machinery
    import os
    import sys

    HIDDEN = set({hidden!r})
    ONLY_FROM = tuple(filter(None, os.environ.get("HIDDEN_ONLY_FROM", "").split(os.pathsep)))


    def _hidden(name):
        return name.split(".")[0].replace("-", "_").lower() in HIDDEN


    class _HidingPathFinder(importlib.machinery.PathFinder):
        """PathFinder, blind to the hidden packages (outside ONLY_FROM): `import x` fails, find_spec is None, no
        distribution."""

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if not _hidden(name):
                return super().find_spec(name, path, target)
            spec = super().find_spec(name, path, target) if ONLY_FROM else None
            where = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), ""))
            return spec if where and str(where).startswith(ONLY_FROM) else None

        @classmethod
        def find_distributions(cls, *args, **kwargs):
            return (d for d in super().find_distributions(*args, **kwargs) if not _hidden(d.metadata["Name"] or ""))


    sys.meta_path[:] = [_HidingPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
''')


def without_ray(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a subprocess in which the MISSING packages cannot be imported."""
    folder = tmp_path / "hide"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(HIDE.format(hidden=sorted(MISSING)), encoding="utf-8")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]), **extra}


def local_cmd(out: Path, data: Path, *flags: str, **hooks: int) -> list[str]:
    argv = ["--dataset", str(data), *FAST, *FLAGS, *flags, "--executor", "local", "--out", str(out), "--quiet"]
    return hooked_attribute(*argv, **hooks) if hooks else [sys.executable, "-m", "jobs.attribute", *argv]


def test_the_hidden_packages_cannot_be_imported(tmp_path):
    probe = ("import importlib.util, importlib.metadata\n"
             "assert importlib.util.find_spec('ray') is None and importlib.util.find_spec('duckdb') is None\n"
             "try:\n    importlib.metadata.version('ray')\nexcept importlib.metadata.PackageNotFoundError:\n    pass\n"
             "else:\n    raise SystemExit('ray has a distribution')\n"
             "import pyarrow, pandas, torch, sentence_transformers\n"
             "import ray\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], env=without_ray(tmp_path), capture_output=True, text=True)
    assert done.returncode == 1 and "ModuleNotFoundError: No module named 'ray'" in done.stderr, done.stderr


def test_the_executor_flag_and_its_default():
    from jobs.attribute import parse_args

    assert parse_args(["--dataset", "stsb"]).executor == "ray"
    assert parse_args(["--dataset", "stsb", "--executor", "local"]).executor == "local"
    with pytest.raises(SystemExit):
        parse_args(["--dataset", "stsb", "--executor", "dask"])


@pytest.mark.slow
def test_a_local_run_without_ray_resumes_and_equals_the_ray_run(ray_cluster, tmp_path, capsys):
    data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(N_PAIRS, start=60))
    out = tmp_path / "local"
    # A local run killed between its first and second wave (the hook holds it after wave 1's commit) ...
    kill_after_first_commit(local_cmd(out, data, hold_after_wave=1), without_ray(tmp_path),
                            lambda: bool(list(out.glob("*/pairs/part-*.parquet"))), timeout=400)  # fmt: skip
    (run_dir,) = out.iterdir()
    assert len(jstore.RunStore(out, run_dir.name).done_pair_ids()) == 4  # wave 1 kept

    # ... resumes without Ray: only the other waves are computed.
    done = subprocess.run(local_cmd(out, data), cwd=ROOT, env=without_ray(tmp_path), capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"run {run_dir.name}: {N_PAIRS} pairs in = {N_PAIRS} done + 0 quarantined" in done.stdout
    assert f"computed now        {N_PAIRS - 4} pairs" in done.stdout and "wave 2/2" in done.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [r["resources"]["executor"] for r in manifest["runs"]] == ["local"]  # the killed run wrote no manifest
    assert manifest["runs"][0]["ray"] == {} and manifest["cells"] == "all" and "cells" not in manifest["config"]

    # The Ray run of the same settings: the same run id, the same rows, the same parts, byte for byte.
    s = run_job(tmp_path / "ray", "--dataset", str(data), *FLAGS)
    capsys.readouterr()
    ray_dir = Path(s["run_dir"])
    assert ray_dir.name == run_dir.name and s["computed_pairs"] == N_PAIRS
    for table in TABLES:
        assert rows(run_dir, table) == rows(ray_dir, table), table
    assert parquet_hashes(run_dir) == parquet_hashes(ray_dir)

    # Read elsewhere: `xsbert sql` on the local run; a Ray-side rerun finds it complete.
    from jobs.cli import main as xsbert

    assert xsbert(["sql", "--run", str(run_dir), "--file", "lexical_ranks", "--var", "min_count=2", "--csv"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("token,n,mean,std,rank\n") and printed.count("\n") > 3
    again = run_job(out, "--dataset", str(data), *FLAGS)
    assert (again["run_id"], again["computed_pairs"], again["n_done"]) == (run_dir.name, 0, N_PAIRS)


def test_a_pair_whose_texts_changed_under_its_id_stops_the_rerun_and_a_grown_dataset_resumes(tmp_path):
    """A run knows its pairs by id: a rerun skips those it holds. A pair whose texts the dataset changed since (its
    id the same) is not skipped silently with its old texts' numbers: the rerun stops in one line naming it, before
    anything is computed. The texts as they were, with a pair more, compute that pair only."""
    from xsbert_core import InputError

    pairs = stsb_rows(3, start=70)
    data = write_tsv(tmp_path / "pairs.tsv", pairs.iloc[:2])
    flags = ("--dataset", str(data), "--executor", "local")
    assert run_job(tmp_path / "runs", *flags)["computed_pairs"] == 2
    edited = pairs.iloc[:2].copy()
    edited.iloc[1, edited.columns.get_loc("sentence2")] = "A sentence that was not there when the pair was computed."
    write_tsv(data, edited)
    with pytest.raises(InputError, match=r"^1 pair\(s\) of the dataset are in the run with other texts or labels "
                                         r"than the dataset has now \(first: pair 'p071'\)"):  # fmt: skip
        run_job(tmp_path / "runs", *flags)
    relabelled = pairs.iloc[:2].copy()  # the same texts, another label: Table 1 would read the old one
    relabelled.iloc[0, relabelled.columns.get_loc("score")] = "0.25"
    write_tsv(data, relabelled)
    with pytest.raises(InputError, match=r"^1 pair\(s\) of the dataset .* other texts or labels .*'p070'"):
        run_job(tmp_path / "runs", *flags)
    blanked = pairs.iloc[:2].copy()  # a text gone: the pair would be in the run both computed and quarantined
    blanked.iloc[1, blanked.columns.get_loc("sentence2")] = " "
    write_tsv(data, blanked)
    with pytest.raises(InputError, match=r"^1 pair\(s\) the run holds are quarantined now \(first: pair 'p071', "
                                         r"empty_text_b\)"):  # fmt: skip
        run_job(tmp_path / "runs", *flags)
    write_tsv(data, pairs)
    s = run_job(tmp_path / "runs", *flags)
    assert (s["computed_pairs"], s["n_done"]) == (1, 3)
    import duckdb

    run = tmp_path / "runs" / s["run_id"]
    (held,) = duckdb.sql(f"select count(*), count(distinct pair_id) from '{run}/pairs/*.parquet'").fetchall()
    (quarantined,) = duckdb.sql(f"select count(*) from '{run}/quarantine/*.parquet'").fetchall()
    assert (held, quarantined) == ((3, 3), (0,))
