"""Store credentials never travel in a Ray job's runtime_env: every shipped doc, manifest and message is checked.

A job's runtime_env (`--runtime-env-json`, `runtimeEnvYAML`, `env_vars`) is kept with the job, and the dashboard and
`ray job list` show it (an unauthenticated `curl http://HEAD:8265/api/jobs/` once returned AWS keys put there).
Credentials come from the node: its instance role or profile, a Kubernetes Secret or service account, its own
environment. Two checks over every shipped file:

- payloads: each runtime env the files hold (the JSON of `--runtime-env-json '...'`, each `runtimeEnvYAML`, any
  `env_vars` mapping) names no credential variable (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
  GOOGLE_APPLICATION_CREDENTIALS, ...);
- prose: no sentence that speaks of credentials offers a runtime env as their source. A runtime-env mention in such a
  sentence must be negated (never / not / no ...) in its own clause: between the last ':', ';' or '—' before it
  and the mention. The check catches the sentences that said so before (test_the_check_catches_what_the_docs_said).

Shipped files: README.md, docs/**/*.md, deploy/** (manifests, Dockerfile, README), cluster.yaml, configs/*.yaml, and
the messages (string literals, docstrings aside) of jobs/ and xsbert_core/.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

CREDENTIAL_VARS = re.compile(
    r"\b(AWS_ACCESS_KEY_ID|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN|AWS_SECURITY_TOKEN|GOOGLE_APPLICATION_CREDENTIALS|"
    r"AZURE_STORAGE_KEY|AZURE_CLIENT_SECRET|\w*(?:SECRET|PASSWORD|ACCESS_KEY)\w*)\b"
)
RUNTIME_ENV = re.compile(r"runtime[_ -]?env(?:ironment)?s?\b|runtimeEnv\w*|--runtime-env(?:-json)?|\benv_vars\b",
                         re.IGNORECASE)  # fmt: skip
CREDENTIAL_WORD = re.compile(r"credential|secret|access key|\bkeys\b|password|AWS_ACCESS_KEY_ID|AWS_SECRET",
                             re.IGNORECASE)  # fmt: skip
NEGATION = re.compile(r"\b(never|not|no|nothing|nor|without)\b|n't\b", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.?!;])\s+|\n\s*\n")
CLAUSE_START = re.compile(r"[:;—]|\s-\s|--(?!\w)")


def shipped_texts() -> dict[str, str]:
    """name -> text of every shipped doc and manifest."""
    files = [ROOT / "README.md", ROOT / "cluster.yaml", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted(p for p in (ROOT / "deploy").rglob("*") if p.is_file()),
             *sorted((ROOT / "configs").glob("*.yaml"))]  # fmt: skip
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in files}


def messages() -> dict[str, str]:
    """name:line -> the text of each string literal (f-strings joined, docstrings aside) in jobs/ and xsbert_core/."""
    out = {}
    for path in sorted([*(ROOT / "jobs").rglob("*.py"), *(ROOT / "xsbert_core").rglob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
        }  # fmt: skip
        inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            if id(node) in docstrings or id(node) in inner:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            else:
                continue
            out[f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"] = text
    return out


# --------------------------------------------------------------------------- the checks
def runtime_env_payloads(text: str) -> list[dict]:
    """The runtime envs a text holds: `--runtime-env-json '...'` JSON and `runtimeEnvYAML: |` blocks."""
    found = []
    for m in re.finditer(r"--runtime-env-json[ =]'([^']*)'", text):
        try:
            found.append(json.loads(m.group(1)))
        except json.JSONDecodeError:
            found.append({"unparsed": m.group(1)})
    for m in re.finditer(r"^(\s*)runtimeEnvYAML:\s*\|\s*\n((?:\1\s+.*\n|\s*\n)+)", text, re.MULTILINE):
        found.append(yaml.safe_load(m.group(2)) or {})
    return found


def payload_problems(text: str) -> list[str]:
    problems = []
    for env in runtime_env_payloads(text):
        names = json.dumps(env.get("env_vars", {}) if isinstance(env, dict) else env)
        problems += [f"runtime env names {v}: {env}" for v in CREDENTIAL_VARS.findall(names)]
    # Any env_vars mapping, whatever the format (YAML, a Python dict, JSON): no credential variable in it.
    for m in re.finditer(r"\benv_vars\b['\"]?\s*[:=]\s*[{\n]", text):
        body = text[m.end() : m.end() + 400].split("\n\n")[0]
        body = body[: body.find("}")] if "{" in text[m.start() : m.end()] and "}" in body else body
        problems += [f"env_vars holds {v}" for v in CREDENTIAL_VARS.findall(body)]
    return problems


def prose_problems(text: str) -> list[str]:
    """Sentences that speak of credentials and offer a runtime env as their source (see the module docstring)."""
    problems = []
    for sentence in SENTENCE_END.split(text):
        if not CREDENTIAL_WORD.search(sentence):
            continue
        for m in RUNTIME_ENV.finditer(sentence):
            before = sentence[: m.start()]
            starts = [c.end() for c in CLAUSE_START.finditer(before)]
            clause = before[starts[-1] :] if starts else before
            if not NEGATION.search(clause):
                problems.append(" ".join(sentence.split()))
                break
    return problems


# --------------------------------------------------------------------------- the check itself
# What docs/STORE.md, jobs/attribute.py and docs/CLUSTER.md said before: each must be caught.
SAID_BEFORE = [
    "The workers get the driver's endpoint and region (not its credentials: they use their own — the job's "
    "`runtime_env` `env_vars`, the nodes' environment or instance role); a worker that cannot write fails the run.",
    "a stage-2 task could not write its part of the store (x); do the Ray workers reach the store with credentials of "
    "their own (the job's runtime_env env_vars, the nodes' environment or instance role)?",
    "Pass the keys with the job: --runtime-env-json '{\"env_vars\": {\"AWS_ACCESS_KEY_ID\": \"...\", "
    "\"AWS_SECRET_ACCESS_KEY\": \"...\"}}'",
    "runtimeEnvYAML: |\n  working_dir: /home/ray/xsbert-scale\n  env_vars:\n    AWS_SECRET_ACCESS_KEY: abc\n",
]
# What the docs say now: credentials never in a runtime env, and runtime envs without credentials.
SAID_NOW = [
    "Credentials come from the node and never go into a job's `runtime_env` (`--runtime-env-json`, its "
    "`env_vars`).",
    "(not its credentials: they use their own, from the node — its role, a Kubernetes Secret —, never from the job's "
    "`runtime_env`, which Ray shows with the job)",
    "ray job submit --working-dir . --runtime-env-json '{\"excludes\": [\".venv\", \".git\"]}' -- python -m jobs.x",
    "runtimeEnvYAML: |\n  working_dir: /home/ray/xsbert-scale\n  env_vars:\n    XSBERT_CACHE: /home/ray/.cache\n",
]


@pytest.mark.parametrize("text", SAID_BEFORE, ids=["STORE.md", "attribute.py", "runtime-env-json", "runtimeEnvYAML"])
def test_the_check_catches_what_the_docs_said(text):
    assert payload_problems(text) + prose_problems(text)


@pytest.mark.parametrize("text", SAID_NOW, ids=["never", "negated clause", "excludes", "cache env var"])
def test_the_check_passes_what_the_docs_say_now(text):
    assert payload_problems(text) + prose_problems(text) == []


def test_the_check_reads_every_shipped_runtime_env():
    texts = shipped_texts()
    assert {"README.md", "cluster.yaml", "docs/CLUSTER.md", "docs/STORE.md", "deploy/kuberay/rayjob.yaml",
            "deploy/kuberay/raycronjob.yaml", "deploy/kuberay/README.md", "deploy/kuberay/Dockerfile"} <= set(texts)
    payloads = [(name, env) for name, text in texts.items() for env in runtime_env_payloads(text)]
    # The README's and CLUSTER.md's --runtime-env-json excludes, and both KubeRay manifests' runtimeEnvYAML.
    assert sum(name.startswith("deploy/kuberay/ray") for name, _ in payloads) == 2, payloads
    assert any(name == "README.md" for name, _ in payloads) and any(name == "docs/CLUSTER.md" for name, _ in payloads)
    assert all(isinstance(env, dict) and "unparsed" not in env for _, env in payloads), payloads
    assert len(messages()) > 500  # the messages of jobs/ and xsbert_core/ are read


@pytest.mark.parametrize("name", sorted(shipped_texts()))
def test_no_credentials_in_a_runtime_env_in_shipped_files(name):
    text = shipped_texts()[name]
    problems = payload_problems(text) + prose_problems(text)
    assert not problems, f"{name}: credentials belong to the node, never to a job's runtime_env:\n" + "\n".join(
        problems
    )


def test_no_message_suggests_credentials_in_a_runtime_env():
    problems = [f"{where}: {p}" for where, text in messages().items() for p in prose_problems(text)]
    assert not problems, "\n".join(problems)
