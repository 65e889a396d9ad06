"""The sql/ folder, read as the duckdb CLI reads it: the analyses (sql/*.sql), the report's own queries
(sql/report/), the macros several analyses share (sql/lib/), the CLI's set-up for S3 (sql/init/).

An analysis that uses a shared macro names its file on a line of its own, a duckdb CLI dot command:

    .read sql/lib/lexical_token_ranks.sql

which the CLI runs from the repository root (`duckdb -f sql/lexical_ranks.sql`, as the docs show it), and `text`
replaces by that file's text for the Python side (jobs.sqlrun, `xsbert sql --file`, jobs.report): one copy of each
macro, the same statements either way."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from xsbert_core.errors import InputError

SQL_DIR = Path(__file__).resolve().parents[1] / "sql"
LIB_DIR = SQL_DIR / "lib"
REPORT_DIR = SQL_DIR / "report"
INIT_DIR = SQL_DIR / "init"
# `.read <path>` on a line of its own (the duckdb CLI's dot command; the path from the repository root)
_READ_RE = re.compile(r"^\.read[ \t]+(\S+)[ \t]*$", re.MULTILINE)


def text(path: str | Path, _seen: tuple[Path, ...] = ()) -> str:
    """The SQL of the file at `path` with each `.read` line replaced by the text of the file it names (a path from
    the repository root, as the duckdb CLI run there reads it), recursively."""
    path = Path(path).resolve()
    if path in _seen:
        raise ValueError(f"{path}: reads itself (.read {' -> '.join(p.name for p in _seen)})")
    body = path.read_text(encoding="utf-8")

    def included(m: re.Match) -> str:
        return text(SQL_DIR.parent / m.group(1), (*_seen, path)).rstrip() + "\n"

    return _READ_RE.sub(included, body)


def sources() -> list[Path]:
    """Every sql/ file a report runs or reads: the analyses, sql/report/, sql/lib/."""
    return sorted(SQL_DIR.glob("*.sql")) + sorted(REPORT_DIR.glob("*.sql")) + sorted(LIB_DIR.glob("*.sql"))


# `coalesce(getvariable('<name>'), <literal>)`: a variable's default where a file reads it
_DEFAULT_RE = r"coalesce\(\s*getvariable\('{name}'\)\s*,\s*('(?:[^']|'')*'|true|false|-?\d+(?:\.\d+)?)\s*\)"


def default(file: str, name: str) -> bool | int | float | str:
    """The default of variable `name` in sql/`file` (a name in sql/, or a path; its `.read` files included): the
    literal of its `coalesce(getvariable('name'), <literal>)`, the one place it is declared; the Python side reads it
    here. A file that never reads the variable this way, or gives it two defaults, is an error."""
    path = SQL_DIR / file
    found = set(re.findall(_DEFAULT_RE.format(name=re.escape(name)), text(path), re.IGNORECASE))
    if len(found) != 1:
        where = path.relative_to(SQL_DIR.parent) if path.is_relative_to(SQL_DIR.parent) else path
        raise ValueError(f"{where}: {len(found)} defaults of variable {name} ({', '.join(sorted(found))})")
    return literal_value(found.pop())


def defaults_in(sql: str) -> dict[str, set[str]]:
    """Every variable an SQL text gives a default (`coalesce(getvariable('name'), <literal>)`), with its literals."""
    found: dict[str, set[str]] = {}
    for name, literal in re.findall(_DEFAULT_RE.format(name=r"(\w+)"), sql, re.IGNORECASE):
        found.setdefault(name, set()).add(literal)
    return found


def literal_value(literal: str) -> bool | int | float | str:
    """An SQL literal of a default (true/false, 'text' with '' for a quote, a number) as the Python value."""
    if literal.lower() in ("true", "false"):
        return literal.lower() == "true"
    if literal.startswith("'"):
        return literal[1:-1].replace("''", "'")
    return float(literal) if "." in literal else int(literal)


# --------------------------------------------------------------------------- the variables the files read
def parse_value(text: str) -> bool | int | float | str | None:
    """A --var value: int, float, true/false, null, else a string ('quoted' for a string that looks like a number)."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] == "'":
        return t[1:-1]
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if t.lower() == "null":
        return None
    for kind in (int, float):
        try:
            return kind(t)
        except ValueError:
            pass
    return text


_GETVARIABLE_RE = re.compile(r"getvariable\(\s*'(\w+)'\s*\)", re.IGNORECASE)
# `set variable NAME = ...` at the start of a statement (not in a `--` comment): a file's own variable
_SET_VARIABLE_RE = re.compile(r"^[ \t]*set[ \t]+variable[ \t]+(\w+)", re.IGNORECASE | re.MULTILINE)


def variables_read(sql: str) -> set[str]:
    """The variables an SQL text reads (getvariable('NAME')) that a caller may give: not the run's own (run, run2:
    --run, --run2), nor those the text sets itself (`set variable agreement_stored_ranks = ...`)."""
    return set(_GETVARIABLE_RE.findall(sql)) - set(_SET_VARIABLE_RE.findall(sql)) - {"run", "run2"}


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "true or false"
    return "a number" if isinstance(value, (int, float)) else "a text"


def check_kinds(sql: str, variables: dict[str, object], key: Callable[[str], str] | None = None) -> None:
    """An InputError for a variable whose value is not of the kind of its default in `sql` (a number, true/false or a
    text: `coalesce(getvariable('min_count'), 30)` takes a number), which DuckDB would meet mid-query or compare with
    a value of another kind; null (the default) is every kind's. The message begins with `--var NAME=VALUE`, or with
    `key(NAME)` where given (a study's `report.vars.NAME`)."""
    for name, literals in sorted(defaults_in(sql).items()):
        if name not in variables or variables[name] is None:
            continue
        wanted = {_kind(literal_value(lit)) for lit in literals}
        if _kind(variables[name]) not in wanted:
            given = variables[name]
            shown = str(given).lower() if isinstance(given, bool) else str(given)
            said = f"its default{'s' if len(literals) > 1 else ''}: {', '.join(sorted(literals))}"
            hint = "; quote a text that looks like a number: '5'" if wanted == {"a text"} else ""
            head = f"--var {name}={shown}:" if key is None else f"{key(name)}: {shown} is {_kind(given)}, but"
            raise InputError(f"{head} {name} takes {' or '.join(sorted(wanted))} ({said}{hint})")


def analysis_texts() -> list[str]:
    """The SQL of every analysis (sql/*.sql, its `.read` files included), as a report runs them."""
    return [text(p) for p in sorted(SQL_DIR.glob("*.sql"))]


def check_analysis_vars(variables: dict[str, object], key: Callable[[str], str] | None = None) -> None:
    """The report's check of its variables, before anything is read: each one read by an analysis of sql/ (a
    misspelt one would leave every analysis at its default, silently) and of its default's kind (check_kinds).
    `key(NAME)` is how a message names a variable (a study's `report.vars.NAME`); without it, `--var NAME`."""
    texts = analysis_texts()
    reads = set().union(*(variables_read(t) for t in texts))
    unknown = sorted(set(variables) - reads)
    if unknown:
        named = ", ".join(key(name) for name in unknown) if key else f"--var {', '.join(unknown)}"
        raise InputError(f"{named}: no analysis of sql/ reads such a variable (they read: {', '.join(sorted(reads))})")
    check_kinds("\n".join(texts), variables, key)
