"""--sample sets nest: with one seed, the sample of k rows is inside the sample of any larger K (the first k of one
seeded order), so a run grown from a sample of 30 to one of 300 computes exactly the 270 new pairs."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from jobs import store as _store
from jobs.attribution.inputs import sample_positions
from jobs.attribution.validate import load_pairs


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_samples_of_one_seed_nest(seed):
    n = 1379  # the STS-B test split's size
    sizes = (1, 10, 20, 30, 299, 300, 1378)
    samples = {k: sample_positions(n, k, seed) for k in sizes}
    for k, positions in samples.items():
        assert len(positions) == k == len(np.unique(positions)) and np.all(np.diff(positions) > 0)
        assert positions.min() >= 0 and positions.max() < n
    for small, large in itertools.pairwise(sizes):
        assert set(samples[small]) <= set(samples[large]), (small, large)
    assert sample_positions(n, n, seed) is None and sample_positions(n, None, seed) is None
    # another seed, another sample (of 300 rows, two seeds sharing all of them has no chance)
    assert set(sample_positions(n, 300, seed + 1)) != set(samples[300])


def test_a_sample_is_spread_over_the_source():
    """Not the first rows, nor every k-th: about a tenth of a 10% sample falls in each tenth of the rows."""
    positions = sample_positions(100_000, 10_000, 0)
    counts = np.bincount(positions // 10_000, minlength=10)
    assert counts.min() > 850 and counts.max() < 1150, counts
    assert len(np.unique(np.diff(positions))) > 20


def test_the_pairs_of_the_sample_of_30_are_in_the_sample_of_300():
    small = load_pairs("stsb", split="test", sample=30, seed=0).rows
    large = load_pairs("stsb", split="test", sample=300, seed=0).rows
    assert len(small) == 30 and len(large) == 300
    assert set(small.pair_id) <= set(large.pair_id)
    assert small.row.tolist() == sorted(small.row)  # kept in source order


def test_a_sample_larger_than_the_source_takes_every_row_and_says_so(caplog):
    """--sample 2000 of STS-B test's 1,379 rows: all of them, in source order, and a warning naming the source and
    its size (before: silently fewer than asked); a sample that fits says nothing."""
    with caplog.at_level("WARNING", logger="jobs.attribution.validate"):
        rows = load_pairs("stsb", split="test", sample=2000, seed=0).rows
    assert len(rows) == 1379 and rows.row.tolist() == sorted(rows.row)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["--sample 2000: stsb (test) has 1379 rows; all of them are taken"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="jobs.attribution.validate"):
        load_pairs("stsb", split="test", sample=1379, seed=0)
    assert not caplog.records


def _job(out: Path, model: Path, sample: int, capsys) -> tuple[int, str]:
    """`python -m jobs.attribute`'s command line in this process: (exit code, stdout)."""
    from jobs.attribute import cli

    code = cli(["--dataset", "stsb", "--split", "test", "--sample", str(sample), "--seed", "0", "--model", str(model),
                "--layer", "1", "--steps", "2", "--cells", "none", "--wave-size", "150", "--batch-size", "64",
                "--executor", "local", "--out", str(out), "--quiet"])  # fmt: skip
    return code, capsys.readouterr().out


def test_a_run_grown_from_a_sample_of_30_to_300_computes_the_270_new_pairs(tiny, tmp_path, capsys):
    model, out = tiny.folder("bert", 2), tmp_path / "runs"
    code, said = _job(out, model, 30, capsys)
    assert code == 0 and "computed now        30 pairs" in said, said
    code, said = _job(out, model, 300, capsys)
    assert code == 0, said
    (run_dir,) = out.iterdir()  # one run id: the sample selects rows, it is not part of the id
    assert f"run {run_dir.name}: 300 pairs in = 300 done + 0 quarantined" in said
    assert "computed now        270 pairs" in said
    stored = _store.RunStore(out, run_dir.name).done_pair_ids()
    assert len(stored) == 300  # the store holds the sample of 300 and nothing else
    assert set(stored) == set(load_pairs("stsb", split="test", sample=300, seed=0).rows.pair_id)
