"""Offline bundles: files in parts with a manifest of checksums, float16 model weights, and the installer.

This one file is both the library jobs.bundling writes bundles with and the bundle's own `install.py` (it is copied
into every bundle as it is): it needs nothing but the Python standard library, and numpy for float16 model weights
(the installer finds numpy among the wheels it has just installed, or in the interpreter that runs it).

A bundle is a folder:

    manifest.json        what the bundle holds: items (wheels, models, datasets), each a file cut into parts
    install.py           this file
    parts/<item file>.NNN  the parts, each at most the bundle's part size (sha256 and size in the manifest)

Install (on the machine without network; checks every part first, then reassembles and installs):

    python install.py --into /opt/xsbert                   # a virtualenv there, the wheels installed with --no-index
    python install.py --into /opt/xsbert --system-site-packages   # ... seeing the machine's own torch, etc.
    python install.py --into DIR --models-only             # only reassemble the models and datasets (no pip)
    python install.py --into DIR --target DIR/site         # wheels unpacked there (pip --target --no-deps), for
                                                           # PYTHONPATH=DIR/site beside an interpreter's own packages

What lands in DIR: the virtualenv (bin/python, bin/xsbert), DIR/models/<name> (model folders, float32 weights),
DIR/data/<file> (datasets), DIR/bundle.json (the manifest, with where each item went).

float16 weights: every float32 tensor of a model's model.safetensors is stored as float16 (half the bytes) unless
float16 cannot hold it (|w| > 65504); the installer writes it back as float32, w' = float32(float16(w)). The
manifest records max |w' - w| over all weights (`max_abs_rounding_error`) and max |w|, measured when the bundle
was written, and the sha256 of the rebuilt file, which the installer checks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
PARTS = "parts"
FORMAT = "xsbert-offline-bundle/1"
WEIGHTS = "model.safetensors"
FLOAT16_KEY = "xsbert.float16_from_float32"  # safetensors metadata: the tensors stored as float16 (a JSON list)
FLOAT16_MAX = 65504.0
CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle that cannot be written or installed: one line, naming the file or part."""


# --------------------------------------------------------------------------- sizes, checksums, parts
def parse_size(text: str) -> int:
    """'60MiB', '15MB', '1GiB', '1048576' -> bytes."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    unit = t[len(num) :]
    if unit not in units:
        raise BundleError(f"size {text!r}: unit must be one of B, KB, MB, GB, KiB, MiB, GiB")
    try:
        value = int(float(num) * units[unit])
    except ValueError:
        raise BundleError(f"size {text!r} is not a number with a unit such as 60MiB") from None
    if value < 1024:
        raise BundleError(f"size {text!r}: a part must hold at least 1 KiB")
    return value


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def split_file(path: Path, parts_dir: Path, part_size: int, name: str | None = None,
               root: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Cut `path` into parts_dir/<name>.000, .001, ... of at most `part_size` bytes; the manifest entry of the file:
    {file, size, sha256, parts: [{file, size, sha256}]} (part paths relative to `root`, default parts_dir's parent:
    the bundle)."""
    name = name or path.name
    root = root or parts_dir.parent
    parts_dir.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    parts, size = [], 0
    with open(path, "rb") as src:
        k = 0
        while True:
            target = parts_dir / f"{name}.{k:03d}"
            h, n = hashlib.sha256(), 0
            with open(target, "wb") as out:
                while n < part_size:
                    block = src.read(min(CHUNK, part_size - n))
                    if not block:
                        break
                    out.write(block)
                    h.update(block)
                    whole.update(block)
                    n += len(block)
            if n == 0 and k > 0:  # the file ended exactly at a part boundary
                target.unlink()
                break
            parts.append({"file": target.relative_to(root).as_posix(), "size": n, "sha256": h.hexdigest()})
            size += n
            k += 1
            if n < part_size:
                break
    return {"file": name, "size": size, "sha256": whole.hexdigest(), "parts": parts}


def check_parts(bundle: Path, items: list[dict[str, Any]]) -> None:
    """Every part of every item there, of its size and sha256; else BundleError naming the first bad part."""
    for item in items:
        for part in item["parts"]:
            path = bundle / part["file"]
            if not path.is_file():
                raise BundleError(f"part {part['file']} of {item['file']} is missing from {bundle}")
            size = path.stat().st_size
            if size != part["size"]:
                raise BundleError(f"part {part['file']} of {item['file']} has {size} bytes, the manifest says "
                                  f"{part['size']} (cut short or corrupt: copy it again)")  # fmt: skip
            if sha256_file(path) != part["sha256"]:
                raise BundleError(f"part {part['file']} of {item['file']} is corrupt (sha256 differs from the "
                                  "manifest's): copy it again")  # fmt: skip


def join_parts(bundle: Path, item: dict[str, Any], dest: Path) -> Path:
    """Reassemble an item's parts into `dest` and check the whole file's sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with open(dest, "wb") as out:
        for part in item["parts"]:
            with open(bundle / part["file"], "rb") as src:
                for block in iter(lambda: src.read(CHUNK), b""):  # noqa: B023 - src is read at once
                    out.write(block)
                    h.update(block)
    if h.hexdigest() != item["sha256"]:
        raise BundleError(f"{item['file']}: its parts join to a file whose sha256 differs from the manifest's")
    return dest


# --------------------------------------------------------------------------- safetensors in float16
def _read_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    """(header, data) of a safetensors file: an 8-byte little-endian header length, the JSON header, the bytes."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write_safetensors(path: Path, header: dict[str, Any], tensors: dict[str, bytes]) -> None:
    """Tensors in the header's order of offsets, laid out again; the header padded to 8 bytes with spaces."""
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    out_header: dict[str, Any] = {}
    if "__metadata__" in header:
        out_header["__metadata__"] = header["__metadata__"]
    offset = 0
    for k in names:
        b = tensors[k]
        out_header[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"],
                         "data_offsets": [offset, offset + len(b)]}  # fmt: skip
        offset += len(b)
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little"))
        fh.write(text)
        for k in names:
            fh.write(tensors[k])


def weights_to_float16(src: Path, dest: Path) -> dict[str, Any]:
    """Write `src` (a safetensors file) to `dest` with every float32 tensor that float16 holds as float16.

    Measured here, on the float32 that the installer rebuilds (w' = float32(float16(w))): max |w' - w| and
    max |w' - w| / max(|w|, 1e-3) over all weights (`max_abs_rounding_error`, `max_rel_rounding_error`), max |w|.
    Tensors with |w| > 65504 stay float32 (float16 would make them inf). Returns those figures and the sha256 of
    the float32 file the installer will rebuild."""
    import numpy as np

    header, data = _read_safetensors(src)
    tensors: dict[str, bytes] = {}
    converted, kept = [], []
    max_abs, max_rel, max_w = 0.0, 0.0, 0.0
    for k, meta in header.items():
        if k == "__metadata__":
            continue
        b0, b1 = meta["data_offsets"]
        raw = data[b0:b1]
        if meta["dtype"] == "F32" and b1 > b0:
            w = np.frombuffer(raw, "<f4")
            big = float(np.abs(w).max())
            max_w = max(max_w, big)
            if big <= FLOAT16_MAX:
                half = w.astype("<f2")
                err = np.abs(half.astype("<f4") - w)
                max_abs = max(max_abs, float(err.max()))
                max_rel = max(max_rel, float((err / np.maximum(np.abs(w), 1e-3)).max()))
                tensors[k] = half.tobytes()
                converted.append(k)
                continue
            kept.append(k)
        tensors[k] = raw
    out = dict(header)
    for k in converted:
        out[k] = dict(header[k], dtype="F16")
    meta = dict(header.get("__metadata__") or {})
    meta[FLOAT16_KEY] = json.dumps(sorted(converted))
    out["__metadata__"] = meta
    _write_safetensors(dest, out, tensors)
    with tempfile.TemporaryDirectory() as tmp:  # the installer's result, to record its checksum
        rebuilt = weights_to_float32(dest, Path(tmp) / WEIGHTS)
        digest = sha256_file(rebuilt)
    return {"float16_tensors": len(converted), "float32_tensors_kept": kept, "max_abs_weight": max_w,
            "max_abs_rounding_error": max_abs, "max_rel_rounding_error": max_rel, "float32_sha256": digest,
            "float32_bytes": src.stat().st_size}  # fmt: skip


def weights_to_float32(src: Path, dest: Path) -> Path:
    """The installer's half of weights_to_float16: the tensors it stored as float16 back to float32 (exactly
    float32(float16(w))), the metadata as it was before."""
    import numpy as np

    header, data = _read_safetensors(src)
    meta = dict(header.get("__metadata__") or {})
    names = set(json.loads(meta.pop(FLOAT16_KEY, "[]")))
    tensors, out = {}, dict(header)
    for k, m in header.items():
        if k == "__metadata__":
            continue
        b0, b1 = m["data_offsets"]
        if k in names:
            tensors[k] = np.frombuffer(data[b0:b1], "<f2").astype("<f4").tobytes()
            out[k] = dict(m, dtype="F32")
        else:
            tensors[k] = data[b0:b1]
    if meta:
        out["__metadata__"] = meta
    else:
        out.pop("__metadata__", None)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _write_safetensors(dest, out, tensors)
    return dest


# --------------------------------------------------------------------------- install
def _venv_python(into: Path) -> Path:
    return into / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _install_model(bundle: Path, item: dict[str, Any], into: Path, stage: Path) -> Path:
    """A model item (a tar of the folder) into into/models/<name>, float16 weights back to float32."""
    archive = join_parts(bundle, item, stage / item["file"])
    folder = into / "models" / item["name"]
    tmp = Path(tempfile.mkdtemp(dir=into / "models", prefix=f".{item['name']}-"))
    try:
        with tarfile.open(archive) as tar:
            if sys.version_info >= (3, 12):
                tar.extractall(tmp, filter="data")
            else:  # our own archive: names were checked when it was written
                tar.extractall(tmp)  # noqa: S202
        if item.get("float16"):
            half = tmp / WEIGHTS
            weights_to_float32(half, tmp / f"{WEIGHTS}.f32")
            os.replace(tmp / f"{WEIGHTS}.f32", half)
            if sha256_file(half) != item["float16"]["float32_sha256"]:
                raise BundleError(f"model {item['name']}: the rebuilt float32 weights differ from those the bundle "
                                  "recorded (sha256)")  # fmt: skip
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        archive.unlink(missing_ok=True)
    return folder


def _pip(python: Path, *args: str) -> None:
    """pip of `python`, isolated from the machine's pip configuration (no index, no find-links but the bundle's)."""
    cmd = [str(python), "-m", "pip", "--isolated", "--disable-pip-version-check", *args]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
        raise BundleError(f"pip failed ({' '.join(cmd[3:6])} ...):\n{tail}")


def unmet(python: Path, target: Path, names: set[str]) -> list[str]:
    """`pip check` of `python` with `target` first on its path: the lines about the distributions `names`
    (canonical), i.e. what the bundle's wheels need and the environment lacks or has in another version."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([str(python), "-m", "pip", "--isolated", "--disable-pip-version-check", "check"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    first = [line.split(" ")[0].lower().replace("_", "-").replace(".", "-") for line in proc.stdout.splitlines()]
    return [line for line, name in zip(proc.stdout.splitlines(), first) if name and name in names]


def read_manifest(bundle: Path) -> dict[str, Any]:
    """The bundle's manifest.json, checked to be one this installer reads (BundleError in one line if not)."""
    path = bundle / MANIFEST
    if not path.is_file():
        raise BundleError(f"{path} is missing: not a bundle folder")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"{path}: not readable JSON ({exc}): copy it again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"{path}: format {found!r}, this installer reads {FORMAT}")
    if not isinstance(manifest.get("items"), list):
        raise BundleError(f"{path}: no list of items: copy it again")
    return manifest


def install(bundle: Path, into: Path, system_site_packages: bool = False, models_only: bool = False,
            python: str | None = None, target: Path | None = None, log=print) -> dict[str, Any]:  # fmt: skip
    """Check every part, then install the bundle into `into` (see the module's docstring); returns the manifest
    with where each item went (also written to into/bundle.json). With `target`, the wheels are unpacked into that
    folder instead (pip --target --no-deps: the bundle was resolved for the interpreter's environment, --have), and
    what they need and the interpreter lacks is reported (`unmet`)."""
    manifest = read_manifest(bundle)
    items = manifest["items"]
    if into.exists() and not into.is_dir():
        raise BundleError(f"--into {into}: not a folder")
    check_parts(bundle, items)
    log(f"install: {len(items)} items in {sum(len(i['parts']) for i in items)} parts checked (sha256)")
    into.mkdir(parents=True, exist_ok=True)
    (into / "models").mkdir(exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=into, prefix=".bundle-"))
    try:
        wheels = [i for i in items if i["kind"] == "wheel"]
        if wheels and not models_only:
            for item in wheels:
                join_parts(bundle, item, stage / "wheels" / item["file"])
            if target is not None:
                py = Path(python or sys.executable)
                log(f"install: {len(wheels)} wheels unpacked with pip --target {target} --no-deps")
                _pip(py, "install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                     "--target", str(target), *(str(stage / "wheels" / i["file"]) for i in wheels))  # fmt: skip
                # the project itself, when it was bundled --only some of its requirements, needs the rest from the
                # machine or not at all: not asked about
                names = {i["file"].split("-")[0].lower().replace("_", "-") for i in wheels if not i.get("no_deps")}
                manifest["unmet"] = unmet(py, target, names)
                for line in manifest["unmet"]:
                    log(f"install: warning: {line}")
                manifest.update(python=str(py), installed_into=str(target))
                wheels = []
            else:
                py = Path(python) if python else _venv_python(into)
            if wheels and not python and not py.exists():
                flags = ["--system-site-packages"] if system_site_packages else []
                log(f"install: a virtualenv in {into}{' (with the system site-packages)' if flags else ''}")
                subprocess.run([sys.executable, "-m", "venv", *flags, str(into)], check=True)
            # The project resolves its dependencies among the bundle's wheels; a project marked no_deps (--only) goes
            # in after the wheels that were resolved for it.
            project = [i["file"] for i in wheels if i.get("project") and not i.get("no_deps")]
            first = project or [i["file"] for i in wheels if not i.get("no_deps")]
            if first:
                log(f"install: {len(wheels)} wheels with pip --no-index into {py}")
                _pip(py, "install", "--no-index", "--find-links", str(stage / "wheels"), "--no-cache-dir",
                     *(str(stage / "wheels" / f) for f in first))  # fmt: skip
            nodeps = [str(stage / "wheels" / i["file"]) for i in wheels if i.get("no_deps")]
            if nodeps:
                _pip(py, "install", "--no-index", "--no-deps", "--no-cache-dir", *nodeps)
            if wheels:
                manifest["python"] = str(py)
        for item in items:
            if item["kind"] == "model":
                item["installed"] = str(_install_model(bundle, item, into, stage))
                log(f"install: model {item['name']} -> {item['installed']}")
            elif item["kind"] == "data":
                item["installed"] = str(join_parts(bundle, item, into / "data" / item["file"]))
                log(f"install: data {item['file']} -> {item['installed']}")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    (into / "bundle.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="install.py", description="Install an xsbert-scale offline bundle: check every "
                                "part (sha256), reassemble, install the wheels with pip --no-index.")  # fmt: skip
    p.add_argument("--into", type=Path, help="target folder: a virtualenv, models/, data/ (needed but with --check)")
    p.add_argument("--bundle", type=Path, default=Path(__file__).resolve().parent, help="default: this file's folder")
    p.add_argument("--system-site-packages", action="store_true",
                   help="the new virtualenv sees the interpreter's packages (e.g. the machine's torch)")
    p.add_argument("--python", default=None, help="install the wheels into this interpreter's environment instead")
    p.add_argument("--target", type=Path, default=None,
                   help="unpack the wheels into this folder (pip --target --no-deps) instead of a virtualenv; use it "
                        "with PYTHONPATH beside the interpreter's own packages")  # fmt: skip
    p.add_argument("--models-only", action="store_true", help="only reassemble models and datasets (no pip)")
    p.add_argument("--check", action="store_true", help="only check the parts")
    args = p.parse_args(argv)
    try:
        if args.check:
            manifest = read_manifest(args.bundle)
            check_parts(args.bundle, manifest["items"])
            print(f"install: all {sum(len(i['parts']) for i in manifest['items'])} parts are there and intact")
            return 0
        if args.into is None:
            p.error("the following arguments are required: --into")
        install(args.bundle, args.into.resolve(), args.system_site_packages, args.models_only, args.python,
                args.target.resolve() if args.target else None)  # fmt: skip
    except BundleError as exc:
        print(f"install: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a folder that cannot be written
        print(f"install: error: {exc.filename or args.into}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"install: done; models in {args.into / 'models'}, data in {args.into / 'data'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
