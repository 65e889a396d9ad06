"""The sql/ folder, read as the duckdb CLI reads it: the analyses (sql/*.sql), the report's own queries
(sql/report/), the macros several analyses share (sql/lib/), the CLI's set-up for S3 (sql/init/).

An analysis that uses a shared macro names its file on a line of its own, a duckdb CLI dot command:

    .read sql/lib/lexical_token_ranks.sql

which the CLI runs from the repository root (`duckdb -f sql/lexical_ranks.sql`, as the docs show it), and `text`
replaces by that file's text for the Python side (jobs.sqlrun, `xsbert sql --file`, jobs.report): one copy of each
macro, the same statements either way."""

from __future__ import annotations

import re
from pathlib import Path

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
