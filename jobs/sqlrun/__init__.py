"""DuckDB over a run directory: the views, the variables, and the sql/ files (docs/ANALYSES.md).

    con = connect("runs/<id>", run2="runs/<id2>", variables={"min_count": 10})
    con = connect("s3://bucket/prefix/<id>")         # a run on object storage (s3://, gs://)
    run_file(con, "sql/lexical_ranks.sql")           # -> polars.DataFrame

The connection has one view per table of the run (pairs, cells, word_cells, sentences, quarantine,
and parses once `python -m jobs.parse` wrote it), those of run2 suffixed `_2`, and the DuckDB
variables `run`, `run2` and `variables` set, so a sql/ file (which reads
`getvariable('run') || '/<table>/*.parquet'`) runs unchanged here and in the duckdb CLI. Here every view and
every such read takes the run's committed parts as listed once at connect (`committed`, `committed_sql`;
docs/STORE.md, "Reading"), never a part of a wave that did not commit.

A run is a local directory (a Path) or an object-store URI (a str: s3://bucket/prefix/<id>, gs://...). The
Python duckdb cannot load httpfs offline, so object storage goes through pyarrow's filesystems (S3 and GCS are
built into pyarrow): the existence checks here use them directly and DuckDB reads through them as an fsspec
filesystem (fsspec's ArrowFSWrapper, registered on the connection). Credentials, region and endpoint come the
standard way (AWS_* variables incl. AWS_ENDPOINT_URL, ~/.aws, instance roles; GOOGLE_APPLICATION_CREDENTIALS);
they are never printed. A missing bucket, an endpoint that cannot be reached or a denied request is one
InputError line. The duckdb CLI reads s3:// through httpfs: jobs/_duckdb_cli.py.

    runs.py        where a run is, what is there, its committed parts
    connection.py  `connect`: the views, the variables, the committed-parts snapshot and `committed_sql`
    files.py       the sql/ files run on a connection (`run_file`, `query`)
    command.py     `xsbert sql`: --var values, the answer as a table or CSV, errors as one line
"""

from __future__ import annotations

from .command import cli, error_line, parse_value, parse_vars, write_csv
from .connection import (
    RUN_LIST_VARIABLES,
    RUN_VARIABLES,
    check_inputs,
    committed_sql,
    connect,
    literal,
    one_line,
    snapshot,
)
from .files import file_sql, query, resolve_file, run_file
from .runs import (
    TABLES,
    Run,
    as_run,
    check_run,
    committed,
    glob_escape,
    glob_unescape,
    has_table,
    is_file,
    join,
    missing_table_message,
    no_manifest,
    read_text,
    run_location,
    run_name,
)

__all__ = [
    "RUN_LIST_VARIABLES", "RUN_VARIABLES", "TABLES", "Run", "as_run", "check_inputs", "check_run", "cli", "committed",
    "committed_sql", "connect", "error_line", "file_sql", "glob_escape", "glob_unescape", "has_table", "is_file", "join",
    "literal", "missing_table_message", "no_manifest", "one_line", "parse_value", "parse_vars", "query", "read_text", "resolve_file",
    "run_file", "run_location", "run_name", "snapshot", "write_csv",
]  # fmt: skip
