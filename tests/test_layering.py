"""Layering: xsbert_core (the library) never imports jobs (the Ray entrypoints); the `xsbert` command is jobs.cli."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from jobs.study.state import imported_names

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "xsbert_core"


def _is_jobs(name: str | None) -> bool:
    return name is not None and (name == "jobs" or name.startswith("jobs."))


def jobs_imports(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: what' for every import of `jobs` / `jobs.*` in the source, at any depth (lazy imports too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [(node.lineno, f"{filename}:{node.lineno}: {name}") for name in names if _is_jobs(name)]
    return [hit for _, hit in sorted(found)]


def test_the_check_sees_every_form_of_import():
    source = (
        "import jobs\nimport os, jobs.sqlrun as s\nfrom jobs import _sql\nfrom jobs.sqlrun import cli\n"
        "def f():\n    from jobs.parse import cli\n    importlib.import_module('jobs.report')\n    __import__('jobs')\n"
        "import jobsearch\nfrom . import jobs\nfrom .jobs import x\nfrom xsbert_core import cli\n"
    )
    assert [hit.split(": ")[1] for hit in jobs_imports(source)] == [
        "jobs", "jobs.sqlrun", "jobs", "jobs.sqlrun", "jobs.parse", "jobs.report", "jobs",
    ]  # fmt: skip


def test_library_never_imports_jobs():
    files = sorted(LIBRARY.rglob("*.py"))
    assert LIBRARY / "cli.py" in files and len(files) > 10
    hits = [hit for f in files for hit in jobs_imports(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert not hits, "xsbert_core must not import jobs (the jobs layer builds on the library):\n" + "\n".join(hits)


def test_xsbert_command_is_jobs_cli_with_its_subcommands():
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("xsbert") == "jobs.cli:main"  # pyproject.toml [project.scripts], as installed
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: xsbert ") and "{explain,sql,serve,show}" in done.stdout
    for line in ("    explain ", "    sql ", "    serve ", "    show "):
        assert any(row.startswith(line) for row in done.stdout.splitlines()), (line, done.stdout)
    library = subprocess.run([sys.executable, "-m", "xsbert_core", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert library.returncode == 0 and "{explain}" in library.stdout, library.stderr


def _jobs_import_graph() -> dict[str, set[str]]:
    """jobs' modules -> the jobs modules each imports, at any depth (lazy imports too); importing a.b.c imports the
    packages a and a.b as well (their __init__ runs)."""
    files = {}
    for path in sorted((ROOT / "jobs").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps: set[str] = set()
        for target in imported_names(path, mod):
            parts = target.split(".")
            deps |= {q for k in range(1, len(parts) + 1) if (q := ".".join(parts[:k])) in files
                     and q != mod and not mod.startswith(q + ".")}  # fmt: skip
        graph[mod] = deps
    return graph


def test_jobs_modules_import_each_other_without_a_cycle():
    """No module of jobs/ imports, through any chain of imports (those inside functions too), one that imports it
    back: each concern builds on the ones below it (a cycle hidden in a function import breaks when the import
    moves)."""
    graph = _jobs_import_graph()
    assert "jobs.pages" in graph["jobs.analyses.page"] and "jobs.store" in graph["jobs.attribution.run"]
    done: set[str] = set()

    def visit(mod: str, path: list[str]) -> None:
        if mod in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(mod):] + [mod]))
        if mod in done:
            return
        for dep in sorted(graph[mod]):
            visit(dep, path + [mod])
        done.add(mod)

    for mod in sorted(graph):
        visit(mod, [])


def _probe(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_the_read_side_loads_neither_torch_nor_sentence_transformers():
    """xsbert_core's errors come without the engine (its other names load on first use) and its settings without
    torch (xsbert_core.precision names its dtypes), so the store, `xsbert` itself, `xsbert sql`, `xsbert serve`,
    `xsbert show`, jobs.report and jobs.pipeline until it runs a stage start without torch and sentence-transformers
    (seconds per process; a study's training settings are read without them, the orig variant's loss is
    xsbert_core.losses); the job's stage-2 cell tasks (torch's arithmetic) load no model library (the engine's
    results are plain data: xsbert_core.results; the factor actor imports the Explainer when it starts)."""
    probe = ("import sys, jobs.store, jobs.sqlrun, jobs.serve, jobs.cli, jobs.report, jobs.pipeline; "
             "from jobs.browse.heatmap import StoredPair; "
             "print(*(m in sys.modules for m in ('torch', 'sentence_transformers'))); "
             "import jobs.attribution.stage2; "
             "print('sentence_transformers' in sys.modules)")  # fmt: skip
    assert _probe(probe) == ["False", "False", "False"]


def test_the_compute_side_imports_no_duckdb():
    """The GPU machine has no DuckDB (bench/gpu_have.txt): the verbs it runs, and the pipeline's stages, import none,
    so that one module-level import of jobs.sqlrun (it happened in jobs/study/stages.py) fails here in seconds rather
    than in the prepared GPU runs' rehearsals."""
    probe = ("import sys, jobs.pipeline, jobs.study.stages, jobs.attribute, jobs.train, jobs.evaluate, jobs.parse, "
             "jobs.bundle; print('duckdb' in sys.modules)")  # fmt: skip
    assert _probe(probe) == ["False"]


def test_the_jobs_help_and_flag_errors_come_before_the_engine_loads():
    """`python -m jobs.attribute --help` (jobs.train's, jobs.evaluate's), a flag it does not take, and a setting out of
    its bounds answer without torch and sentence-transformers (seconds per process): what loads the engine or a model
    is imported where a job runs; jobs.attribute's `prepare` and `attribute` still come from it."""
    code = ("import contextlib, io, sys, importlib\n"
            "for name in ('attribute', 'train', 'evaluate'):\n"
            "    cli = importlib.import_module(f'jobs.{name}').cli\n"
            "    for argv in (['--help'], ['--no-such-flag']):\n"
            "        out, err = io.StringIO(), io.StringIO()\n"
            "        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
            "            try:\n                cli(argv)\n            except SystemExit as exc:\n"
            "                code = exc.code\n"
            "        print(code, ': error: ' in err.getvalue())\n"
            "from jobs.attribute import cli\n"  # a bad setting: its bound, declared once (jobs/config.py)
            "with contextlib.redirect_stderr(io.StringIO()) as err:\n"
            "    print(cli(['--steps', '0']), err.getvalue().strip())\n"
            "print(*(m in sys.modules for m in ('torch', 'sentence_transformers')))\n"
            "from jobs.attribute import attribute, prepare\n"
            "print(prepare.__module__, attribute.__module__)")  # fmt: skip
    assert _probe(code) == ["0", "False", "2", "True"] * 3 + [
        "2", "jobs.attribute:", "error:", "--steps", "must", "be", ">=", "1,", "got", "0",
        "False", "False", "jobs.attribution.prepare", "jobs.attribution.run"]  # fmt: skip


def test_xsbert_sql_and_show_run_without_torch(tmp_path):
    """The read-side commands as they run, not only as they import: `xsbert sql` and `xsbert show` on a stored run
    leave torch and sentence-transformers unloaded."""
    from test_serve import make_store

    run, data = make_store(tmp_path, "run", n_pairs=2, waves=1)
    pair = data["pairs"][0]["pair_id"]
    for argv in (["sql", "--run", str(run), "select count(*) as pairs from pairs"], ["show", "--run", str(run),
                                                                                      "--pair", pair]):
        code = ("import contextlib, io, sys; from jobs.cli import main\n"
                "with contextlib.redirect_stdout(io.StringIO()) as out:\n    rc = main(sys.argv[1:])\n"
                "print(rc, len(out.getvalue()) > 0, *(m in sys.modules for m in ('torch', 'sentence_transformers')))")
        out = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["0", "True", "False", "False"], (argv, out.stdout, out.stderr[-2000:])


def test_importing_xsbert_core_registers_the_shift_in_either_order_and_without_wrapt():
    """Plain SentenceTransformer(path) of a saved exact model needs the shift's class registered (xsbert_core.shift):
    `import xsbert_core` does it once sentence-transformers is imported, before or after; without wrapt (its
    post-import hook), at once. (The model loaded plainly: tests/test_training.py.)"""
    check = ("; from sentence_transformers.base.model import BaseModel; from xsbert_core.shift import CLASS_REF; "
             "print(CLASS_REF in BaseModel._module_classes)")  # fmt: skip
    for first in ("import xsbert_core, sys; print('sentence_transformers' in sys.modules); "
                  "import sentence_transformers",
                  "import sentence_transformers, xsbert_core; print(False)",
                  "import sys; sys.modules['wrapt'] = None; import xsbert_core; print('sentence_transformers' in "
                  "sys.modules)"):  # fmt: skip
        seen = _probe(first + check)
        assert seen == ["True" if "wrapt" in first else "False", "True"], first


def test_the_lazy_names_are_the_ones_type_checkers_see_and_each_is_where_it_is_said_to_be():
    """xsbert_core's public names are listed three times, as linters and type checkers need them: `_LAZY` (name ->
    module, what is imported on first use), the block for type checkers, and __all__. They agree: the block imports
    `_LAZY`'s names from its modules, __all__ is those and the errors, and each name resolves."""
    import xsbert_core
    from xsbert_core import errors

    tree = ast.parse((LIBRARY / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert seen == dict(xsbert_core._LAZY)
    error_names = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.XsbertError)}
    assert sorted(xsbert_core.__all__) == xsbert_core.__all__ == sorted(error_names | set(xsbert_core._LAZY))
    for name in xsbert_core.__all__:
        assert getattr(xsbert_core, name) is not None, name
