"""The `xsbert` command ([project.scripts] in pyproject.toml): `xsbert explain` and `xsbert sql`.

It lives in the jobs layer because `xsbert sql` runs jobs.sqlrun over a run directory; `xsbert explain` is
the library's (xsbert_core.cli, also `python -m xsbert_core explain ...`). The arrow points down: jobs
imports xsbert_core, never the reverse (tests/test_layering.py).

    xsbert explain [A B] [...]            one pair at a terminal (xsbert_core.cli)
    xsbert sql --run DIR [QUERY | -f F]   DuckDB over a run directory (jobs/sqlrun/, docs/ANALYSES.md)
    xsbert serve --run DIR [--run2 DIR2]  browse a run in a local web app (jobs/serve.py)
    xsbert show --run DIR --pair ID       one stored pair, as xsbert explain prints it (jobs/serve.py)
"""

from __future__ import annotations

import argparse
import sys

from xsbert_core.cli import add_explain_parser, explain, new_parser, run


def build_parser() -> argparse.ArgumentParser:
    p, sub = new_parser()
    add_explain_parser(sub)
    _add_sql_parser(sub)
    from jobs.serve import add_parsers

    add_parsers(sub)
    return p


def _add_sql_parser(sub: argparse._SubParsersAction) -> None:
    """`xsbert sql`: DuckDB over a run directory (jobs/sqlrun/, docs/ANALYSES.md)."""
    s = sub.add_parser(
        "sql",
        help="run DuckDB SQL (a query or a sql/ analysis) over a run directory",
        description="Run one DuckDB statement over a run: views pairs, cells, word_cells, sentences, quarantine, "
        "parses (those of --run2 suffixed _2), variables run / run2 and --var set. Prints a table, or CSV.",
        extras_hint=_quote_the_query,
    )
    s.add_argument("query", nargs="?", help="one SQL statement, e.g. \"select count(*) from pairs\"")
    s.add_argument("--run", required=True, metavar="DIR",
                   help="the run directory (<out>/<run id>), local or on object storage (s3://bucket/prefix/<run id>)")  # fmt: skip
    s.add_argument("--run2", metavar="DIR2", help="a second run, for two-run analyses (views <table>_2)")
    s.add_argument("--file", "-f", metavar="F", help="a SQL file instead of QUERY: a path, or a name in sql/")
    s.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                   help="set a DuckDB variable (repeatable): --var min_count=10; with --file, one the file "
                        "reads")  # fmt: skip
    s.add_argument("--csv", action="store_true", help="print CSV (all rows) instead of a table")
    s.add_argument("--max-rows", type=int, default=100, help="rows printed as a table (default %(default)s)")


def _quote_the_query(args: argparse.Namespace, extras: list[str]) -> str:
    """`xsbert sql --run R select 1`: the query is one argument; the words after its first were left over (those up
    to an unknown flag: a word after one is taken for its value)."""
    words = []
    for word in extras:
        if word.startswith("-"):
            break
        words.append(word)
    if args.query is None or not words:
        return ""
    return f"; quote the query as one argument: \"{' '.join([args.query, *words])}\""


def sql(args: argparse.Namespace) -> int:
    from jobs.raycluster import filter_stderr
    from jobs.sqlrun import cli as sql_cli  # lazily: DuckDB and polars only for this command

    filter_stderr()  # pyarrow's own S3 retry notices (jobs/raycluster.py)
    return sql_cli(args)


def serve(args: argparse.Namespace) -> int:
    from jobs.raycluster import filter_stderr
    from jobs.serve import serve as serve_run

    filter_stderr()
    return serve_run(args)


def show(args: argparse.Namespace) -> int:
    from jobs.raycluster import filter_stderr
    from jobs.serve import show as show_pair

    filter_stderr()
    return show_pair(args)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), {"explain": explain, "sql": sql, "serve": serve, "show": show}, argv)


if __name__ == "__main__":
    sys.exit(main())
