"""The rows of each list page of `xsbert serve` as CSV: /pairs.csv, /tokens.csv, /token.csv take the page's own
parameters (filters, search, sort), and give every row that matches, in the page's order, not one page of them.

A cell a spreadsheet would read as a formula (text starting with = + - @, a tab or a carriage return: dataset
sentences and tokens are untrusted) is written with a leading apostrophe, which spreadsheets show as text; numbers
are written as numbers."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb

from .pages import (
    QUARANTINE_FIELDS,
    TOKENS_FILTER,
    TOKENS_RANKED,
    Params,
    TokensQuery,
    _quarantine_where,
    _wait_same_tokens,
    pairs_filter,
)
from .run import LIST_FIELDS, SORTS, TOKEN_SORTS, App, BadRequest, Busy

# What starts a formula in a spreadsheet (OWASP's CSV injection list).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# Rows fetched from DuckDB and written at a time.
BATCH_ROWS = 10_000


def safe_cell(value: Any) -> Any:
    """A value as the CSV writer gets it: text that a spreadsheet would run as a formula gets a leading apostrophe;
    None is an empty cell; numbers stay numbers."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


@dataclass
class Download:
    """One CSV answer: its file name, its columns and the query (with its bound parameters) that gives its rows."""

    filename: str
    columns: tuple[str, ...]
    sql: str
    args: dict[str, Any] = field(default_factory=dict)

    def chunks(self, con: duckdb.DuckDBPyConnection) -> Iterator[str]:
        """The CSV text, header first, BATCH_ROWS rows at a time."""
        used = {k: v for k, v in self.args.items() if f"${k}" in self.sql}
        cursor = con.cursor()
        try:
            result = cursor.execute(self.sql, used) if used else cursor.execute(self.sql)
            buffer = io.StringIO()
            writer = csv.writer(buffer)  # RFC 4180: CRLF rows; a field with a CR or LF is quoted
            writer.writerow(self.columns)
            while True:
                rows = result.fetchmany(BATCH_ROWS)
                writer.writerows([safe_cell(v) for v in row] for row in rows)
                if buffer.tell():
                    yield buffer.getvalue()
                    buffer.seek(0)
                    buffer.truncate()
                if not rows:
                    return
        finally:
            cursor.close()


def csv_name(app: App, table: str) -> str:
    """A download's file name: the list and the run it is of (`pairs-<run id>.csv`), so that two runs' files differ;
    a character of a folder's name that a header's quoted file name cannot hold is `_`."""
    return f"{table}-{re.sub(r'[^A-Za-z0-9._-]', '_', app.run.run_id)}.csv"


def csv_pairs(app: App, p: Params) -> Download:
    """The rows of /pairs with the same parameters: the attributed pairs, or the quarantined rows (reason=...)."""
    reason = p.text("reason").strip()
    args: dict[str, Any] = {}
    if reason:
        where = _quarantine_where(app, p, reason, args)
        sql = f"select {', '.join(QUARANTINE_FIELDS)} from quarantine {where} order by row"
        return Download(csv_name(app, "quarantine"), QUARANTINE_FIELDS, sql, args)
    sort = p.choice("sort", SORTS, "score")
    order = p.choice("order", ("asc", "desc"), "desc")
    _, where, with_ = pairs_filter(app, p, args)
    columns = tuple(c.strip() for c in LIST_FIELDS.split(","))
    return Download(csv_name(app, "pairs"), columns, f"""{with_}select {LIST_FIELDS} from pairs_memory {where}
        order by {SORTS[sort]} {order} nulls last, pair_id""", args)  # fmt: skip


def csv_tokens(app: App, p: Params) -> Download:
    """The rows of /tokens with the same parameters: every token kept, ranked."""
    t = TokensQuery.of(p)
    if _wait_same_tokens(app):
        raise Busy("the same-token cells are being read (once per start of the server): retry in a moment")
    columns = ("rank", "token", "n", "mean", "std")
    return Download(csv_name(app, "tokens"), columns, f"""{TOKENS_RANKED}
        select {', '.join(columns)} from ranked {TOKENS_FILTER}
        order by {TOKEN_SORTS[t.sort]} {t.order} nulls last, token""", t.args())  # fmt: skip


def csv_token(app: App, p: Params) -> Download:
    """The rows of /token with the same parameters: every same-token cell of the token, with its pair."""
    token = p.text("t")
    if not token:
        raise BadRequest("t: which token? (/token.csv?t=TOKEN)")
    order = p.choice("order", ("asc", "desc"), "desc")
    if _wait_same_tokens(app):
        raise Busy("the same-token cells are being read (once per start of the server): retry in a moment")
    columns = ("pair_id", "i", "j", "value", "score", "text_a", "text_b")
    return Download(csv_name(app, "token"), columns, f"""
        select c.pair_id, c.i, c.j, c.value, p.score, p.text_a, p.text_b
        from same_token_cells c join pairs_memory p using (pair_id)
        where c.token = $t
        order by c.value {order}, c.pair_id, c.i, c.j""", {"t": token})  # fmt: skip


DOWNLOADS = {"/pairs.csv": csv_pairs, "/tokens.csv": csv_tokens, "/token.csv": csv_token}
