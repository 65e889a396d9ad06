"""The pages of `xsbert serve`: /pairs, /pair, /tokens, /token (their parameters, queries and template context)."""

from __future__ import annotations

import math
import shlex
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .. import sqlfiles
from ..pages import plural
from .heatmap import MAX_CELL_PX, MIN_ASKED_PX, Heatmap, load_pair, top_cells, views
from .run import (
    COLUMN_NAMES,
    COLUMNS,
    LIST_FIELDS,
    MAX_INTEGER,
    MAX_PAGE_SIZE,
    PAIR_FIELDS,
    SEARCH_SEPARATOR,
    SORTS,
    TOKEN_SORTS,
    App,
    BadRequest,
    Busy,
    NotFound,
    Page,
)


class Params:
    """A request's query string, read into typed values (BadRequest, 400, when a value is not of its type)."""

    def __init__(self, query: str) -> None:
        self.raw = {k: v[-1] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}

    def text(self, name: str, default: str = "") -> str:
        value = self.raw.get(name, default)
        if len(value) > 1000:
            raise BadRequest(f"{name}: longer than 1,000 characters")
        return value

    def number(self, name: str) -> float | None:
        value = self.raw.get(name, "").strip()
        if not value:
            return None
        try:
            x = float(value)
        except ValueError:
            raise BadRequest(f"{name}: not a number: {value!r}") from None
        if not math.isfinite(x):
            raise BadRequest(f"{name}: not a finite number: {value!r}")
        return x

    def integer(self, name: str, default: int, low: int, high: int = MAX_INTEGER) -> int:
        value = self.raw.get(name, "").strip()
        if not value:
            return default
        if len(value) > 20:
            raise BadRequest(f"{name}: {value[:20]!r}... is outside {low}..{high:,}")
        try:
            x = int(value)
        except ValueError:
            raise BadRequest(f"{name}: not a whole number: {value!r}") from None
        if x < low or x > high:
            raise BadRequest(f"{name}: {x} is outside {low}..{high:,}")
        return x

    def choice(self, name: str, options: Any, default: str) -> str:
        value = self.raw.get(name, "") or default
        if value not in options:
            raise BadRequest(f"{name}: {value!r} is not one of {', '.join(options)}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw.get(name, "").strip().lower()
        if not value:
            return default
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise BadRequest(f"{name}: {value!r} is not 1 or 0")

    def link(self, **changes: Any) -> str:
        """This query string with some parameters changed (None drops one)."""
        merged = {**self.raw, **{k: v for k, v in changes.items()}}
        return urllib.parse.urlencode({k: v for k, v in merged.items() if v not in (None, "")})


def check_run(app: App, p: Params) -> None:
    """A link from a report names its run (`run=<run id>`, jobs.analyses.page.serve_link): one for a run this server
    does not serve is a 404 that says which run it is for, never that run's page answered with this server's pairs."""
    wanted = p.text("run").strip()
    served = [r.run_id for r in app.runs()]
    if wanted and wanted not in served:
        raise NotFound(f"this link is for run {wanted}, and this server serves run {' and '.join(served)}: start "
                       f"xsbert serve --run <the folder of run {wanted}> for its pages")


def _where_pairs(p: Params, args: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The WHERE terms of the pairs list and the CTEs they need; `args` gets the bound values."""
    terms: list[str] = []
    ctes: list[str] = []
    q = p.text("q").strip().lower()
    if q:
        args["q"] = q.replace(SEARCH_SEPARATOR, "")
        terms.append("(contains(search_text, $q) or contains(lower(pair_id), $q))")
    token = p.text("token").strip().lower()
    if token:  # sentence_tokens holds the tokens lowercased: a search for "Not" finds "not" and "Not"
        args["token_forms"] = [token, f"ġ{token}", f"▁{token}"] if not token.startswith(("ġ", "▁", "##")) else [token]
        ctes.append("with_token as (select sentence_id from sentence_tokens where token in (select unnest($token_forms)))")
        terms.append("(sentence_id_a in (select sentence_id from with_token) or "
                     "sentence_id_b in (select sentence_id from with_token))")  # fmt: skip
    for name, expr in COLUMNS.items():
        low, high = p.number(f"min_{name}"), p.number(f"max_{name}")
        if low is not None and high is not None and low > high:
            raise BadRequest(f"min_{name} {low:g} is above max_{name} {high:g}: no pair can match")
        for bound, op, x in (("min", ">=", low), ("max", "<=", high)):
            if x is not None:
                args[f"{bound}_{name}"] = x
                terms.append(f"{expr} {op} ${bound}_{name}")
    return terms, ctes


def _quarantine_where(app: App, p: Params, reason: str, args: dict[str, Any]) -> str:
    """The WHERE clause of the quarantined rows of `reason` ('any': every reason) and the text search; `args` gets
    the bound values."""
    if reason != "any" and reason not in {r for r, _ in app.reasons}:
        raise BadRequest(f"reason: {reason!r} is not a quarantine reason of this run")
    terms = [] if reason == "any" else ["reason = $reason"]
    args["reason"] = reason
    q = p.text("q").strip().lower()
    if q:
        args["q"] = q
        terms.append("(contains(lower(text_a), $q) or contains(lower(text_b), $q) or contains(lower(pair_id), $q))")
    return f"where {' and '.join(terms)}" if terms else ""


QUARANTINE_FIELDS = ("row", "pair_id", "reason", "detail", "text_a", "text_b", "label")


def pairs_filter(app: App, p: Params, args: dict[str, Any]) -> tuple[list[str], str, str]:
    """The pairs list's filters: (terms, `where ...`, `with ...` of the CTEs they need); Busy while the token index
    that a token filter reads is built."""
    terms, ctes = _where_pairs(p, args)
    where = f"where {' and '.join(terms)}" if terms else ""
    with_ = f"with {', '.join(ctes)}\n" if ctes else ""
    if "with_token" in with_ and _wait_same_tokens(app):
        raise Busy("the token index is being built (once per start of the server): reload in a moment")
    return terms, where, with_


def page_pairs(app: App, page: Page, p: Params) -> dict[str, Any]:
    size = p.integer("size", app.page_size, 1, MAX_PAGE_SIZE)
    number = p.integer("page", 1, 1)
    reason = p.text("reason").strip()
    sort = p.choice("sort", SORTS, "score")
    order = p.choice("order", ("asc", "desc"), "desc")
    args: dict[str, Any] = {"limit": size, "offset": (number - 1) * size}
    if reason:
        where = _quarantine_where(app, p, reason, args)
        total = page.run("how many rows match", f"select count(*) from quarantine {where}", args)[0][0]
        rows = page.run("the page of quarantined rows", f"""
            select {", ".join(QUARANTINE_FIELDS)}
            from quarantine {where}
            order by row
            limit $limit offset $offset""", args)  # fmt: skip
        items = [dict(zip(QUARANTINE_FIELDS, r)) for r in rows]
        kind = "quarantine"
    else:
        terms, where, with_ = pairs_filter(app, p, args)
        view_with = with_.replace("select sentence_id from sentence_tokens where token in (select unnest($token_forms))",
                                  "select sentence_id from sentences where list_has_any([lower(t) for t in tokens], "
                                  "$token_forms)")  # fmt: skip
        view_where = where.replace("contains(search_text, $q)", "contains(lower(text_a), $q) or contains(lower(text_b), $q)")
        note = "over pairs_memory, read at start: " + " ".join(App.PAIRS_MEMORY_SQL.split())
        total = (page.run("how many pairs match", f"{with_}select count(*) from pairs_memory {where}", args,
                          view_sql=f"{view_with}select count(*) from pairs {view_where}", note=note)[0][0]
                 if terms else app.run.counts["pairs"])  # fmt: skip
        # the page's rows by their sort keys alone, then their columns: a deep page sorts two columns, not the texts
        head = f"{with_.rstrip()}, " if with_ else "with "
        rows = page.run("the page of pairs", f"""
            {head}page as (
                select rowid as k from pairs_memory {where}
                order by {SORTS[sort]} {order} nulls last, pair_id
                limit $limit offset $offset
            )
            select {LIST_FIELDS} from pairs_memory where rowid in (select k from page)
            order by {SORTS[sort]} {order} nulls last, pair_id""", args,
            view_sql=f"""
            {view_with}select {LIST_FIELDS}
            from pairs {view_where}
            order by {SORTS[sort]} {order} nulls last, pair_id
            limit $limit offset $offset""", note=note)  # fmt: skip
        items = [dict(zip([c.strip() for c in LIST_FIELDS.split(",")], r)) for r in rows]
        kind = "pairs"
    pages = max(1, math.ceil(total / size))
    if number > pages and total:
        raise NotFound(f"page {number}: there {'is' if pages == 1 else 'are'} {plural(pages, 'page')} of {size}")
    return {"kind": kind, "items": items, "total": total, "number": number, "pages": pages, "size": size,
            "first": (number - 1) * size + 1 if items else 0, "last": (number - 1) * size + len(items),
            "sort": sort, "order": order, "reason": reason, "columns": COLUMNS, "column_names": COLUMN_NAMES,
            "sorts": SORTS}  # fmt: skip


def page_pair(app: App, page: Page, p: Params) -> dict[str, Any]:
    pair_id = p.text("id")
    if not pair_id:
        raise BadRequest("id: which pair? (/pair?id=PAIR_ID)")
    level = p.choice("level", ("token", "word"), "token")
    specials = p.flag("specials", False)
    asked = p.integer("cell", 0, 0, MAX_CELL_PX) or None
    first = load_pair(page, app.run, pair_id)
    second = load_pair(page, app.run2, pair_id) if app.run2 is not None else None
    if first is None and second is None:
        quarantined = page.run("is it quarantined?", "select reason, detail from quarantine where pair_id = $id",
                               {"id": pair_id})  # fmt: skip
        why = f" (quarantined: {quarantined[0][0]}: {quarantined[0][1]})" if quarantined else ""
        raise NotFound(f"no pair with pair_id {pair_id!r} in the run{' or run2' if app.run2 else ''}{why}")
    sides = []
    for pair in (first, second):
        if pair is None:
            sides.append(None)
            continue
        values, rows, cols = views(pair, level, specials)
        sides.append({"pair": pair, "run": pair.run, "heatmap": Heatmap(pair.run.flag[2:], rows, cols, values,
                                                                         asked=asked),
                      "top": top_cells(values, rows, cols)})  # fmt: skip
    difference, why_not = None, None
    if first is not None and second is not None:
        (v1, r1, c1), (v2, r2, c2) = views(first, level, specials), views(second, level, specials)
        if (r1, c1) == (r2, c2):
            diff = v2 - v1
            difference = {"heatmap": Heatmap("run2 − run", r1, c1, diff, "difference", asked),
                          "top": top_cells(diff, r1, c1)}
        else:
            why_not = ("the two runs split the texts into different tokens (different tokenizers): their cells do not "
                       "correspond, so there is no difference matrix")  # fmt: skip
    elif app.run2 is not None:
        why_not = f"the pair is only in {'run' if second is None else 'run2'}"
    main = first or second
    shown = next(s["heatmap"] for s in sides if s)
    return {"pair_id": pair_id, "sides": sides, "difference": difference, "why_not": why_not, "level": level,
            "specials": specials, "pair": main.row, "fields": PAIR_FIELDS, "cell": shown.cell,
            "cells": [max(MIN_ASKED_PX, shown.cell * 2 // 3), min(MAX_CELL_PX, shown.cell * 3 // 2)]}  # fmt: skip


def _wait_same_tokens(app: App) -> dict[str, Any] | None:
    """None when the same-token table is there; else what the page says while it is built."""
    app.same_tokens.wait(0.5)
    if not app.same_tokens.is_set():
        return {"building": True, "since": time.time() - app.started}
    if app.same_tokens_error:
        raise RuntimeError(f"the same-token cells could not be read: {app.same_tokens_error}")
    return None


# The tokens list: lexical_ranks.sql's rows (the file its pages link to), with its variables' defaults (declared there:
# jobs.sqlfiles.default): the ranks over token_stats of the tokens kept ($min_count, $include_special), then the
# search $q.
LEXICAL_MIN_COUNT = sqlfiles.default("lexical_ranks.sql", "min_count")
LEXICAL_INCLUDE_SPECIAL = sqlfiles.default("lexical_ranks.sql", "include_special")
TOKENS_RANKED = """
    with kept as (
        select token, n, mean, std from token_stats
        where ($include_special or not is_special) and n >= $min_count
    ),
    ranked as (select *, rank() over (order by mean desc) as rank from kept)"""
TOKENS_FILTER = "where $q = '' or contains(lower(token), $q)"


@dataclass(frozen=True)
class TokensQuery:
    """/tokens' and /tokens.csv's parameters: the tokens kept (lexical_ranks.sql's variables, with its defaults), the
    search, the order."""

    min_count: int
    include_special: bool
    q: str
    sort: str
    order: str

    @classmethod
    def of(cls, p: Params) -> TokensQuery:
        sort = p.choice("sort", TOKEN_SORTS, "rank")
        return cls(p.integer("min_count", LEXICAL_MIN_COUNT, 1), p.flag("include_special", LEXICAL_INCLUDE_SPECIAL),
                   p.text("q").strip(), sort,
                   p.choice("order", ("asc", "desc"), "asc" if sort in ("rank", "token") else "desc"))  # fmt: skip

    def args(self) -> dict[str, Any]:
        """TOKENS_RANKED's and TOKENS_FILTER's variables."""
        return {"min_count": self.min_count, "include_special": self.include_special, "q": self.q.lower()}

    def variables(self) -> str:
        """The same tokens kept, as `xsbert sql -f lexical_ranks` takes them."""
        return f"--var min_count={self.min_count} --var include_special={str(self.include_special).lower()}"


def page_tokens(app: App, page: Page, p: Params) -> dict[str, Any]:
    t = TokensQuery.of(p)
    size = p.integer("size", app.page_size, 1, MAX_PAGE_SIZE)
    number = p.integer("page", 1, 1)
    out: dict[str, Any] = {**asdict(t), "sorts": TOKEN_SORTS, "number": number, "size": size}
    building = _wait_same_tokens(app)
    if building:
        return {**out, **building, "items": [], "total": 0, "pages": 1}
    args = {**t.args(), "limit": size, "offset": (number - 1) * size}
    ranked, filt = TOKENS_RANKED, TOKENS_FILTER
    command = f"xsbert sql --run {shlex.quote(str(app.run.path))} -f lexical_ranks {t.variables()}"
    total = page.run("how many tokens", f"{ranked}\nselect count(*) from ranked {filt}", args, view_sql=f"-- {command}",
                     note="over token_stats, built at start: " + " ".join(App.TOKEN_STATS_SQL.split()))[0][0]  # fmt: skip
    rows = page.run("the page of tokens", f"""{ranked}
        select token, n, mean, std, rank from ranked {filt}
        order by {TOKEN_SORTS[t.sort]} {t.order} nulls last, token
        limit $limit offset $offset""", args, view_sql=f"-- the rows of: {command}")  # fmt: skip
    items = [dict(zip(("token", "n", "mean", "std", "rank"), r)) for r in rows]
    return {**out, "items": items, "total": total, "pages": max(1, math.ceil(total / size)), "building": False}


def page_token(app: App, page: Page, p: Params) -> dict[str, Any]:
    token = p.text("t")
    if not token:
        raise BadRequest("t: which token? (/token?t=TOKEN)")
    order = p.choice("order", ("asc", "desc"), "desc")
    size = p.integer("size", app.page_size, 1, MAX_PAGE_SIZE)
    number = p.integer("page", 1, 1)
    out: dict[str, Any] = {"token": token, "order": order, "number": number, "size": size}
    building = _wait_same_tokens(app)
    if building:
        return {**out, **building, "items": [], "total": 0, "pages": 1, "stats": None}
    args = {"t": token, "limit": size, "offset": (number - 1) * size}
    stats = page.run("the token's same-token cells", """
        select count(*) as n, avg(value) as mean, stddev_samp(value) as std, count(distinct pair_id) as n_pairs
        from same_token_cells where token = $t""", args,
        view_sql="""select count(*) as n, avg(value) as mean, stddev_samp(value) as std,
                    count(distinct pair_id) as n_pairs from cells where token_a = $t and token_b = $t""")[0]  # fmt: skip
    if not stats[0]:
        raise NotFound(f"no same-token cell of the token {token!r} (token_a = token_b) in the run")
    rows = page.run("the page of cells, with their pairs", f"""
        with page as (
            select pair_id, i, j, value from same_token_cells where token = $t
            order by value {order}, pair_id, i, j limit $limit offset $offset
        )
        select page.pair_id, page.i, page.j, page.value, p.score, p.text_a, p.text_b
        from page join pairs_memory p using (pair_id)
        order by page.value {order}, page.pair_id, page.i, page.j""", args,
        view_sql=f"""select c.pair_id, c.i, c.j, c.value, p.score, p.text_a, p.text_b
                     from cells c join pairs p using (pair_id) where c.token_a = $t and c.token_b = $t
                     order by c.value {order}, c.pair_id, c.i, c.j limit $limit offset $offset""")  # fmt: skip
    items = [dict(zip(("pair_id", "i", "j", "value", "score", "text_a", "text_b"), r)) for r in rows]
    return {**out, "items": items, "total": stats[0], "pages": max(1, math.ceil(stats[0] / size)),
            "stats": dict(zip(("n", "mean", "std", "n_pairs"), stats)), "building": False}  # fmt: skip


ROUTES: dict[str, tuple[str, Callable[[App, Page, Params], dict[str, Any]]]] = {
    "/": ("serve_pairs.html", page_pairs),
    "/pairs": ("serve_pairs.html", page_pairs),
    "/pair": ("serve_pair.html", page_pair),
    "/tokens": ("serve_tokens.html", page_tokens),
    "/token": ("serve_token.html", page_token),
}


# No script may run on a page; styles are inline; nothing is loaded from elsewhere.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
