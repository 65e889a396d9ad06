"""`xsbert serve` benchmark: every page of the browser on a synthetic store of full-QQP size, timed over HTTP.

    python bench/serve.py                      # 404,290 pairs: make the store (minutes), time every page
    python bench/serve.py --reuse              # keep the store of an earlier run with the same --pairs/--seed
    python bench/serve.py --pairs 5000         # smoke run
    python bench/serve.py --run runs/<id>      # an existing job store instead (nothing generated)

The store (default /tmp/xsbert-bench-serve; never the repository) is bench/synthstore/serving.py's (its docstring says
what is real and what is not): one run in the layout of the 404k rehearsal run of bench/scale.py.

Timing: the server (jobs.serve) runs in this process on a free port of 127.0.0.1; each page is fetched over HTTP
--repeat times (the whole body read), after one untimed warm-up of the same page, and the median and the slowest
kept. Beside each page, its baseline: the same answer computed the obvious way with DuckDB over the run's views
(`xsbert sql`: whole-table globs; the pair page without the wave narrowing, the tokens pages from sql/
lexical_ranks.sql over every cell), timed in the same process in the same run. Results: bench/results/serve.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from synthstore import QQP_FULL_PAIRS
from synthstore.serving import generate

DEFAULT_STORE = Path("/tmp/xsbert-bench-serve")
RESULTS = ROOT / "bench" / "results" / "serve.md"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench/serve.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default=str(DEFAULT_STORE), help=f"store root (default {DEFAULT_STORE})")
    p.add_argument("--run", default=None, help="time the pages on this existing run directory (nothing generated)")
    p.add_argument("--pairs", type=int, default=QQP_FULL_PAIRS, help=f"pairs to generate (default {QQP_FULL_PAIRS:,})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reuse", action="store_true", help="keep a complete store made with the same --pairs and --seed")
    p.add_argument("--wave-size", type=int, default=16_384, help="pairs per wave (pairs / sentences part)")
    p.add_argument("--batch-pairs", type=int, default=256, help="pairs per cells / word_cells part")
    p.add_argument("--embedding-dim", type=int, default=384)
    p.add_argument("--repeat", type=int, default=5, help="timed fetches per page")
    p.add_argument("--generate-only", action="store_true")
    p.add_argument("--from-wave", type=int, default=0,
                   help="finish an interrupted generation: keep its waves before this one, make the rest")
    p.add_argument("--results", default=str(RESULTS))
    return p.parse_args(argv)


# --------------------------------------------------------------------------- timing
def _fetch(url: str) -> tuple[int, int]:
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.status, len(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, len(exc.read())


def _time(fn, repeat: int) -> tuple[float, float, object]:
    fn()  # warm-up (the OS page cache, DuckDB's metadata cache)
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), max(times), out


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(args: argparse.Namespace) -> int:
    store = Path(args.store)
    if args.run:
        run = Path(args.run)
        made = None
    else:
        stamp = store / "complete.json"
        done = json.loads(stamp.read_text()) if stamp.is_file() else {}
        if args.reuse and done.get("pairs") == args.pairs and done.get("seed") == args.seed:
            run = store / "run"
        else:
            store.mkdir(parents=True, exist_ok=True)
            run = generate(store, args.pairs, args.seed, args.wave_size, args.batch_pairs, args.embedding_dim,
                           args.from_wave)
        made = json.loads(stamp.read_text())
    if args.generate_only:
        return 0
    from jobs import serve, sqlfiles, sqlrun

    t = time.perf_counter()
    app = serve.App(run)
    opened = time.perf_counter() - t
    server = serve.make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    t = time.perf_counter()
    app.same_tokens.wait()
    cache_s = time.perf_counter() - t + 0.0
    con = sqlrun.connect(run)
    facts = con.sql("select (select count(*) from pairs), (select count(*) from cells), "
                    "(select count(*) from sentences)").fetchall()[0]
    n_pairs, n_cells, n_sentences = facts[0], facts[1], facts[2]
    n_parts = len(list((run / "cells").glob("*.parquet")))
    # a pair in the middle of the store, a frequent token and a word of a real question
    pid, text = con.sql("select pair_id, text_a from pairs order by pair_id limit 1 offset 1000").fetchall()[0]
    word = next(w for w in text.split() if len(w) > 4 and w.isalpha())
    token = con.sql("""select token_a from cells where pair_id = $p and token_a = token_b and token_a not like '[%'
                       limit 1""", params={"p": pid}).fetchall()  # fmt: skip
    token = token[0][0] if token else "the"
    q = urllib.parse.quote
    pages = [
        ("pairs: first page (by score)", "/pairs", None),
        ("pairs: page 4,000 of 50", "/pairs?page=4000", None),
        ("pairs: last page, sorted by \\|error\\|", "/pairs?sort=error&page=8086", None),
        (f"pairs: text search '{word}'", f"/pairs?q={q(word)}", None),
        (f"pairs: token search '{token}'", f"/pairs?token={q(token)}", None),
        ("pairs: filters (score > 0.5, label 1, \\|error\\| > 0.01)", "/pairs?min_score=0.5&min_label=1&min_error=0.01",
         None),
        ("pairs: quarantine reason", "/pairs?reason=too_long_a", None),
        (f"pair {pid}", f"/pair?id={q(pid)}", "cells"),
        (f"pair {pid}, words", f"/pair?id={q(pid)}&level=word", None),
        ("tokens (lexical ranks)", "/tokens", "tokens"),
        (f"token '{token}'", f"/token?t={q(token)}", None),
        ("a missing pair (404)", "/pair?id=no-such-pair", None),
    ]
    baselines = {
        "cells": ("the pair's cells from the whole cells view (xsbert sql)",
                  lambda: con.execute("select i, j, value from cells where pair_id = $p", {"p": pid}).fetchall()),
        "tokens": ("sql/lexical_ranks.sql over every cell (xsbert sql -f lexical_ranks)",
                   lambda: sqlrun.run_file(con, sqlfiles.SQL_DIR / "lexical_ranks.sql")),
    }
    rows = []
    for name, path, base in pages:
        med, worst, (status, size) = _time(lambda path=path: _fetch(url + path), args.repeat)
        line = {"page": name, "path": path, "status": status, "bytes": size, "median_s": med, "max_s": worst}
        if base:
            what, fn = baselines[base]
            bmed, _, _ = _time(fn, max(1, args.repeat // 2))
            line.update(baseline=what, baseline_s=bmed)
        rows.append(line)
        print(f"{name}: {status} {size:,} B median {med:.3f} s max {worst:.3f} s"
              + (f"; baseline {line['baseline_s']:.3f} s" if base else ""), flush=True)  # fmt: skip
    server.shutdown()
    write_results(Path(args.results), run, made, n_pairs, n_cells, n_sentences, n_parts, opened, cache_s, rows, args)
    return 0


def write_results(path: Path, run: Path, made, n_pairs, n_cells, n_sentences, n_parts, opened, cache_s, rows, args):
    sizes = {t: _du(run / t) for t in ("pairs", "cells", "word_cells", "sentences", "quarantine")}
    load = os.getloadavg()
    lines = [
        "# `xsbert serve` benchmark (bench/serve.py)", "",
        f"## `python bench/serve.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')})", "",
        "| | |", "|---|---|",
        f"| machine | {platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared with other work "
        f"(1-min load average at the end {load[0]:.1f}) |",
        f"| store | {run}: {sum(sizes.values()) / 1e9:.2f} GB ("
        + ", ".join(f"{t} {s / 1e6:,.0f} MB" for t, s in sizes.items()) + ")" + " |",
        f"| pairs / cells / sentences / cell parts | {n_pairs:,} / {n_cells:,} / {n_sentences:,} / {n_parts:,} |",
        f"| generation | {'an existing run' if made is None else str(round(made['seconds'])) + ' s'} |",
        f"| server start (checks, views, part listing) | {opened:.2f} s |",
        f"| same-token index (background, once per start) | {cache_s:.1f} s |",
        "", f"Each page fetched over HTTP {args.repeat} times after a warm-up; median and slowest. Target: ≤ 1 s.", "",
        "| page | status | size | median (s) | slowest (s) | ≤ 1 s | baseline (same run) | baseline (s) | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        base = (f"{r['baseline']} | {r['baseline_s']:.3f} | {r['baseline_s'] / r['median_s']:.1f}×"
                if "baseline" in r else "| |")  # fmt: skip
        lines.append(f"| {r['page']} (`{r['path']}`) | {r['status']} | {r['bytes']:,} B | {r['median_s']:.3f} | "
                     f"{r['max_s']:.3f} | {'yes' if r['max_s'] <= 1 else '**no**'} | {base} |")  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main(parse_args()))
