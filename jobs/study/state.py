"""Whether a stage's output is up to date: a run's committed parts (run_state), the code and sql/ files a report is
made from (code_state), the sentences still to parse (unparsed); the report root (Reports: a folder, or a prefix on
object storage) and its pipeline.json of each report's fingerprint (State)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..processes import waiting_lock
from ..store import DERIVED_TABLES, TABLES, Location, committed_parts, committed_waves, disk_failure
from ..store.files import is_file, location_fs, read_text, upload

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_FILE = "pipeline.json"
# The report root's lock: pipeline.json is saved under it (State.save), one study at a time.
LOCK_FILE = ".pipeline.lock"


def _umask() -> int:
    """The process's umask (read by setting it, then setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def run_state(run: str) -> dict[str, list[list[Any]]]:
    """The committed parts of every table of a run: (name, bytes, mtime). Parts are written once under new
    names, so a run whose listing is unchanged has unchanged rows."""
    import pyarrow.fs as pafs

    fs, base = location_fs(run)
    infos = {table: {i.base_name: i for i in fs.get_file_info(pafs.FileSelector(f"{base}/{table}", allow_not_found=True))
                     if i.type == pafs.FileType.File}
             for table in TABLES + DERIVED_TABLES}  # fmt: skip
    waves = committed_waves(infos["pairs"])
    state = {}
    for table in TABLES + DERIVED_TABLES:
        parts = committed_parts(table, infos[table], waves)  # what readers read: a wave in progress is not a change
        if parts:
            state[table] = [[name, infos[table][name].size, infos[table][name].mtime_ns] for name in parts]
    return state


def imported_files(module: str) -> list[Path]:
    """The source files of `module` and of every module of jobs/ it imports, at any depth (imports inside functions
    too), with the xsbert_core modules they name (not what those import in turn): found by reading the imports,
    without importing anything."""

    def path_of(name: str) -> Path | None:
        base = REPO_ROOT.joinpath(*name.split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)

    found: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = path_of(name)
        if name in found or path is None:
            continue
        found[name] = path
        if not name.startswith("jobs"):
            continue
        for target in imported_names(path, name):
            parts = target.split(".")
            if parts[0] in ("jobs", "xsbert_core"):
                todo += [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    return sorted(found.values())


def imported_names(path: Path, module: str) -> list[str]:
    """The names every import statement of the source file `path` (module `module`) imports, at any depth of the
    file (imports inside functions too), relative ones resolved: `import a.b` gives a.b; `from m import x` gives m
    and m.x (x may be a module)."""
    import ast

    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(0, node.level - 1)):
                base = base.rsplit(".", 1)[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            names += [target] + [f"{target}.{alias.name}" for alias in node.names]
    return names


def code_state() -> str:
    """Hash of what a report is made from besides the runs: the sql/ files it reads (with sql/report/, sql/lib/),
    the code of jobs.report and of what it imports (imported_files), its templates."""
    from .. import sqlfiles

    files = sqlfiles.sources() + imported_files("jobs.report")
    files += sorted((REPO_ROOT / "jobs" / "templates").glob("*"))
    digest = hashlib.sha256()
    for f in files:
        if f.is_file():
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def unparsed(run: str) -> int:
    """Sentences with words that have no parse rows yet (0: the parse stage has nothing to do)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    fs, base = location_fs(run)
    state = run_state(run)
    if not state.get("sentences"):
        return 0
    sentences = pads.dataset(f"{base}/sentences", filesystem=fs, format="parquet").to_table(
        columns=["sentence_id", "words"]
    )
    with_words = sentences.filter(pc.greater(pc.list_value_length(sentences.column("words")), 0))
    ids = set(with_words.column("sentence_id").to_pylist())
    if not ids or not state.get("parses"):
        return len(ids)
    parsed = pads.dataset(f"{base}/parses", filesystem=fs, format="parquet").to_table(columns=["sentence_id"])
    return len(ids - set(parsed.column("sentence_id").to_pylist()))


class Reports:
    """The report root: a local folder, or a prefix on object storage whose reports are written into a local
    staging folder and uploaded (each report's old objects deleted first), with pipeline.json and index.html."""

    def __init__(self, root: str) -> None:
        import tempfile

        self.root = root
        self.location = Location.parse(root)
        self.remote = self.location.is_remote
        self.local = Path(tempfile.mkdtemp(prefix="xsbert-reports-")) if self.remote else Path(root)

    def where(self, name: str) -> str:
        return f"{self.root}/{name}/index.html"

    def _at(self, relative: str) -> Location:
        return self.location.join(relative) if self.remote else Location.parse(self.local / relative)

    def exists(self, relative: str) -> bool:
        return is_file(self._at(relative))

    def read_text(self, relative: str) -> str | None:
        return read_text(self._at(relative))

    def publish(self, relative: str) -> None:
        """Upload local/<relative> (a file or a report folder) over what the root had there."""
        if self.remote:
            upload(self.local / relative, self._at(relative))


class State:
    """<report root>/pipeline.json: per report, the fingerprint of what it was made from. Studies that share a
    report root save it safely at the same time: under a lock (fcntl on <root>/.pipeline.lock for a local root), each
    save merges the reports it put into what the file holds then, through a temporary file of its own. On object
    storage the merge narrows the window but nothing locks it: give concurrent studies their own report roots."""

    def __init__(self, reports: Reports) -> None:
        self.reports = reports
        self.path = reports.local / STATE_FILE
        self.data: dict[str, Any] = {}
        self.changed: set[str] = set()
        try:
            text = reports.read_text(STATE_FILE)
            self.data = json.loads(text) if text else {}
        except (OSError, json.JSONDecodeError):
            self.data = {}

    def get(self, key: str) -> Any:
        return self.data.get("reports", {}).get(key)

    def put(self, key: str, value: Any) -> None:
        self.data.setdefault("reports", {})[key] = value
        self.changed.add(key)

    def save(self) -> None:
        """Merge the reports put since loading into pipeline.json as it is now (another study may have saved
        since), under the root's lock; write a temporary file of this process's own and rename it into place."""
        try:
            self._save()
        except OSError as exc:  # a full or read-only report disk
            raise disk_failure(exc.filename or self.path, exc) from None

    def _save(self) -> None:
        import tempfile

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with waiting_lock(self.path.parent / LOCK_FILE):
            try:
                text = self.reports.read_text(STATE_FILE)  # on object storage: the root's copy (no lock there)
                current = json.loads(text) if text else {}
            except (OSError, json.JSONDecodeError):
                current = {}
            merged = current.get("reports") if isinstance(current.get("reports"), dict) else {}
            merged.update({k: v for k, v in self.data.get("reports", {}).items() if k in self.changed})
            self.data = {**current, **self.data, "reports": merged}
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            try:
                os.fchmod(fd, 0o666 & ~_umask())  # as any file the report writes (mkstemp's 0600 kept this one private)
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            self.reports.publish(STATE_FILE)
