"""Is this Python the project's environment? Checked by `jobs/__init__.py` before anything heavy is imported.

Standard library only: it must run where the dependencies are missing. The case it is for: `ray job submit` runs the
entrypoint's `python` from the PATH of the process that started the Ray head, so a head started as
`.venv/bin/ray start --head` from a shell without the venv activated runs every job with the system Python, which
fails at its first `import torch`. Instead the job prints one line that names the fix, and exits 2.
"""

from __future__ import annotations

import importlib.util
import os
import sys

# What every job imports, `--executor local` on a machine without Ray included (tests/test_local_executor.py): a
# Python without them is not the project's environment. Ray, DuckDB, ... are checked where they are used.
REQUIRED_MODULES = ("torch", "transformers", "sentence_transformers", "pyarrow")
# Set by Ray's job supervisor in the environment of a `ray job submit` entrypoint (ray._private.runtime_env.constants).
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def missing_modules(modules: tuple[str, ...] = REQUIRED_MODULES) -> list[str]:
    """The modules of `modules` this Python cannot import (looked up, not imported)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def dependency_advice(missing: list[str], python: str = sys.executable, environ=os.environ) -> str:
    """One line: this Python lacks the project's dependencies, and the fix (under `ray job submit`: the head)."""
    what = f"{python} cannot import {', '.join(missing)}"
    if RAY_JOB_ENV in environ:
        return (f"{what}: `ray job submit` runs the `python` first on the PATH of the process that started the Ray "
                "head, and that is not the project's venv. Stop the head and start it from the activated venv: "
                "`source .venv/bin/activate && RAY_AUTH_MODE=token ray start --head` (README, 'On a cluster, on a "
                "schedule, offline'); on a cluster, every node needs the project installed (cluster.yaml's "
                "setup_commands, deploy/kuberay/Dockerfile)")  # fmt: skip
    return f"{what}: run the jobs with the project's venv, `.venv/bin/python -m jobs.<name>` (`make setup` makes it)"


def require_dependencies() -> None:
    """Exit 2 with one line when this Python lacks the project's dependencies (before an import fails deep down)."""
    missing = missing_modules()
    if missing:
        print(f"jobs: error: {dependency_advice(missing)}", file=sys.stderr, flush=True)
        raise SystemExit(2)
