"""The wheels of a bundle: the project's dependencies resolved for the target interpreter and platform by pip itself
(`pip install --dry-run --report`), less what the target has, downloaded by `pip download`; the project as a wheel."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .installer import BundleError

ROOT = Path(__file__).resolve().parents[2]
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def platform_tags(tag: str) -> list[str]:
    """pip's --platform values for a platform tag: manylinux_2_X_<arch> accepts every older glibc level and its
    legacy aliases (pip does not expand an explicit --platform by itself: manylinux_2_17_x86_64 alone would refuse
    ray's manylinux2014_x86_64 wheels)."""
    m = _MANYLINUX.match(tag)
    if not m:
        for legacy, (major, minor) in _LEGACY.items():
            if tag.startswith(legacy + "_"):
                return platform_tags(f"manylinux_{major}_{minor}_{tag[len(legacy) + 1:]}")
        return [tag]
    major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
    tags = [f"manylinux_{major}_{k}_{arch}" for k in range(minor, 4, -1)]
    tags += [f"{legacy}_{arch}" for legacy, (ma, mi) in _LEGACY.items() if (ma, mi) <= (major, minor)]
    return tags


def marker_environment(python: str | None, platform_tag: str | None) -> dict[str, str]:
    """PEP 508 marker values of the target (this interpreter's, with --python / --platform applied)."""
    from packaging.markers import default_environment

    env = dict(default_environment())
    if python:
        full = python if python.count(".") >= 2 else f"{python}.0"
        env.update(python_version=".".join(python.split(".")[:2]), python_full_version=full,
                   implementation_name="cpython", platform_python_implementation="CPython")  # fmt: skip
    if platform_tag:
        arch = platform_tag.split("_", 3)[-1] if platform_tag.startswith("manylinux_") else platform_tag.split("_")[-1]
        if platform_tag.startswith(("manylinux", "musllinux", "linux")):
            env.update(sys_platform="linux", platform_system="Linux", os_name="posix", platform_machine=arch)
        elif platform_tag.startswith("macosx"):
            env.update(sys_platform="darwin", platform_system="Darwin", os_name="posix", platform_machine=arch)
        elif platform_tag.startswith("win"):
            env.update(sys_platform="win32", platform_system="Windows", os_name="nt",
                       platform_machine="AMD64" if arch == "amd64" else arch)  # fmt: skip
    return env


def needed(report: dict[str, Any], roots: list[str], exclude: set[str], env: dict[str, str]) -> set[str]:
    """The distributions of pip's installation report reachable from `roots` through their requirements (markers
    evaluated for `env`, extras followed) without passing through an excluded one: what the bundle carries when the
    target has the excluded ones (and so whatever they need)."""
    from packaging.requirements import Requirement

    by_name = {canonical(i["metadata"]["name"]): i for i in report["install"]}
    extras: dict[str, set[str]] = {canonical(r): set() for r in roots}
    for i in report["install"]:
        if i.get("requested") and canonical(i["metadata"]["name"]) in extras:
            extras[canonical(i["metadata"]["name"])] |= set(i.get("requested_extras") or ())
    seen: set[str] = set()
    todo = [canonical(r) for r in roots if canonical(r) not in exclude]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        for text in by_name[name]["metadata"].get("requires_dist") or ():
            req = Requirement(text)
            child = canonical(req.name)
            if child in exclude:
                continue
            active = req.marker is None or any(req.marker.evaluate({**env, "extra": e})
                                               for e in ({""} | extras.get(name, set())))  # fmt: skip
            if not active:
                continue
            new = set(req.extras) - extras.get(child, set())
            if child not in extras or new:
                extras[child] = extras.get(child, set()) | set(req.extras)
                seen.discard(child)  # new extras: its requirements again
            todo.append(child)
    return seen


_BARE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def read_freeze(path: Path) -> dict[str, str | None]:
    """A `pip freeze` / `pip list --format=freeze` file: {canonical name: version} (local versions dropped: a
    target's torch 2.5.1+cu124 pins 2.5.1; editable and URL lines skipped). A line with a bare name (a package list
    without versions) says the target has it, in a version not known here: None, left out but not pinned."""
    pins: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-") or not line:
            continue
        if "==" in line:
            name, version = (s.strip() for s in line.split("==", 1))
            pins[canonical(name)] = version.split("+", 1)[0]
        elif _BARE_NAME.match(line):
            pins.setdefault(canonical(line), None)
    return pins


def only_requirements(wheel: Path, only: tuple[str, ...]) -> list[str]:
    """The project's own requirements (its wheel's Requires-Dist) of the distributions named in `only`, each with the
    project's version specifier and marker; `ray[data]` keeps ray's specifier with the extras given instead of the
    project's."""
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    project = {canonical(Requirement(line.split(":", 1)[1]).name): Requirement(line.split(":", 1)[1])
               for line in lines if line.startswith("Requires-Dist:")}  # fmt: skip
    out = []
    for text in only:
        want = Requirement(text)
        req = project.get(canonical(want.name))
        if req is None or (req.marker is not None and "extra" in str(req.marker)):
            raise BundleError(f"--only {text}: not one of the project's requirements ({', '.join(sorted(project))})")
        req.extras = set(want.extras) if want.extras else req.extras
        out.append(str(req))
    return out


def _run(cmd: list[str], what: str) -> str:
    """A pip command; PYTHONPATH left out, so that pip sees the target's environment and nothing else."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if proc.returncode != 0:
        raise BundleError(f"{what} failed: {pip_error(proc.stdout)}")
    return proc.stdout


def pip_error(output: str) -> str:
    """pip's last error as one line: its last `ERROR: ...` line, else its last paragraph (a usage error is pip's
    usage, then `--flag error: ...` wrapped to the terminal's width), its lines joined."""
    lines = [line for line in output.strip().splitlines() if "is ignored: it is neither" not in line]
    errors = [line.strip() for line in lines if line.startswith("ERROR:")]
    if errors:
        return errors[-1]
    paragraphs = [p for p in "\n".join(lines).split("\n\n") if p.strip()]
    return " ".join(paragraphs[-1].split()) if paragraphs else "(pip said nothing)"


def project_wheel(dest: Path) -> Path:
    """The project (this checkout) as a wheel in `dest`."""
    if not (ROOT / "pyproject.toml").is_file():
        raise BundleError(f"the project wheel is built from a source checkout; {ROOT} has no pyproject.toml")
    dest.mkdir(parents=True, exist_ok=True)
    # From a copy of what the wheel holds: an in-tree build would leave build/ and *.egg-info in the checkout, and a
    # stale build/lib would carry deleted modules into the next wheel.
    src = dest / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("pyproject.toml", "README.md", *(p.name for p in ROOT.glob("LICEN[CS]E*")), "xsbert_core", "jobs"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=skip)
        elif (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(src)],
         "building the project wheel (pip wheel)")  # fmt: skip
    wheels = sorted(dest.glob("xsbert_scale-*.whl"))
    if not wheels:
        raise BundleError(f"pip wheel wrote no xsbert_scale wheel into {dest}")
    return wheels[-1]


def target_flags(python: str | None, platform_tag: str | None) -> list[str]:
    flags: list[str] = []
    if python:
        flags += ["--python-version", python, "--implementation", "cp"]
    for tag in platform_tags(platform_tag) if platform_tag else ():
        flags += ["--platform", tag]
    return flags


def resolve(wheel: Path, work: Path, python: str | None, platform_tag: str | None, have: dict[str, str | None],
            target_python: str | None, requirements: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """pip's installation report for the project wheel on the target (or, given, for `requirements` alone): every
    distribution with its version."""
    report = work / "report.json"
    cmd = [sys.executable, "-m", "pip"]
    if target_python:  # pip run against that interpreter's environment: what is there already stays out
        cmd += ["--python", target_python, "install", "--dry-run"]
    else:
        cmd += ["install", "--dry-run", "--ignore-installed", *target_flags(python, platform_tag)]
    cmd += ["--only-binary", ":all:", "--quiet", "--report", str(report)]
    if have:
        constraints = work / "have-constraints.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(have.items())
                                       if n != "xsbert-scale" and v is not None))  # fmt: skip
        cmd += ["--constraint", str(constraints)]
    _run([*cmd, *(requirements or [str(wheel)])],
         "resolving the project's dependencies for the target (pip install --dry-run)")
    return json.loads(report.read_text())


def download(pins: list[str], dest: Path, python: str | None, platform_tag: str | None) -> list[Path]:
    """The wheels of `pins` (name==version) for the target, by pip download (its cache serves repeats)."""
    dest.mkdir(parents=True, exist_ok=True)
    if pins:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
              "--dest", str(dest), *target_flags(python, platform_tag), *pins],
             "downloading the wheels (pip download)")  # fmt: skip
    return sorted(dest.glob("*.whl"))
