"""A full disk and a read-only store under jobs.attribute with a local --out: a small tmpfs mounted for the test
(the tests run as root; where mounting is not allowed they are skipped and say why).

- disk full mid-run (in a stage-2 task or in the driver's commit, wherever the space runs out): one line that names
  the path and the errno, exit 2, only whole waves committed; after space is freed the same command resumes to the
  store of a run that never failed;
- a read-only store: a rerun with nothing to do answers as usual (exit 0); one that has something to write says
  in one line that the store is read-only (exit 2).
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest
from jobtools import (
    PAGE,
    REFERENCE_FLAGS,
    REFERENCE_PAIRS,
    assert_same_rows,
    q,
    run_cli,
    run_job,
    stsb_rows,
    tmpfs,
    write_tsv,
)

N_PAIRS = REFERENCE_PAIRS
FLAGS = REFERENCE_FLAGS  # the reference run's (tests/conftest.py reference_run)


def free_bytes(path: Path) -> int:
    import os

    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.fixture(scope="module")
def data(reference_run) -> Path:
    return reference_run[0]


@pytest.fixture(scope="module")
def clean(ray_cluster, reference_run) -> Path:
    """The uninterrupted run (tests/conftest.py reference_run)."""
    return reference_run[1]


def pages(run_dir: Path) -> int:
    """What a run takes on a tmpfs: whole pages per file."""
    return sum(-(-p.stat().st_size // PAGE) * PAGE for p in run_dir.rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("share", [0.0, 0.5])
def test_disk_full_is_one_line_and_the_rerun_after_freeing_space_is_identical(ray_cluster, data, clean, tmp_path,
                                                                              capsys, share):  # fmt: skip
    """The disk holds `share` of what the run needs (0: not even its first part): exit 2, one line naming the path
    under the mount and errno 28, never a traceback nor a credentials hint; only whole waves committed; after the
    ballast is deleted the same command gives the clean run's rows."""
    need = pages(clean)
    with tmpfs(tmp_path / "disk", 4 * need + 64 * PAGE) as mnt:
        out = mnt / "runs"
        (out / clean.name).mkdir(parents=True)  # the folders and .lock: a few pages whatever the share
        ballast = mnt / "ballast"
        ballast.write_bytes(b"\0" * max(0, free_bytes(mnt) - int(share * need) - 8 * PAGE))
        code, _, err = run_cli(capsys, out, "--dataset", str(data), *FLAGS)
        assert code == 2, err[-5:]
        assert err[-1].startswith("jobs.attribute: error: ") and not any("Traceback" in line for line in err), err[-5:]
        assert str(out / clean.name) in err[-1] and "[Errno 28] No space left on device" in err[-1], err[-1]
        assert "credentials" not in err[-1]
        run = out / clean.name
        if list(run.glob("pairs/*.parquet")):  # what is committed is whole: every pair has all its cells
            assert q(run, "select count(*) from {pairs}")[0][0] in (0, 4)
            assert q(run, "select count(*) from {pairs} p where p.n_cells != "
                          "(select count(*) from {cells} c where c.pair_id = p.pair_id)") == [(0,)]  # fmt: skip
        ballast.unlink()
        s = run_job(out, "--dataset", str(data), *FLAGS)
        assert (s["n_in"], s["n_done"]) == (N_PAIRS, N_PAIRS)
        assert_same_rows(Path(s["run_dir"]), clean)
        assert not list(run.rglob("*.tmp")) and not (run / "_staging").exists()


@pytest.mark.slow
def test_disk_full_at_the_start_with_ray_is_one_line_and_leaves_no_marker(ray_cluster, data, clean, tmp_path, capsys):
    """Not a byte free from the start, with the default Ray executor: the node check's marker cannot be written.
    One line naming it and errno 28, exit 2 (before: a traceback, exit 1), and no `.node-check-*` file left; a
    marker a killed job left behind is removed by the next run, which then finishes as the clean run."""
    from jobs.store import MARKER_PREFIX

    with tmpfs(tmp_path / "full", 4 * pages(clean) + 64 * PAGE) as mnt:
        out = mnt / "runs"
        run = out / clean.name
        run.mkdir(parents=True)
        ballast = mnt / "ballast"
        with open(ballast, "wb", buffering=0) as fh:  # every page of the disk
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * PAGE)
        code, _, err = run_cli(capsys, out, "--dataset", str(data), *FLAGS)
        assert code == 2 and not any("Traceback" in line for line in err), err[-5:]
        assert err[-1].startswith("jobs.attribute: error: ") and "[Errno 28] No space left on device" in err[-1]
        assert MARKER_PREFIX in err[-1] and str(run) in err[-1], err[-1]
        assert not list(run.glob(f"{MARKER_PREFIX}*"))
        ballast.unlink()
        (run / f"{MARKER_PREFIX}0123abcd").write_text("0123abcd\n")  # a killed job's marker
        s = run_job(out, "--dataset", str(data), *FLAGS)
        assert (s["n_in"], s["n_done"]) == (N_PAIRS, N_PAIRS)
        assert_same_rows(run, clean)
        assert not list(run.glob(f"{MARKER_PREFIX}*"))


@pytest.mark.slow
def test_read_only_store_answers_a_rerun_and_refuses_a_write_in_one_line(ray_cluster, data, clean, tmp_path, capsys):
    pairs = write_tsv(tmp_path / "pairs.tsv", stsb_rows(N_PAIRS, start=40))
    with tmpfs(tmp_path / "ro", 8 * pages(clean) + 64 * PAGE) as mnt:
        out = mnt / "runs"
        run = Path(run_job(out, "--dataset", str(pairs), *FLAGS, "--executor", "local")["run_dir"])  # its store
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode == 0
        # nothing to do: answered from the read-only store
        code, stdout, err = run_cli(capsys, out, "--dataset", str(pairs), *FLAGS)
        assert code == 0, err[-5:]
        assert f"{N_PAIRS} pairs in = {N_PAIRS} done" in stdout and "computed now        0 pairs" in stdout

        write_tsv(pairs, stsb_rows(N_PAIRS + 2, start=40))  # the file grew: the same run, two new pairs
        code, _, err = run_cli(capsys, out, "--dataset", str(pairs), *FLAGS)  # they cannot be written
        assert code == 2 and not any("Traceback" in line for line in err), err[-5:]
        assert str(run) in err[-1] and "[Errno 30] Read-only file system" in err[-1], err[-1]
