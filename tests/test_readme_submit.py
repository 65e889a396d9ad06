"""README.md's local `ray job submit` block, run as written, against the head it starts, with Ray's token
authentication left at Ray's default: the study runs on that head's Ray (the Ray job, node and GCS its manifest
records), into a store DuckDB reads, with the quiet console, and the same submission again finds every stage up to
date. And the one-line messages for the two traps of that flow.

The block is read from README.md at test time: the first ```bash block after the paragraph that begins "On one
machine". It runs in bash, in a copy of the repository as a fresh clone has it (the files git tracks, `.venv` a link
to this venv), in a new shell's environment:

- HOME is a new folder whose `.ray/auth_token` was made as `make run` leaves it (a local `ray.init()` makes the
  token with Ray's `generate_and_save_token`; here `ray get-auth-token --generate`, the same function). With that file
  present, a `ray start --head` without RAY_AUTH_MODE turns token authentication on by itself (Ray 2.59+,
  `maybe_enable_token_auth_if_token_available`), while a `ray job submit` without RAY_AUTH_MODE=token sends no token.
- No RAY_AUTH_MODE, RAY_AUTH_TOKEN*, RAY_ADDRESS or VIRTUAL_ENV, and no venv's bin on PATH: the block must bring the
  token to the client and the venv's Python to the job itself.
- RAY_TMPDIR is a new short folder: the head's session files and `ray_current_cluster` (how `ray job submit` finds
  the head without --address) live there, apart from any other Ray on the machine.
- The copy's configs/default.yaml is a 3-pair study (the default study takes minutes on 2 cores).

Two edits, both for a shared machine: the `ray start --head` line gets free ports and `--num-cpus 2`, and the block's
last line, `ray stop` (which stops every Ray instance of the machine), is not run: the test stops the head it
started, by its process group (the block runs in a session of its own) and by its RAY_TMPDIR. Everything else runs
as the README has it. Against an earlier README's commands the submit failed: `AuthenticationError: ...
InvalidAuthToken` (no token sent), and with the token, `ModuleNotFoundError: No module named 'torch'` (the system
Python, from a head started as `.venv/bin/ray start --head` outside the activated venv).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
import yaml
from endpoints import free_ports

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # this venv's bin: its `ray` and `python`
ANCHOR = "On one machine"
BLOCK_TIMEOUT_S = 600  # head start (~20 s), the upload, and a 3-pair study with model loads, parse and report
JOIN_TIMEOUT_S = 180
# The environment of a new shell: nothing of Ray's or of an activated venv.
CLEARED = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
           "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_TMPDIR")  # fmt: skip
TINY_STUDY = {
    "study": "default",
    "out": "runs",
    "datasets": {"stsb": {"source": "stsb", "split": "test", "sample": 3, "seed": 0}},
    "models": {"minilm": "sentence-transformers/all-MiniLM-L6-v2"},
    "defaults": {"layer": -1, "steps": 2},
    "runs": {"stsb": {"dataset": "stsb", "model": "minilm"}},
    "parse": {"parser": "spacy"},
    "report": {"out": "reports/default"},
    "quiet": True,
}


# --------------------------------------------------------------------------- the block
def readme_block(text: str) -> list[str]:
    """The commands of the first ```bash block after the paragraph that begins with ANCHOR (a trailing backslash
    joins lines; comments and blank lines stay as they are, bash ignores them)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(ANCHOR))
    opening = next(i for i in range(start, len(lines)) if lines[i].strip() == "```bash")
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].strip() == "```")
    commands, pending = [], ""
    for line in lines[opening + 1 : closing]:
        pending = f"{pending}\n{line}" if pending else line
        if not pending.endswith("\\"):
            commands.append(pending)
            pending = ""
    return [c for c in commands if c.strip()]


def _program(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return []


def is_head_start(command: str) -> bool:
    argv = _program(command)
    return len(argv) >= 3 and Path(argv[0]).name == "ray" and argv[1:3] == ["start", "--head"]


def is_ray_stop(command: str) -> bool:
    argv = _program(command)
    return len(argv) >= 2 and Path(argv[0]).name == "ray" and argv[1] == "stop"


def shared_machine_script(commands: list[str], start_flags: list[str]) -> str:
    """The block as a bash script, with the two edits of the module docstring (each must apply exactly once)."""
    starts = [c for c in commands if is_head_start(c)]
    assert len(starts) == 1, f"the block should start one head with `ray start --head`: {commands}"
    assert commands and is_ray_stop(commands[-1]), f"the block should end with `ray stop`: {commands}"
    out = ["set -e"]
    for command in commands[:-1]:
        if is_head_start(command):
            code, _, comment = command.partition(" #")
            command = f"{code.rstrip()} {shlex.join(start_flags)}" + (f"  #{comment}" if comment else "")
        out.append(command)
    out.append(f": not run here, the test stops its own head: {shlex.quote(commands[-1])}")
    return "\n".join(out) + "\n"


def test_the_block_is_found_and_edited_only_where_the_machine_is_shared():
    commands = readme_block(README.read_text(encoding="utf-8"))
    script = shared_machine_script(commands, ["--port=1"])
    kept = [c for c in commands[:-1] if not is_head_start(c)]
    assert all(c in script for c in kept), script
    submits = [a for a in map(_program, commands) if len(a) >= 3 and Path(a[0]).name == "ray" and a[1] == "job"]
    assert [a[2] for a in submits] == ["submit"], commands
    assert "--port=1" in script and "ray stop" not in script.replace(shlex.quote(commands[-1]), "")


# --------------------------------------------------------------------------- a head started by the block
def new_shell_env(home: Path, ray_tmpdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    venv_bins = {str(BIN), str(BIN.resolve())}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p not in venv_bins and "/.venv/bin" not in p
    )
    env.update(
        HOME=str(home),
        RAY_TMPDIR=str(ray_tmpdir),
        # The models stay where this machine has them (HOME is new); offline, as every test.
        XSBERT_CACHE=os.environ.get("XSBERT_CACHE", str(Path.home() / ".cache" / "xsbert")),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
    )
    return env


def fresh_clone(dest: Path) -> Path:
    """The files git tracks (and untracked ones it does not ignore), as they are in the working tree; `.venv` links
    to this venv, as `make setup` would have made it."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to(BIN.parent)
    (dest / "configs" / "default.yaml").write_text(yaml.safe_dump(TINY_STUDY), encoding="utf-8")
    return dest


@dataclass
class BlockRun:
    clone: Path
    home: Path
    env: dict[str, str]
    returncode: int
    log: str
    gcs_address: str | None
    gcs_port: int
    dashboard: str

    @property
    def token(self) -> str:
        """The token the block made: ~/.ray/auth_token of its HOME."""
        return (self.home / ".ray" / "auth_token").read_text().strip()

    def client(self):
        """The head's job API, with the block's token."""
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.dashboard, headers={"Authorization": f"Bearer {self.token}"})

    def head_log(self) -> str:
        logs = sorted(Path(self.env["RAY_TMPDIR"]).glob("ray/session_latest/logs/*.err"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)


def _stop_head(pgid: int, ray_tmpdir: Path) -> None:
    """SIGTERM, then SIGKILL, to the block's process group (the head's daemons), and to any process whose command
    line names this head's RAY_TMPDIR (a job driver runs in a session of its own). Nothing else."""
    import psutil

    def ours() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if os.getpgid(proc.pid) == pgid or str(ray_tmpdir) in " ".join(proc.info["cmdline"] or []):
                    found.append(proc)
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        return found

    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs = ours()
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=20)


@pytest.fixture(scope="module")
def block_run():
    """Runs README.md's block once (see the module docstring) and leaves its head up for the module's tests."""
    work = Path(tempfile.mkdtemp(prefix="xsbert-readme-"))
    ray_tmpdir = Path(tempfile.mkdtemp(prefix="xsr-", dir="/tmp"))  # short: Ray's unix sockets live under it
    home = work / "home"
    home.mkdir()
    clone = fresh_clone(work / "clone")
    env = new_shell_env(home, ray_tmpdir)
    # What `make run` leaves behind: the token of a local ray.init(), in ~/.ray/auth_token.
    subprocess.run([str(BIN / "ray"), "get-auth-token", "--generate"], env=env, check=True, capture_output=True)
    assert (home / ".ray" / "auth_token").is_file()

    gcs, dash, client, agent = free_ports(4)
    flags = [f"--port={gcs}", f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
             f"--dashboard-agent-listen-port={agent}", "--num-cpus=2"]  # fmt: skip
    script = work / "block.sh"
    script.write_text(shared_machine_script(readme_block(README.read_text(encoding="utf-8")), flags), encoding="utf-8")
    log_path = work / "block.log"
    with open(log_path, "wb") as log:  # a file, not a pipe: the head's daemons outlive bash and keep it open
        proc = subprocess.Popen(["bash", str(script)], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            returncode = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            returncode = -9
    address_file = ray_tmpdir / "ray" / "ray_current_cluster"
    run = BlockRun(
        clone=clone, home=home, env=env, returncode=returncode, log=log_path.read_text(errors="replace"),
        gcs_address=address_file.read_text().strip() if address_file.is_file() else None, gcs_port=gcs,
        dashboard=f"http://127.0.0.1:{dash}",
    )  # fmt: skip
    try:
        yield run
    finally:
        _stop_head(proc.pid, ray_tmpdir)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


@pytest.mark.slow
def test_readme_block_runs_the_study_through_ray_job_submit(block_run):
    run = block_run
    assert run.returncode == 0, f"the README block failed (exit {run.returncode}):\n{run.log[-6000:]}\n{run.head_log()}"
    assert re.search(r"Job '[^']+' succeeded", run.log), run.log[-3000:]
    assert "study default: done" in run.log and "attribute stsb: computed 3 pairs" in run.log, run.log[-3000:]
    # The job wrote where the block told it ($PWD/runs, $PWD/reports/default of the clone), not into its upload.
    manifests = list((run.clone / "runs").glob("*/manifest.json"))
    assert len(manifests) == 1, sorted((run.clone / "runs").rglob("*"))[:20]
    assert (run.clone / "reports" / "default" / "index.html").is_file()
    assert (run.clone / "reports" / "default" / "stsb" / "index.html").is_file()
    # Its console is the quiet one: no Ray Data execution logs, no actor-restart notice, no token notice.
    client = run.client()
    (job,) = [j for j in client.list_jobs() if j.submission_id]  # (a driver that joins is listed too)
    log = client.get_job_logs(job.submission_id)
    for noise in ("Execution plan of Dataset", "has constructor arguments in the object store", "Token authentication"):
        assert noise not in log, noise
    # The attribution ran on the head the block started, not on a Ray of its own: the Ray job and node its manifest
    # recorded are the ones the head lists for the submission, and its GCS is the head's; DuckDB reads the store.
    used = json.loads(manifests[0].read_text(encoding="utf-8"))["runs"][-1]["ray"]
    assert job.job_id and (used["job_id"], used["node_id"]) == (job.job_id, job.driver_node_id), (used, job)
    assert used["gcs_address"].rsplit(":", 1)[1] == str(run.gcs_port), used
    con = duckdb.connect()
    run_dir = manifests[0].parent
    assert con.execute(f"select count(*), count(distinct pair_id) from read_parquet('{run_dir}/pairs/*.parquet')"
                       ).fetchone() == (3, 3)  # fmt: skip
    assert con.execute(f"select count(*) from read_parquet('{run_dir}/cells/*.parquet')").fetchone()[0] > 3


def resubmission_script(commands: list[str]) -> str:
    """The block without its head's start and its `ray stop`: the shell's set-up, then the submission."""
    return "\n".join(["set -e", *(c for c in commands[:-1] if not is_head_start(c))]) + "\n"


@pytest.mark.slow
def test_the_same_submission_again_finds_every_stage_up_to_date(block_run):
    """A scheduled rerun: the block's submission once more (a new upload of the working dir) computes nothing, since
    a run's id does not depend on where the job's copy of the repository lies."""
    assert block_run.returncode == 0, f"the README block failed:\n{block_run.log[-3000:]}"
    script = resubmission_script(readme_block(README.read_text(encoding="utf-8")))
    done = subprocess.run(["bash", "-c", script], cwd=block_run.clone, env=block_run.env, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for stage in ("attribute stsb: up to date", "parse: up to date", "report stsb: up to date"):
        assert stage in done.stdout, (stage, done.stdout[-3000:])
    assert len([j for j in block_run.client().list_jobs() if j.submission_id]) == 2


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow
def test_the_head_the_block_started_requires_the_token(block_run):
    """Token authentication is on: the job API answers only a request that carries ~/.ray/auth_token."""
    assert block_run.gcs_address, f"no head recorded:\n{block_run.log[-3000:]}"
    assert _get(f"{block_run.dashboard}/api/jobs/") == 401
    assert _get(f"{block_run.dashboard}/api/jobs/", token="not-the-token") == 403
    assert _get(f"{block_run.dashboard}/api/jobs/", token=block_run.token) == 200


def _join(block_run: BlockRun, tmp_path: Path, env_update: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**block_run.env, **env_update}
    argv = [str(BIN / "python"), "-m", "jobs.attribute", "--ray-address", block_run.gcs_address, "--dataset", "stsb",
            "--limit", "1", "--steps", "2", "--out", str(tmp_path / "runs"), "-q"]  # fmt: skip
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=JOIN_TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, env_update, why",
    [
        ("no RAY_AUTH_MODE", {}, "this process sent no token (RAY_AUTH_MODE is unset, not token)"),
        ("a token that is not the head's", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32},
         "the token this process sent ($RAY_AUTH_TOKEN) is not the head's"),
    ],
)  # fmt: skip
def test_a_refused_join_says_where_the_token_lives(block_run, tmp_path, case, env_update, why):
    assert block_run.gcs_address, f"no head recorded:\n{block_run.log[-3000:]}"
    done = _join(block_run, tmp_path, env_update)
    assert done.returncode == 2, f"{case}: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"jobs.attribute: error: the Ray cluster at {block_run.gcs_address} uses token "
                           "authentication and refused this process: "), last  # fmt: skip
    assert why in last and "RAY_AUTH_MODE=token" in last and "ray get-auth-token" in last, last
    if "RAY_AUTH_TOKEN" not in env_update:
        assert str(block_run.home / ".ray" / "auth_token") in last, last
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.parquet"))


# --------------------------------------------------------------------------- a job without its dependencies
@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A Python without the project's dependencies (a venv of the same interpreter, no packages): what a head started
    outside the activated venv gives its jobs."""
    import venv

    where = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(where)
    return where / "bin" / "python"


@pytest.mark.parametrize("under_ray_job", [True, False], ids=["ray job submit", "a shell"])
def test_a_job_without_its_dependencies_names_the_fix(bare_python, under_ray_job):
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    if under_ray_job:  # what Ray's job supervisor sets for an entrypoint
        env["RAY_JOB_CONFIG_JSON_ENV_VAR"] = '{"runtime_env": {}, "metadata": {}}'
    for module in ("jobs.pipeline", "jobs.attribute"):
        done = subprocess.run([str(bare_python), "-m", module, "--config", "configs/default.yaml"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        line = done.stderr.strip()
        assert line.startswith(f"jobs: error: {bare_python} cannot import torch"), line
        if under_ray_job:
            assert "source .venv/bin/activate && RAY_AUTH_MODE=token ray start --head" in line, line
        else:
            assert ".venv/bin/python -m jobs.<name>" in line, line
