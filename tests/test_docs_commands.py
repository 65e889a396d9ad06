"""Every duckdb CLI command the docs show runs as written, on small real runs.

README.md and docs/*.md (not docs/results/, docs/report-example/) are read at test time: fenced ```bash, ```sh
and ``` blocks (a command that an open quote or a trailing backslash continues onto the next lines is one
command) and inline code spans. A command whose program is `duckdb` or `.venv/bin/duckdb` (both: the CLI of the
PyPI package duckdb-cli beside this Python) runs through bash from the repository root, its `runs/<...>`
placeholders replaced by real run directories (tests/test_sql.py's all-MiniLM-L6-v2 runs, and the same STS-B
pairs in exact mode) and `sql/<analysis>.sql` by every file the command can run. It must exit 0 with no
"Error" on stderr and print something.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from jobtools import run_job
from test_sql import make_real_runs

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DUCKDB_CLI = Path(sys.executable).parent / "duckdb"
PROGRAMS = ("duckdb", ".venv/bin/duckdb")
SHELL_FENCES = ("bash", "sh", "")
# Found today: README.md 1, docs/ANALYSES.md 4, docs/CLUSTER.md 2 (one over three lines, one inline), docs/COMMANDS.md
# 1. Fewer means the scan broke or the docs dropped a command: lower it only with the docs.
MIN_COMMANDS = 8
SQL_FILES = sorted(p.name for p in (ROOT / "sql").glob("*.sql"))
TWO_RUN_FILES = tuple(f for f in SQL_FILES if "getvariable('run2')" in (ROOT / "sql" / f).read_text(encoding="utf-8"))
ANALYSIS = "sql/<analysis>.sql"
# `runs/<name>` -> a real run: <id>, <run id>, <run_id> name the run the file is for (RUN_OF_FILE, else the STS-B
# run, approximate and parsed); the two runs of a comparison are the exact and the approximate STS-B runs.
ANY_RUN = ("id", "run id", "run_id")
# negation_signs.sql's runs at two N: the negation run stands for both (a run given twice counts once per pair).
NAMED_RUNS = {"exact": "exact", "approx": "stsb", "id2": "exact", "N=32": "negation", "N=64": "negation"}
RUN_OF_FILE = {"negation.sql": "negation", "negation_signs.sql": "negation", "adjectives.sql": "adjectives"}

FENCE = re.compile(r"\s*(`{3,}|~{3,})\s*([\w+-]*)")
SPAN = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)")  # inline code, over line breaks but no blank line
PROGRAM = re.compile(r"(\s*(?:[A-Za-z_]\w*=\S*\s+)*)(\S+)")  # leading VAR=value assignments, then the program
PLACEHOLDER = re.compile(r"runs/<([^<>]+)>")
# `s3://<bucket>/runs/<name>`: the same real run, uploaded to the test's S3 endpoint (moto, tests/s3tools.py).
S3_PLACEHOLDER = re.compile(r"s3://<bucket>/runs/<([^<>]+)>")
LEFT_OVER = re.compile(r"<[A-Za-z][\w -]*>")


@dataclass(frozen=True)
class Command:
    """A duckdb CLI command as the docs show it."""

    source: str  # "docs/CLUSTER.md:115": file and first line
    text: str  # as written; a multi-line command keeps its line breaks


# --------------------------------------------------------------------------- the scan
def shell_commands(lines: list[str], first: int) -> list[tuple[int, str]]:
    """(line number, command) in a shell block whose first line is number `first`; an open quote or a trailing
    backslash continues a command, blank lines and comments are none."""
    found: list[tuple[int, str]] = []
    pending, start = "", first
    for n, line in enumerate(lines, first):
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = n
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # no closing quotation: the command goes on
            continue
        found.append((start, pending))
        pending = ""
    if pending:  # still open where the block ends: kept, running it fails
        found.append((start, pending))
    return found


def is_duckdb(text: str) -> bool:
    m = PROGRAM.match(text)
    return m is not None and m.group(2) in PROGRAMS


def doc_commands(name: str, text: str) -> list[Command]:
    """The duckdb CLI commands of a Markdown text: in ```bash / ```sh / ``` blocks and in inline code spans."""
    lines = text.splitlines()
    prose = list(lines)  # the text outside code blocks; their lines blanked, so that line numbers hold
    found: list[tuple[int, str]] = []
    fence, lang, first = "", "", 0
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if not fence:
            if m:
                fence, lang, first = m.group(1), m.group(2).lower(), n + 1
                prose[n - 1] = ""
            continue
        prose[n - 1] = ""
        if m and m.group(1).startswith(fence) and not line.strip().strip(fence[0]):
            if lang in SHELL_FENCES:
                found += shell_commands(lines[first - 1 : n - 1], first)
            fence = ""
    joined = "\n".join(prose)
    for m in SPAN.finditer(joined):
        if len(m.group(1).split()) > 1:  # `.venv/bin/duckdb` alone names the program, it is no command
            found.append((joined.count("\n", 0, m.start()) + 1, m.group(1).replace("\n", " ")))
    return [Command(f"{name}:{n}", t) for n, t in sorted(found, key=lambda f: f[0]) if is_duckdb(t)]


def documented() -> list[Command]:
    return [c for p in DOCS for c in doc_commands(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8"))]


def files_for(command: Command) -> list[str | None]:
    """The sql/ files a command runs: the one it names; for `sql/<analysis>.sql` every file it can run (the
    two-run ones only when it sets run2); [None] for a command that runs no file (-c "select ...")."""
    if ANALYSIS in command.text:
        sets_run2 = "set variable run2" in command.text
        return [f for f in SQL_FILES if sets_run2 or f not in TWO_RUN_FILES]
    return re.findall(r"sql/([\w-]+\.sql)", command.text)[:1] or [None]


COMMANDS = documented()
CASES = [pytest.param(c, f, id=f"{c.source}:{Path(f).stem}" if f else c.source)
         for c in COMMANDS for f in files_for(c)]  # fmt: skip


# --------------------------------------------------------------------------- running one
def runnable(
    command: Command, file: str | None, runs: dict[str, Path], out: Path, s3=None
) -> tuple[str, Path | None]:
    """The command as bash runs it from the repository root: the CLI's full path, real run directories (uploaded to
    `s3` for an s3:// placeholder), the sql/ file; an output redirect at its end writes under `out` instead of into
    the repository. Also that file."""
    text = command.text.replace(ANALYSIS, f"sql/{file}")

    def key_of(m: re.Match) -> str:
        key = RUN_OF_FILE.get(file or "", "stsb") if m.group(1) in ANY_RUN else NAMED_RUNS.get(m.group(1))
        assert key is not None, f"{command.source}: which run is {m.group(0)}? (NAMED_RUNS)"
        return key

    def s3_run(m: re.Match) -> str:
        assert s3 is not None, f"{command.source}: an s3:// command needs the s3 fixture"
        return s3.upload(runs[key_of(m)], prefix="docs/runs")

    text = S3_PLACEHOLDER.sub(s3_run, text)
    text = PLACEHOLDER.sub(lambda m: str(runs[key_of(m)]), text)
    assert not LEFT_OVER.findall(text), f"{command.source}: placeholders left: {LEFT_OVER.findall(text)}"
    text = PROGRAM.sub(lambda m: m.group(1) + shlex.quote(str(DUCKDB_CLI)), text, count=1)
    tokens = list(shlex.shlex(text, posix=True, punctuation_chars=True))
    redirects = [k for k, t in enumerate(tokens) if t in (">", ">>")]
    if not redirects:
        return text, None
    assert redirects == [len(tokens) - 2], f"{command.source}: only one output redirect, at the end, is supported"
    target = out / Path(tokens[-1]).name
    return re.sub(r"(>>?)\s*\S+\s*$", lambda m: f"{m.group(1)} {shlex.quote(str(target))}", text), target


def run_shell(text: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", text], check=False, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip


def check(done: subprocess.CompletedProcess, source: str) -> None:
    assert done.returncode == 0 and "Error" not in done.stderr, (
        f"{source}: exit {done.returncode}\n{done.args[-1]}\n{done.stderr}"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """tests/test_sql.py's real runs (stsb: 8 pairs, approximate, parsed; negation; adjectives; shared with it in
    one session) and `exact`: the same 8 STS-B pairs in exact mode."""
    out = tmp_path_factory.mktemp("docs-commands") / "runs"
    exact = run_job(out, "--dataset", "stsb", "--split", "test", "--limit", "8", "--executor", "local",
                    "--mode", "exact")  # fmt: skip
    return {**make_real_runs(tmp_path_factory), "exact": Path(exact["run_dir"])}


# --------------------------------------------------------------------------- the tests
def test_the_docs_show_the_known_duckdb_commands():
    assert len(COMMANDS) >= MIN_COMMANDS, [c.source for c in COMMANDS]
    assert len(CASES) > len(COMMANDS)  # sql/<analysis>.sql stands for several files
    assert DUCKDB_CLI.is_file(), f"{DUCKDB_CLI}: pip install duckdb-cli"


@pytest.mark.slow
@pytest.mark.parametrize(("command", "file"), CASES)
def test_documented_duckdb_command_runs(command, file, runs, tmp_path, request):
    s3 = request.getfixturevalue("s3") if S3_PLACEHOLDER.search(command.text) else None
    text, output = runnable(command, file, runs, tmp_path, s3)
    done = run_shell(text, s3.subprocess_env() if s3 else None)
    check(done, command.source)
    assert (output.read_text() if output else done.stdout).strip(), f"{command.source}: printed nothing"


# A Markdown text with a command in each place the scan looks, and commands it must pass over.
SAMPLE = r"""Run `duckdb -c 'select 1'` (`duckdb`) or `xsbert sql --run runs/<id>`, and `.venv/bin/duckdb
-f sql/table1.sql`.
```bash
ray rsync-down cluster.yaml /home/ray/runs ./runs
# duckdb -c 'a comment'
duckdb -c "select 1,
                  2"
FOO=1 .venv/bin/duckdb -f sql/x.sql \
    -csv
.venv/bin/python -c "import duckdb"
```
```python
duckdb -c 'select 2'
```
```
duckdb -c 'select 3'
```
```sh
duckdb -c 'unclosed
```
"""


def test_the_scan_finds_commands_in_blocks_and_spans_and_nothing_else():
    found = doc_commands("x.md", SAMPLE)
    assert [(c.source, c.text) for c in found] == [
        ("x.md:1", "duckdb -c 'select 1'"),
        ("x.md:1", ".venv/bin/duckdb -f sql/table1.sql"),
        ("x.md:6", 'duckdb -c "select 1,\n                  2"'),
        ("x.md:8", "FOO=1 .venv/bin/duckdb -f sql/x.sql \\\n    -csv"),
        ("x.md:16", "duckdb -c 'select 3'"),
        ("x.md:19", "duckdb -c 'unclosed"),
    ]
    assert files_for(found[1]) == ["table1.sql"] and files_for(found[0]) == [None]
    assert files_for(Command("y", f"duckdb -cmd \"set variable run = 'runs/<id>'\" -f {ANALYSIS}")) == [
        f for f in SQL_FILES if f not in TWO_RUN_FILES]  # fmt: skip


def test_placeholders_and_redirects(tmp_path):
    runs = {name: tmp_path / name for name in ("stsb", "exact", "negation", "adjectives")}
    shown = (
        f"duckdb -csv -cmd \"set variable run = 'runs/<exact>'\" -cmd \"set variable run2 = 'runs/<approx>'\" "
        f"-cmd \"set variable x = 'runs/<id>'\" -f {ANALYSIS} > out.csv"
    )
    text, output = runnable(Command("z", shown), "negation.sql", runs, tmp_path / "out")
    assert output == tmp_path / "out" / "out.csv"
    assert text == (shown.replace("duckdb", shlex.quote(str(DUCKDB_CLI)), 1)
                    .replace("runs/<exact>", str(runs["exact"])).replace("runs/<approx>", str(runs["stsb"]))
                    .replace("runs/<id>", str(runs["negation"])).replace(ANALYSIS, "sql/negation.sql")
                    .replace("out.csv", shlex.quote(str(output))))  # fmt: skip
    with pytest.raises(AssertionError, match="which run is runs/<other>"):
        runnable(Command("z", "duckdb -c \"from 'runs/<other>/pairs/*.parquet'\""), None, runs, tmp_path)
    with pytest.raises(AssertionError, match="placeholders left"):
        runnable(Command("z", "duckdb -f sql/<file>.sql"), None, runs, tmp_path)
    with pytest.raises(AssertionError, match="only one output redirect"):
        runnable(Command("z", "duckdb -c 'select 1' > a.csv 2> b.txt"), None, runs, tmp_path)


@pytest.mark.slow
def test_a_wrong_variable_name_fails_when_run(runs, tmp_path):
    """What docs/CLUSTER.md once showed: the files read getvariable('run'), which `run_dir` leaves null."""
    right = Command("right", f"duckdb -cmd \"set variable run = 'runs/<run id>'\" -f {ANALYSIS}")
    check(run_shell(runnable(right, "table1.sql", runs, tmp_path)[0]), right.source)
    for wrong in (f"duckdb -cmd \"set variable run_dir = 'runs/<run id>'\" < {ANALYSIS}",
                  f"duckdb -cmd \"set variable run_dir = 'runs/<run id>'\" -f {ANALYSIS}",
                  f"duckdb -cmd \"set variable run = 'runs/<run id>'\" -f {ANALYSIS}"):  # fmt: skip
        file = "agreement.sql" if "run =" in wrong else "table1.sql"  # a two-run file without run2 fails too
        done = run_shell(runnable(Command("wrong", wrong), file, runs, tmp_path)[0])
        with pytest.raises(AssertionError, match="wrong: exit"):
            check(done, "wrong")
