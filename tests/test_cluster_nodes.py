"""--cell-writer on a Ray cluster whose second node joins mid-run and does not see the local --out.

Two real Ray nodes on this machine: a head (`ray start --head`), and a second node started in a private mount
namespace (`unshare -m`, root) with an empty tmpfs over the folder that holds --out, so that node has a disk of its
own where the driver's --out is (as a node of an autoscaling cluster without a shared file system has). The driver
runs in this process and joins the head; the second node is started between wave 1 and wave 2 (from the job's
per-wave callback), as cluster.yaml's GPU group adds nodes after the job started.

- `auto`: the job finishes with the rows of a run that never saw the second node (the driver writes the cells from
  the wave the node first appears at), and nothing was written on the second node's disk;
- `workers`: refused in one line naming the node, exit 2, before anything is computed (the node there at the
  start), nothing on the second node's disk. (A node that first appears at a later wave is asked by the same check
  before that wave, as the `auto` test shows; the second node is started once per module: a node started again on
  this machine after being stopped did not register within minutes on a loaded machine.)

Where a mount namespace cannot be made (not root, no unshare) the tests are skipped and say why.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from endpoints import free_ports
from jobtools import TABLES, rows, stop_process_group, stsb_rows, write_tsv

BIN = Path(sys.executable).parent
N_PAIRS = 10
FLAGS = ["--layer", "1", "--steps", "2", "--wave-size", "2", "--batch-size", "2", "--num-actors", "1",
         "--cpus-per-actor", "1", "--max-retries", "0", "-q"]  # fmt: skip
START_TIMEOUT_S = 600


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    # Token authentication off for these two private nodes only: the test is about where stage 2 writes, not about
    # joining (tests/test_readme_submit.py submits and joins with tokens).
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0", RAY_raylet_start_wait_time_s="500",
               RAY_agent_register_timeout_ms="300000")  # fmt: skip
    # (the last two: on a busy machine a node's agents took longer to start than Ray waits by default)
    return env


def _node_ports() -> list[str]:
    agent, agent_grpc, runtime_env, metrics, node_manager, object_manager = free_ports(6)
    return [f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
            f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}"]  # fmt: skip


class Node:
    """A blocking `ray start` (head, or a node joining `address`, optionally under `unshare -m` with an empty
    tmpfs over `private`), in its own process group, stopped by SIGTERM then SIGKILL of that group."""

    def __init__(self, log: Path, address: str | None = None, private: Path | None = None, **head: str) -> None:
        cmd = [str(BIN / "ray"), "start", "--block", "--num-cpus=2", "--disable-usage-stats", *_node_ports()]
        if address is None:
            cmd += ["--head", f"--port={head['port']}", "--include-dashboard=false", f"--temp-dir={head['temp_dir']}",
                    f"--ray-client-server-port={head['client_port']}", f"--dashboard-port={head['dashboard_port']}"
                    ]  # fmt: skip
        else:
            cmd += [f"--address={address}"]
        if private is not None:  # its own mount namespace: an empty tmpfs where the driver's --out lies
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   f'mount -t tmpfs -o size=64m xsbert-node2 "{private}" && exec "$@"', "sh", *cmd]  # fmt: skip
        self.log_path, self.started = log, time.time()
        self._log = open(log, "wb")  # noqa: SIM115 - lives as long as the node
        self.proc = subprocess.Popen(cmd, env=_env(), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_process_group(self.proc, self._log)


def _can_unshare(tmp: Path) -> str | None:
    """None where a private mount namespace with a tmpfs can be made here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = tmp / "probe"
    probe.mkdir(exist_ok=True)
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=1m",
                           "xsbert-probe", str(probe)], capture_output=True, text=True, check=False)  # fmt: skip
    return None if done.returncode == 0 else f"cannot mount in a private mount namespace: {done.stderr.strip()[:200]}"


class TwoNodes:
    """A private head (started at once) and a second node without --out's folder, started by `add_node()`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.shared = root / "shared"  # --out lives here: the head sees it, the second node gets an empty tmpfs
        self.shared.mkdir()
        self.temp_dir = tempfile.mkdtemp(prefix="xsn-", dir="/tmp")  # short: Ray's unix sockets (108 bytes)
        port, client_port, dashboard_port = free_ports(3)  # (Ray binds the dashboard's port even without it)
        self.address = f"127.0.0.1:{port}"
        self.head = Node(root / "head.log", port=str(port), temp_dir=self.temp_dir, client_port=str(client_port),
                         dashboard_port=str(dashboard_port))  # fmt: skip
        self.node2: Node | None = None
        self._wait_nodes(1, self.head)

    def add_node(self) -> None:
        """The second node, started (a second try where its raylet died while starting on a busy machine)."""
        if self.node2 is not None and self.node2.proc.poll() is None:
            return
        for attempt in (1, 2):
            self.node2 = Node(self.root / f"node2-{attempt}.log", address=self.address, private=self.shared)
            try:
                self._wait_nodes(2, self.node2)
                return
            except RuntimeError:
                self.node2.stop()
                if attempt == 2:
                    raise

    def _wait_nodes(self, n: int, node: Node) -> None:
        """Until `node`'s `ray start` says the runtime started (it has registered), and, where this process is
        connected, until the cluster lists `n` live nodes."""
        import ray

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {node.proc.returncode}:\n{node.log()}")
            crashed = [
                f
                for f in Path(self.temp_dir).glob("session_latest/logs/raylet*.err")
                if f.stat().st_mtime >= node.started and "Check failed" in f.read_text(errors="replace")
            ]
            if crashed:  # its raylet died while starting: ray start itself would wait for it for minutes
                raise RuntimeError(f"the raylet died while the node started:\n{crashed[0].read_text()[-2000:]}")
            if "Ray runtime started" in node.log_path.read_text(errors="replace") and (
                    not ray.is_initialized() or sum(1 for x in ray.nodes() if x["Alive"]) >= n):  # fmt: skip
                return
            time.sleep(1)
        raise TimeoutError(f"{n} Ray node(s) not up after {START_TIMEOUT_S}s:\n{node.log()}")

    def on_node2(self, fn, *args):
        """fn(*args) in a task on the second node (the driver of this process is connected)."""
        import ray
        from ray import cloudpickle
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cloudpickle.register_pickle_by_value(sys.modules[fn.__module__])  # the workers cannot import this module
        (node,) = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != self._head_id()]
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        return ray.get(ray.remote(fn).options(num_cpus=0, scheduling_strategy=strategy).remote(*args), timeout=120)

    def _head_id(self) -> str:
        import ray

        return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and _is_head(n))

    def stop(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        for node in (self.node2, self.head):
            if node is not None:
                node.stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _is_head(node: dict) -> bool:
    return "node:__internal_head__" in node.get("Resources", {})


def _listing(folder: str) -> list[str]:
    """Every file under `folder`, as seen from the node this runs on."""
    return sorted(str(p) for p in Path(folder).rglob("*"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny):
    import ray

    root = tmp_path_factory.mktemp("two-nodes")
    why = _can_unshare(root)
    if why is not None:
        pytest.skip(why)
    if ray.is_initialized():  # the shared in-process Ray of other modules (started again by them when needed)
        ray.shutdown()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the driver of this process joins the head: see _env
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    nodes = TwoNodes(root)
    try:
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_tsv(tmp_path_factory.mktemp("nodes-data") / "pairs.tsv", stsb_rows(N_PAIRS, start=20))


def _args(cluster: TwoNodes, out: Path, data: Path, model: Path, *flags: str):
    from jobs.attribute import settings

    return settings(["--dataset", str(data), "--model", str(model), *FLAGS, *flags, "--out", str(out),
                     "--ray-address", cluster.address])  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data, tiny) -> Path:
    """The same selection and settings computed without Ray (--executor local): the rows the cluster must store."""
    from jobs.attribute import main, parse_args

    out = tmp_path_factory.mktemp("reference")
    summary = main(parse_args(["--dataset", str(data), "--model", str(tiny.folder("bert", 2)), *FLAGS,
                               "--executor", "local", "--out", str(out)]))  # fmt: skip
    return Path(summary["run_dir"])


def test_a_node_that_joins_mid_run_without_the_out_folder_gets_no_cells_to_write(cluster, data, reference, tiny,
                                                                                    caplog):  # fmt: skip
    import ray

    from jobs.attribute import attribute, prepare, print_summary

    if cluster.node2 is not None:
        pytest.skip("the second node is already up (this test adds it mid-run)")
    out = cluster.shared / "runs-auto"
    lines: list[str] = []

    def on_wave(wave: object) -> None:  # jobs.attribution.run.WaveDone
        lines.append(str(wave))
        if len(lines) == 1:  # after wave 1's commit: the cluster scales up
            cluster.add_node()

    caplog.set_level(logging.WARNING, logger="jobs.attribution.placement")
    summary = attribute(prepare(_args(cluster, out, data, tiny.folder("bert", 2))), on_wave=on_wave)
    print_summary(summary, summary["run_dir"])
    assert len(lines) == N_PAIRS // 2 and sum(1 for n in ray.nodes() if n["Alive"]) == 2
    assert summary["n_done"] == N_PAIRS and summary["n_quarantined"] == 0
    run_dir = Path(summary["run_dir"])
    for table in TABLES:  # the rows of a run without the second node, every column
        assert rows(run_dir, table) == rows(reference, table), table
    # wave 1 (one node) written by its task, as part-<wave>-<first ord>; from wave 2 on (the second node asked
    # first) by the driver, as part-<wave>
    parts = sorted(p.name for p in (run_dir / "cells").glob("part-*.parquet"))
    assert len(parts) == N_PAIRS // 2 and len(parts[0].split("-")) == 3, parts
    assert all(len(name.split("-")) == 2 for name in parts[1:]), parts
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["runs"][-1]["resources"]["cell_writer"] == "driver"
    assert any("does not see --out" in r.getMessage() and "from wave 2 on" in r.getMessage() for r in caplog.records)
    assert not list(run_dir.glob(".node-check-*"))  # the driver's marker removed
    assert cluster.on_node2(_listing, str(cluster.shared)) == []  # nothing written on the second node's own disk


def test_workers_on_a_node_without_the_out_folder_is_refused_before_computing(cluster, data, tiny, capsys):
    from jobs.attribute import cli

    cluster.add_node()  # up from the start this time
    out = cluster.shared / "runs-workers"
    code = cli(["--dataset", str(data), "--model", str(tiny.folder("bert", 2)), *FLAGS, "--cell-writer", "workers",
                "--out", str(out), "--ray-address", cluster.address])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("jobs.attribute: error: --cell-writer workers: node "), err
    assert f"does not see --out {out}" in err[0] and "stopped before wave 1, nothing of it written" in err[0]
    (run_dir,) = out.iterdir()
    assert not list(run_dir.rglob("*.parquet")) and not list(run_dir.glob(".node-check-*"))
    assert cluster.on_node2(_listing, str(cluster.shared)) == []
