"""`xsbert serve`: a local, read-only web app over a run; `xsbert show`: one stored pair at a terminal.

    xsbert serve --run runs/<id> [--run2 runs/<id2>] [--port 8000] [--host 127.0.0.1]
    xsbert show --run runs/<id> --pair ID [--words] [--png OUT.png]

Pages (jinja2 templates of jobs/templates/, jobs.pages' environment: every dataset string escaped):

    /pairs    the pairs: text (substring) or token search, filters (score, label, |error|, sums, tokens), sort by any
              of them, pages of --page-size; quarantined rows by reason; counts always shown
    /pair     one pair: texts, score, sums, reference terms, errors; token x token and word x word heatmaps (SVG,
              diverging colours centred at 0, the value of a cell on hover), top positive and negative cells; with
              --run2 the same pair in both runs side by side and their difference
    /tokens   lexical ranks (sql/lexical_ranks.sql): each token's same-token attributions over the store
    /token    one token's same-token cells, linked to their pairs

Every page shows its SQL as run (parameters bound, `$name`), and as an `xsbert sql` command to paste.

Design for a store of 404k pairs / 115M cells (bench/serve.py, bench/results/serve.md): DuckDB over the run's
Parquet. The pairs pages sort and filter a copy of the list's columns of `pairs` made in memory at start
(`pairs_memory`, ~100 MB at 404k pairs; reading Parquet on every page was ~10x slower). A pair page
finds the pair's wave from the name of its `pairs` part (part-<wave>.parquet) and reads the cells, word cells and
sentences of that wave's parts only (the job writes a wave's cells as part-<wave>-*.parquet), not the whole
`cells` table; a store laid out otherwise falls back to the whole table. The tokens pages read a table of the
same-token cells (token_a = token_b, ~2% of the cells) that a background thread builds once at start (in memory,
never in the run). Both copies are of the run as it was at start.

The machinery is in jobs/browse/: run.py (opening a run, the in-memory copies, every query as run), heatmap.py
(one stored pair and its heatmaps), pages.py (each page's parameters and queries), http.py (rendering, the server).

Read-only: the server answers GET and HEAD only, DuckDB holds the run's tables as views over its files, and
nothing is written anywhere. It listens on 127.0.0.1 unless --host says otherwise, and answers only requests
addressed to it (Host: that address, a loopback address or localhost, with its port: a page whose DNS name was
rebound to 127.0.0.1 gets 403). At most --workers requests are answered at once, a few more wait, and beyond those
a request gets 503 with Retry-After (jobs/browse/http.py). Pages carry a Content
Security Policy that allows no script at all, so a dataset string could not run even if escaping failed.
"""

from __future__ import annotations

import argparse
import sys

from xsbert_core import InputError
from xsbert_core.cli import add_top_argument

from . import sqlrun
from .browse.heatmap import load_pair
from .browse.http import is_loopback, make_server
from .browse.run import (
    DEFAULT_WORKERS,
    MAX_PAGE_SIZE,
    PAGE_SIZE,
    RETRY_AFTER_S,
    WAITING_PER_WORKER,
    App,
    Page,
    open_run,
)
from .config import SERVE_HOST, SERVE_PORT


def add_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "serve",
        help="browse a run in a local web app (pairs, heatmaps, tokens)",
        description="A local read-only web app over a run: the pairs (search, filters, sort, pages), each pair's "
        "token and word heatmaps and top cells (with --run2: both runs and their difference), and the lexical ranks "
        "with their pairs. Every page shows its SQL. DuckDB over the run's Parquet; nothing is written.",
    )
    s.add_argument("--run", required=True, metavar="DIR", help="the run directory, local or s3://... / gs://...")
    s.add_argument("--run2", metavar="DIR2", help="a second run of the same pairs: pair pages show both and the difference")  # fmt: skip
    s.add_argument("--host", default=SERVE_HOST,
                   help=f"address to listen on (default {SERVE_HOST}: this machine only; anything else lets others "
                        "read the run)")  # fmt: skip
    s.add_argument("--port", type=int, default=SERVE_PORT, help=f"port (default {SERVE_PORT}; 0: a free one)")
    s.add_argument("--page-size", type=int, default=PAGE_SIZE, help=f"rows per page of a list (default {PAGE_SIZE})")
    s.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"requests answered at once (default {DEFAULT_WORKERS}); {WAITING_PER_WORKER} more per worker "
                        f"wait, beyond that a request gets 503 with Retry-After: {RETRY_AFTER_S}")  # fmt: skip
    s.add_argument("-q", "--quiet", action="store_true", help="do not log each request")

    w = sub.add_parser(
        "show",
        help="print one stored pair as `xsbert explain` prints it (read from a run, not recomputed)",
        description="Print a pair of a run as `xsbert explain` prints a computed one: settings, texts, score, sums, "
        "reference terms, errors and the top token (and word) pairs, read from the store.",
    )
    w.add_argument("--run", required=True, metavar="DIR", help="the run directory, local or s3://... / gs://...")
    w.add_argument("--pair", required=True, metavar="ID", help="the pair's pair_id")
    w.add_argument("--words", action="store_true", help="also the top word pairs (word_cells)")
    add_top_argument(w)
    w.add_argument("--png", metavar="OUT.png", help="write the token heatmap, as xsbert explain --plot draws it")


def serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port {args.port}: not a port (0..65535)")
    if args.page_size < 1 or args.page_size > MAX_PAGE_SIZE:
        raise InputError(f"--page-size {args.page_size}: use 1..{MAX_PAGE_SIZE}")
    if not 1 <= args.workers <= 256:
        raise InputError(f"--workers {args.workers}: use 1..256")
    app = App(args.run, args.run2, args.page_size)
    try:  # the app's background build stopped before the process ends, however it ends (App.close)
        log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        server = make_server(app, args.host, args.port, log, args.workers)
        host, port = server.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        for info in app.runs():
            print(f"{info.flag[2:]}: {info.path} ({info.counts['pairs']:,} pairs, {info.label()})", flush=True)
            if info.note:
                print(f"note: {info.note}", flush=True)
        if not is_loopback(args.host):
            print(f"warning: listening on {args.host}: anyone who can reach this machine's port {port} can read the "
                  "run", file=sys.stderr, flush=True)  # fmt: skip
        print(f"serving http://{shown}:{port}/ (read-only; Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("stopped", flush=True)
        finally:
            server.server_close()
    finally:
        app.close()
    return 0


def show(args: argparse.Namespace, out=None) -> int:
    """`xsbert show`: the pair as `xsbert explain` prints it, from the store."""
    from xsbert_core.cli import check_top, format_view, output_file, save_heatmap

    out = out or sys.stdout
    check_top(args.top)
    png = output_file(args.png, "--png", image=True) if args.png else None
    con = sqlrun.connect(sqlrun.check_run(args.run))
    info = open_run(con, args.run, "--run", "")
    page = Page(con, lambda sql, run2: sql)
    try:
        pair = load_pair(page, info, args.pair)
    finally:
        page.close()
    if pair is None:
        why = con.execute("select reason, detail from quarantine where pair_id = $id", {"id": args.pair}).fetchall()
        raise InputError(f"--pair {args.pair}: no such pair in {args.run}"
                         + (f" (quarantined: {why[0][0]}: {why[0][1]})" if why else ""))  # fmt: skip
    min_abs = (info.manifest.get("config") or {}).get("min_abs")
    res = pair.attribution(args.words)
    print(format_view(res, pair.row["text_a"], pair.row["text_b"], args.top), file=out)
    if min_abs:
        print(f"(cells with |value| < {min_abs} are not stored: --min-abs {min_abs}; they count as 0 here)", file=out)
    if png:
        save_heatmap(res, png, "--png", f"   (pair {args.pair})")
        print(f"wrote {png}", file=out)
    return 0
