"""Write a bundle (jobs.bundling): the wheels, models and datasets asked for, each cut into parts, their manifest and
the installer."""

from __future__ import annotations

import json
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from xsbert_core import InputError
from xsbert_core.cli import writable_folder

from ..processes import held_by, lock_file, release_removing
from .installer import FORMAT, MANIFEST, PARTS, BundleError, split_file
from .items import dataset_file, model_archive, model_folder
from .wheels import (
    canonical,
    download,
    marker_environment,
    needed,
    only_requirements,
    project_wheel,
    read_freeze,
    resolve,
)

INSTALLER = Path(__file__).resolve().parent / "installer.py"


def bundle(out: Path, part_size: int, python: str | None = None, platform_tag: str | None = None,
           exclude: tuple[str, ...] = (), have: Path | None = None, target_python: str | None = None,
           models: tuple[str, ...] = (), float16: bool = False, datasets: tuple[str, ...] = (),
           wheels: bool = True, only: tuple[str, ...] = (), log=print) -> dict[str, Any]:  # fmt: skip
    """Write the bundle into `out` (what it holds: jobs.bundling's docstring); returns its manifest. One bundle at a
    time into one folder: a second one stops in one line (the lock file .<out>.bundle.lock beside it), where both
    wrote into it and the manifest kept one of them, and a failed one removed the other's parts."""
    if out.is_dir() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not empty; choose a new --out")
    if target_python and (python or platform_tag):
        raise BundleError("--target-python resolves for that interpreter: no --python / --platform with it")
    if have is not None and not have.is_file():
        raise BundleError(f"--have {have}: no such file (a `pip freeze` of the target machine)")
    t0 = time.perf_counter()
    made = not out.exists()
    try:
        writable_folder(out, f"--out {out}", create=True)
    except InputError as exc:
        raise BundleError(str(exc)) from None
    lock = out.parent / f".{out.name}.bundle.lock"
    fh = lock_file(lock)
    if fh is None:
        raise BundleError(f"another jobs.bundle is writing {out} (lock held by {held_by(lock)}); wait for it, or "
                          "choose another --out")  # fmt: skip
    try:
        if any(out.iterdir()):  # a bundle finished there since the check above
            raise BundleError(f"{out} exists and is not empty; choose a new --out")
        try:
            # the models and datasets found before the wheels are built and resolved (minutes)
            folders = {name: model_folder(name) for name in models}
            files = {name: dataset_file(name) for name in datasets}
            return _write(out, part_size, python, platform_tag, exclude, have, target_python, folders, float16,
                          files, wheels, only, log, t0)  # fmt: skip
        except BaseException:
            # no half-written bundle left behind to be mistaken for a whole one (out was new or empty, and only
            # this process, which holds the lock, writes it)
            shutil.rmtree(out, ignore_errors=True)
            if not made:
                out.mkdir(parents=True, exist_ok=True)
            raise
    finally:
        release_removing(fh)


def _write(out: Path, part_size: int, python: str | None, platform_tag: str | None, exclude: tuple[str, ...],
           have: Path | None, target_python: str | None, folders: dict[str, Path], float16: bool,
           files: dict[str, Path], wheels: bool, only: tuple[str, ...], log, t0: float) -> dict[str, Any]:  # fmt: skip
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
            downloaded = download(get, work / "wheels", python, platform_tag)
            got = {canonical(f.name.split("-")[0]) for f in downloaded}
            missing = [p for p in get if canonical(p.split("==")[0]) not in got]
            if missing:
                raise BundleError(f"pip download brought no wheel for {', '.join(missing)}")
            for f in [wheel, *downloaded]:
                entry = split_file(f, parts_dir, part_size)
                mark = ({"project": True, **({"no_deps": True} if only else {})} if f == wheel else {})
                items.append({"kind": "wheel", **mark, **entry})
        for name, folder in folders.items():
            log(f"bundle: model {name}{' (float16 weights)' if float16 else ''}")
            archive, info = model_archive(name, folder, work, float16)
            items.append({**info, **split_file(archive, parts_dir, part_size)})
            archive.unlink()
        for name, path in files.items():
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
