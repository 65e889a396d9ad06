"""What carries bench/paper_gpu.py's study to a GPU machine and its results back: `prepare` (here: the model as
float16 parts, the QQP subset file and the wheels the stages need there, in batch folders of one transfer each), the
install from those batches (there), the outbox (there: the results' new files after each piece as a tar in parts,
and the next parts into the folder that comes back) and `receive` (here: the pieces joined, checked and extracted,
the weights sent back rebuilt).

Imported by bench/paper_gpu.py, after its sys.path entry for a machine where the package is not installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jobs.bundling import BundleError, check_parts, install, join_parts, split_file

BENCH = Path(__file__).resolve().parent
BASE = "all-mpnet-base-v2"
# Here: where `prepare` writes the batches and `receive` the results, in the checkout and git-ignored (bench/.cache/),
# so that neither travels with a call's working tree.
CACHE = BENCH / ".cache" / "paper-gpu"
TRANSFER, RESULTS = CACHE / "transfer", CACHE / "results"
# There: where each call copies its batch out of the checkout (the next call's checkout replaces this one's; /tmp
# lasts while the machine does), and the work folder (installs, models, results, the outbox).
THERE_TRANSFER, THERE_WORK = "/tmp/pt", "/tmp/paper-gpu"
CARRY_MIB = 64  # what one call carries: the working tree and the paths its carry list names, together
COMMAND_CHARS = 2000  # the longest command line a call takes
# What the stages that run there need beyond torch, transformers, sentence-transformers, pyarrow, pandas, numpy and
# pyyaml: the study config's validation (pydantic) and the trainer's data (datasets), with what only they need. The
# versions are this environment's (where the tests ran them).
DEVICE_WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "datasets", "dill",
                 "multiprocess")  # fmt: skip
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                   "manylinux1_x86_64")  # fmt: skip
PART_MIB = 15  # largest part of the outbox
BATCH_MIB = 50  # largest batch folder of `prepare`
OUT_FILES, OUT_MIB = 8, 60  # what one OUT carries back: files, MiB together (outbox.json included)
OUTBOX = "outbox.json"
PROGRESS = "progress.json"  # the results' record of what is done (bench/paper_gpu.py Runner)
INCOMING = ".incoming"  # a part being copied into OUT, renamed once whole


def say(line: str) -> None:
    print(f"paper_gpu: {line}", flush=True)


def write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_json(path: Path, default: Any = None) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else default


# --------------------------------------------------------------------------- here: what travels there
def download_wheels(dest: Path, names: tuple[str, ...], python: str = "3.12", pins: tuple[str, ...] = ()) -> list[Path]:
    """`pip download --no-deps` of each name at this environment's version (or the one `pins` gives), for CPython
    `python` on x86-64 Linux."""
    chosen = {p.split("==")[0].lower(): p for p in pins}
    pins = [chosen.get(n.lower(), f"{n}=={importlib.metadata.version(n)}") for n in names]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "--dest", str(dest),
           "--python-version", python, "--implementation", "cp"]  # fmt: skip
    for tag in WHEEL_PLATFORMS:
        cmd += ["--platform", tag]
    subprocess.run([*cmd, *pins], check=True)
    return sorted(dest.glob("*.whl"))


def prepare(into: Path, base: str = BASE, wheels: tuple[str, ...] = DEVICE_WHEELS, part_mib: float = 25,
            batch_mib: float = BATCH_MIB, pins: tuple[str, ...] = (),
            qqp: Path | None = None) -> list[Path]:  # fmt: skip
    """The model as float16 parts (jobs.bundle), the QQP subset file `qqp` (the QQP runs' data; None: none goes, and
    those runs are left out there) and the wheels, in batch folders of at most batch_mib each: batch-01 holds the
    bundle's manifest.json and install.py, and the wheels; the parts fill the batches in order."""
    from jobs.bundling.write import bundle

    if into.exists() and any(into.iterdir()):
        raise BundleError(f"{into} exists and is not empty; choose a new --into")
    if part_mib > batch_mib:
        raise BundleError(f"--part-mib {part_mib} is above --batch-mib {batch_mib}: a part would not fit a batch")
    if qqp is None:
        say("no QQP subset file (--qqp / $XSBERT_QQP): the study's QQP runs will be left out there")
    stage = into / ".stage"
    bundle(stage / "bundle", int(part_mib * 2**20), models=(base,), float16=True, wheels=False,
           datasets=(str(qqp),) if qqp else (), log=say)  # fmt: skip
    files = download_wheels(stage / "wheels", wheels, pins=pins) if wheels else []
    first = [stage / "bundle" / "manifest.json", stage / "bundle" / "install.py", *files]
    parts = sorted((stage / "bundle" / "parts").iterdir())
    batches: list[list[tuple[Path, str]]] = [[(f, f.name if f.suffix != ".whl" else f"wheels/{f.name}") for f in first]]
    limit = batch_mib * 2**20
    for part in parts:
        used = sum(f.stat().st_size for f, _ in batches[-1])
        if used + part.stat().st_size > limit:
            batches.append([])
        batches[-1].append((part, f"parts/{part.name}"))
    out = []
    for k, batch in enumerate(batches, 1):
        folder = into / f"batch-{k:02d}"
        for src, rel in batch:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), folder / rel)
        out.append(folder)
        say(f"{folder}: {len(batch)} files, {sum((folder / r).stat().st_size for _, r in batch) / 2**20:.1f} MiB")
    shutil.rmtree(stage)
    return out


def checkout(path: Path) -> Path:
    """The git checkout that holds `path` (carry lists name paths relative to it)."""
    done = subprocess.run(["git", "-C", str(path if path.is_dir() else path.parent), "rev-parse", "--show-toplevel"],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise BundleError(f"{path} is not in a git checkout: a call carries paths of the checkout it runs in")
    return Path(done.stdout.strip()).resolve()


def tree_bytes(root: Path) -> int:
    """The working tree that travels with each call: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout.decode()  # fmt: skip
    return sum((root / f).stat().st_size for f in out.split("\0") if f and (root / f).is_file())


def carried(root: Path, path: Path, what: str) -> str:
    """`path` as a carry list names it: relative to the checkout, and git-ignored (else it travels with every call's
    working tree, this study's and any other's)."""
    path = path.resolve()
    if not path.is_relative_to(root):
        raise BundleError(f"{what} {path} is outside the checkout {root}: a call carries only paths inside it")
    rel = path.relative_to(root).as_posix()
    if subprocess.run(["git", "-C", str(root), "check-ignore", "-q", rel]).returncode != 0:
        raise BundleError(f"{what} {rel} is not git-ignored: it would travel with every call's working tree; keep it "
                          f"under {CACHE.relative_to(BENCH.parent).as_posix()}/")  # fmt: skip
    return rel


def path_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def plan(transfer: Path = TRANSFER, there: str = THERE_TRANSFER, work: str = THERE_WORK, timeout_s: int = 540,
         deadline_s: float = 420, done: Path | None = None, run_args: str = "") -> dict[str, Any]:  # fmt: skip
    """The calls that carry `prepare`'s batches there and run the study, each with its carry list, its size with the
    working tree, its timeout_s and its exact command; into <transfer>/plan.json and on stdout.

    One call per batch folder: each copies its own batch out of the checkout into `there` (the next call's checkout
    replaces this one's; `there` lasts while the machine does, so the calls go back to back), and lists the batches
    there so far (a machine started afresh between two calls fails that listing: start again at call 1). The first
    also sends back the machine's own packages (OUT/freeze.txt, before anything of the bundle is installed) and
    checks the imports and the GPU; the last runs the study from `there`, with --done (an earlier attempt's
    progress.json, carried: a few KiB) where given. Then fetch calls carry nothing."""
    transfer = transfer.resolve()
    batches = sorted(p for p in transfer.glob("batch-*") if p.is_dir())
    if not batches or not (batches[0] / "manifest.json").is_file():
        raise BundleError(f"{transfer}: no batch-01 with the bundle's manifest.json (python bench/paper_gpu.py "
                          f"prepare --into {transfer})")  # fmt: skip
    root = checkout(transfer)
    rels = [carried(root, b, "--transfer's batch") for b in batches]
    done_rel = carried(root, done, "--done") if done is not None else None
    if done is not None and not done.is_file():
        raise BundleError(f"--done {done}: no such file (an earlier attempt's progress.json, as `receive` wrote it)")
    tree, q = tree_bytes(root), shlex.quote
    out: dict[str, Any] = {"transfer": str(transfer), "there": there, "work": work, "tree_mib": tree / 2**20,
                           "calls": []}  # fmt: skip
    for k, (batch, rel) in enumerate(zip(batches, rels), 1):
        first, last = k == 1, k == len(batches)
        steps = [f"mkdir -p {q(there)}", f"cp -a {q(rel)} {q(there)}/",
                 "ls -d " + " ".join(q(f"{there}/{b.name}") for b in batches[:k])]  # fmt: skip
        carry, size = [rel], path_bytes(batch)
        if first:  # the machine's own packages, before anything of the bundle is on a path
            steps.append('python3 -m pip freeze > "$OUT/freeze.txt"')
        if last:
            run = (f"PYTHONUNBUFFERED=1 python3 bench/paper_gpu.py run --transfer {q(there)} --work {q(work)} "
                   f'--out "$OUT" --deadline-s {deadline_s:g}')  # fmt: skip
            if done_rel:
                run += f" --done {q(done_rel)}"
                carry.append(done_rel)
                size += path_bytes(done)
            steps.append(f"{run} {run_args}".rstrip())
        elif first:
            steps.append(f"python3 bench/paper_gpu.py run --check --transfer {q(there)} --work {q(work)}")
        command = " && ".join(steps)
        out["calls"].append({"call": k, "carry": carry, "carry_mib": size / 2**20,
                             "with_tree_mib": (size + tree) / 2**20, "timeout_s": timeout_s if last else 120,
                             "command": command})  # fmt: skip
        if size + tree > CARRY_MIB * 2**20:
            raise BundleError(f"plan: call {k} carries {(size + tree) / 2**20:.1f} MiB with the working tree, over "
                              f"{CARRY_MIB}: prepare again with a smaller --batch-mib")  # fmt: skip
        if len(command) > COMMAND_CHARS:
            raise BundleError(f"plan: call {k}'s command has {len(command)} characters, over {COMMAND_CHARS}")
    fetch = f'python3 bench/paper_gpu.py run --work {q(work)} --out "$OUT" --fetch --received N'
    out["fetch"] = {"carry": [], "timeout_s": 120, "command": fetch}
    write_json(transfer / "plan.json", out)
    say(f"plan: {len(batches)} calls, back to back (the working tree {tree / 2**20:.1f} MiB travels with each)")
    for c in out["calls"]:
        say(f"call {c['call']}: carry {json.dumps(c['carry'])} ({c['carry_mib']:.1f} MiB, {c['with_tree_mib']:.1f} "
            f"with the tree), timeout_s {c['timeout_s']}:\n    {c['command']}")  # fmt: skip
    say(f"then, while receive says parts are left (N: the parts received so far, as it prints), carry [], timeout_s "
        f"120:\n    {out['fetch']['command']}")  # fmt: skip
    return out


# --------------------------------------------------------------------------- there: install from the batches
def gather(transfer: Path, work: Path) -> tuple[Path, list[Path]]:
    """The bundle as install.py reads it (work/bundle: manifest.json, parts/ linking into the batches), and the
    wheels."""
    batches = sorted(p for p in transfer.glob("batch-*") if p.is_dir())
    manifests = [b / "manifest.json" for b in batches if (b / "manifest.json").is_file()]
    if not manifests:
        raise BundleError(f"no batch folder under {transfer} holds the bundle's manifest.json (batch-01)")
    folder = work / "bundle"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "parts").mkdir(parents=True)
    shutil.copyfile(manifests[0], folder / "manifest.json")
    for b in batches:
        for part in sorted((b / "parts").glob("*")) if (b / "parts").is_dir() else ():
            (folder / "parts" / part.name).symlink_to(part.resolve())
    wheels = sorted(w for b in batches for w in (b / "wheels").glob("*.whl")) if batches else []
    return folder, wheels


def install_wheels(wheels: list[Path], site: Path) -> None:
    """pip install --no-index --no-deps --target site (once), and site on sys.path (the spawned trainings inherit
    it) and PYTHONPATH."""
    marker = site / ".installed"
    if wheels and not marker.is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(site), *map(str, wheels)], check=True)  # fmt: skip
        marker.write_text("\n".join(w.name for w in wheels) + "\n")
    if site.is_dir():
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def install_base(transfer: Path, work: Path, wheels: bool = True) -> Path:
    """The wheels (unless not `wheels`) and the float16 model from the batches; the model folder (float32 weights,
    rebuilt and checked)."""
    bundle, files = gather(transfer, work)
    if wheels:
        install_wheels(files, work / "site")
    manifest = json.loads((bundle / "manifest.json").read_text())
    if not (work / "xs" / "bundle.json").is_file():
        parts = [p["file"] for i in manifest["items"] for p in i["parts"]]
        missing = [f for f in parts if not (bundle / f).exists()]
        if missing:
            found = ", ".join(sorted(p.name for p in transfer.glob("batch-*") if p.is_dir()))
            raise BundleError(f"{len(missing)} of the bundle's {len(parts)} parts are not under {transfer} (batch "
                              f"folders there: {found}): every batch must be there before the run; each call "
                              "copies its own batch out of the checkout into it (python bench/paper_gpu.py plan)")
    models = [i for i in manifest["items"] if i["kind"] == "model"]
    if len(models) != 1:
        raise BundleError(f"the bundle holds {len(models)} models; this study starts from one")
    target = work / "xs" / "models" / models[0]["name"]
    if not (work / "xs" / "bundle.json").is_file():
        install(bundle, work / "xs", models_only=True, log=say)  # every part checked (sha256) first
    return target


def qqp_item(items: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The QQP subset file among a bundle's items (`prepare` carries no other data), or None."""
    return next((i for i in items if i["kind"] == "data"), None)


def carried_qqp(work: Path) -> Path | None:
    """The QQP subset file `prepare` carried, as install_base installed it (None: it carried none)."""
    item = qqp_item(read_json(work / "xs" / "bundle.json", {"items": []})["items"])
    return Path(item["installed"]) if item else None


# --------------------------------------------------------------------------- there: the outbox
def outbox_id() -> str:
    """A new outbox's name: when it began (UTC, to the microsecond) and 4 random hex digits. Its pieces' files begin with it, so that the
    attempts received into one results folder (each a bare machine, its outbox numbered from 1) never meet."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S%fZ}-{os.urandom(2).hex()}"


class Outbox:
    """The results folder's new files after each piece, as a tar in parts; OUT gets outbox.json and the next parts."""

    def __init__(self, results: Path, folder: Path, part_mib: float) -> None:
        self.results, self.folder, self.part_size = results, folder, int(part_mib * 2**20)
        folder.mkdir(parents=True, exist_ok=True)
        self.state = read_json(folder / OUTBOX) or {"id": outbox_id(), "pieces": []}
        self.packed = read_json(folder / "packed.json", {})

    def parts(self) -> list[dict[str, Any]]:
        return [p for piece in self.state["pieces"] for p in piece["parts"]]

    def pack(self, piece: str, progress: dict[str, Any]) -> None:
        """A tar of the results' files that are new or changed since the last pack (none: only progress is kept)."""
        changed = []
        for f in sorted(p for p in self.results.rglob("*") if p.is_file() and not p.name.endswith(".tmp")):
            rel, st = f.relative_to(self.results).as_posix(), f.stat()
            if self.packed.get(rel) != [st.st_size, st.st_mtime_ns] and not rel.endswith(".lock"):
                changed.append((f, rel, [st.st_size, st.st_mtime_ns]))
        if changed:
            seq = len(self.state["pieces"]) + 1
            name = f"{self.state['id']}-{seq:03d}-{piece}.tar"
            tar_path = self.folder / name
            with tarfile.open(tar_path, "w") as tar:
                for f, rel, _ in changed:
                    tar.add(f, arcname=rel)
            entry = split_file(tar_path, self.folder / "parts", self.part_size, root=self.folder)
            tar_path.unlink()
            self.state["pieces"].append({"seq": seq, "piece": piece, "files": len(changed), **entry})
            self.packed.update({rel: key for _, rel, key in changed})
            write_json(self.folder / "packed.json", self.packed)
        self.note(progress, None)

    def note(self, progress: dict[str, Any], out: Path | None) -> None:
        """The progress alone, into outbox.json here and in OUT (the parts there stay as they are)."""
        self.state["progress"] = progress
        write_json(self.folder / OUTBOX, self.state)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.folder / OUTBOX, out / f"{OUTBOX}.tmp")
            (out / f"{OUTBOX}.tmp").replace(out / OUTBOX)

    def fill(self, out: Path | None, received: int, max_files: int = OUT_FILES, max_mib: float = OUT_MIB) -> None:
        """outbox.json and the parts after the first `received`, as many as the limits allow, into OUT; a kill at any
        point leaves an OUT that `receive` reads: the parts the limits now leave out go first, each new part arrives
        under a temporary name (INCOMING: no `.tar.`, so `receive` passes it by) and is renamed, and outbox.json is
        replaced last, never removed. OUT holds no more than the limits at any point."""
        if out is None:
            return
        out.mkdir(parents=True, exist_ok=True)
        budget, files = max_mib * 2**20 - (self.folder / OUTBOX).stat().st_size, 1
        sent = []
        for part in self.parts()[received:]:
            if files >= max_files or part["size"] > budget:
                break
            budget -= part["size"]
            files += 1
            sent.append(part)
        names = {Path(p["file"]).name for p in sent}
        leftovers = (INCOMING, f"{OUTBOX}.tmp")  # a kill's
        for old in out.iterdir():  # and what an earlier fill sent that the limits now leave out
            if old.is_file() and (old.name in leftovers or ".tar." in old.name and old.name not in names):
                old.unlink()
        for part in sent:
            dest = out / Path(part["file"]).name
            if dest.is_file() and dest.stat().st_size == part["size"]:
                continue  # an earlier fill of this call sent it (renamed once whole)
            shutil.copyfile(self.folder / part["file"], out / INCOMING)
            (out / INCOMING).replace(dest)
        shutil.copyfile(self.folder / OUTBOX, out / f"{OUTBOX}.tmp")
        (out / f"{OUTBOX}.tmp").replace(out / OUTBOX)
        left = len(self.parts()) - received - len(sent)
        say(f"OUT: {len(sent)} part(s) after the first {received}" + (f"; {left} more wait for --received "
                                                                      f"{received + len(sent)}" if left else ""))


def gpu_train():
    """bench/gpu_train.py (trained weights as float16 differences to their base, in parts)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_train", BENCH / "gpu_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



# --------------------------------------------------------------------------- here: receive
def rebuild_weights(into: Path, transfer: Path) -> list[Path]:
    """The trained models that came back as float16 differences, rebuilt into <into>/models/ against the base the
    machine had (the same float16 parts, reassembled here: the same bytes, checked by sha256)."""
    packs = sorted((into / "weights").glob("*.meta.tgz")) if (into / "weights").is_dir() else []
    todo = [p.name.removesuffix(".meta.tgz") for p in packs if not (into / "models" / p.name.removesuffix(".meta.tgz")
                                                                      / "modules.json").is_file()]  # fmt: skip
    if not todo:
        return []
    base = install_base(transfer, transfer / ".base", wheels=False)  # beside the batches, not in the results
    module = gpu_train()
    for name in todo:
        shutil.rmtree(into / "models" / name, ignore_errors=True)
        module.unpack(base, into / "weights", into / "models", name)
        say(f"weights: {into / 'models' / name} rebuilt (float16 differences to {base.name})")
    return [into / "models" / n for n in todo]


def merged_progress(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """progress.json as a piece brought it, with the runs, models and pieces an earlier attempt received into the
    same folder had and this one lacks (this attempt's record wins where both have one). Within one attempt each
    piece's progress.json holds all of the one before it; the next attempt's begins empty (a bare machine), and
    would otherwise leave `report` and the next --done without the earlier attempt's runs and Table 1."""
    merged = dict(after)
    for key in ("pieces", "models", "runs"):
        merged[key] = {**before.get(key, {}), **after.get(key, {})}
    return merged


def receive(parts_dirs: list[Path], into: Path, transfer: Path | None = None) -> dict[str, Any]:
    """Join and extract every piece whose parts are all in `parts_dirs`, in order, once: the pieces the newest
    outbox.json of each attempt (its outbox's id) among them lists, the attempts in the order they began, so that
    one results folder takes every attempt's. Returns {"received": the latest attempt's parts in order from the
    first, "total": its parts, "pieces": the extracted pieces' files, ...}."""
    boxes: dict[str, dict[str, Any]] = {}
    for d in parts_dirs:
        box = read_json(d / OUTBOX)
        if box is not None and len(box["pieces"]) >= len(boxes.get(box.get("id", ""), {"pieces": ()})["pieces"]):
            boxes[box.get("id", "")] = box
    if not boxes:
        raise BundleError(f"no {OUTBOX} in {', '.join(map(str, parts_dirs))}")
    into.mkdir(parents=True, exist_ok=True)
    stage = into / ".outbox"
    (stage / "parts").mkdir(parents=True, exist_ok=True)
    for d in parts_dirs:
        for f in d.glob("*.tar.*"):
            if not (stage / "parts" / f.name).is_file():
                shutil.copyfile(f, stage / "parts" / f.name)
    done = read_json(into / ".received.json", [])
    for key in sorted(boxes):  # an id begins with the time its attempt began
        box, received = boxes[key], 0
        for piece in box["pieces"]:
            if not all((stage / p["file"]).is_file() for p in piece["parts"]):
                break
            received += len(piece["parts"])
            if piece["file"] in done:
                continue
            check_parts(stage, [piece])
            tar_path = join_parts(stage, piece, stage / piece["file"])
            before = read_json(into / PROGRESS, {})
            with tarfile.open(tar_path) as tar:
                tar.extractall(into, filter="data")
                if PROGRESS in tar.getnames():
                    write_json(into / PROGRESS, merged_progress(before, read_json(into / PROGRESS)))
            tar_path.unlink()
            done.append(piece["file"])
            write_json(into / ".received.json", done)
        total = sum(len(p["parts"]) for p in box["pieces"])
        if received == total:
            rest = ""
        elif key == max(boxes):
            rest = (f"; next, the fetch call: python3 bench/paper_gpu.py run --work {THERE_WORK} --out \"$OUT\" "
                    f"--fetch --received {received}")  # fmt: skip
        else:
            rest = "; the rest stayed on that attempt's machine"
        extracted = sum(p["file"] in done for p in box["pieces"])
        say(f"{into}: {key or OUTBOX}: {extracted} of {len(box['pieces'])} pieces, parts 1-{received} of {total}{rest}")
    progress = box.get("progress") or {}  # the latest attempt's
    if "train" not in progress.get("pieces", {}):  # the call ended before its trainings did: how far they came
        import dataclasses

        from xsbert_core.training import TrainProgress

        for names, p in progress.get("training", {}).items():
            fields = {f.name: p[f.name] for f in dataclasses.fields(TrainProgress)}  # without what the call added
            say(f"train {names} (unfinished when the call's OUT was last written): {TrainProgress(**fields)}")
        if progress.get("training_stopped"):
            say(f"train: {progress['training_stopped']}")
    rebuilt = rebuild_weights(into, transfer) if transfer else []
    return {"received": received, "total": total, "pieces": done, "progress": box.get("progress"), "models": rebuilt}
