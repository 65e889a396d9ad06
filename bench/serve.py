"""`xsbert serve` benchmark: every page of the browser on a synthetic store of full-QQP size, timed over HTTP.

    python bench/serve.py                      # 404,290 pairs: make the store (minutes), time every page
    python bench/serve.py --reuse              # keep the store of an earlier run with the same --pairs/--seed
    python bench/serve.py --pairs 5000         # smoke run
    python bench/serve.py --run runs/<id>      # an existing job store instead (nothing generated)

The store (default /tmp/xsbert-bench-serve; never the repository) has the layout and the schemas of
`python -m jobs.attribute` (jobs/_store.SCHEMAS and parquet_options): waves of --wave-size pairs, one `pairs` and
`sentences` part per wave and one `cells` / `word_cells` part per stage-2 batch of --batch-pairs pairs, as the
404k rehearsal run of bench/scale.py wrote them (25 waves, ~1,600 cell parts). What is real and what is not:
the texts are the bundled QQP subset's questions, each with ~1/3 of its words swapped for a word drawn from the
subset's word frequencies (so nearly every sentence is distinct: ~2 per pair, against 1.33 in full QQP),
tokenized by a stand-in (lowercase words and punctuation, words longer than 7 characters split into a piece and a `##` piece; [CLS] and
[SEP] around); every pair has all S_a x S_b cells (~280 per pair, as the rehearsal store); cell values are random
(a same-token cell larger on average), the sums in `pairs` are the sums of its cells, word cells are random
values on the word grid, the top-10 lists are null and the vectors random. The pages' speed depends on the
sizes and the layout, which are those of a real store, not on the values.

Timing: the server (jobs.serve) runs in this process on a free port of 127.0.0.1; each page is fetched over HTTP
--repeat times (the whole body read), after one untimed warm-up of the same page, and the median and the slowest
kept. Beside each page, its baseline: the same answer computed the obvious way with DuckDB over the run's views
(`xsbert sql`: whole-table globs; the pair page without the wave narrowing, the tokens pages from sql/
lexical_ranks.sql over every cell), timed in the same process in the same run. Results: bench/results/serve.md.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs._store import SCHEMAS, parquet_options, part_name  # noqa: E402

QQP = Path("/work/shared/data/qqp/qqp_glue_train_subset.tsv.gz")
QQP_FULL_PAIRS = 404_290
DEFAULT_STORE = Path("/tmp/xsbert-bench-serve")
RESULTS = ROOT / "bench" / "results" / "serve.md"
_WORD_RE = re.compile(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]")


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
    p.add_argument("--results", default=str(RESULTS))
    return p.parse_args(argv)


# --------------------------------------------------------------------------- the synthetic store
def _tokens(text: str) -> tuple[list[str], list[int | None], list[str]]:
    """The stand-in tokenizer: tokens, word ids, words."""
    tokens: list[str] = ["[CLS]"]
    ids: list[int | None] = [None]
    words: list[str] = []
    for w in _WORD_RE.findall(text.lower()):
        k = len(words)
        words.append(w)
        if len(w) > 7:
            tokens += [w[:5], "##" + w[5:]]
            ids += [k, k]
        else:
            tokens.append(w)
            ids.append(k)
    return tokens + ["[SEP]"], ids + [None], words


def _questions() -> list[tuple[str, str, int]]:
    with gzip.open(QQP, "rt", encoding="utf-8") as fh:
        next(fh)
        rows = [line.rstrip("\n").split("\t") for line in fh]
    return [(r[3], r[4], int(r[5])) for r in rows if len(r) >= 6 and r[3].strip() and r[4].strip()]


def generate(store: Path, n_pairs: int, seed: int, wave_size: int, batch_pairs: int, dim: int) -> Path:
    """Write the run `store/run` (see the module docstring); returns it."""
    rng = np.random.default_rng(seed)
    run = store / "run"
    if run.exists():
        shutil.rmtree(run)
    for t in ("pairs", "cells", "word_cells", "sentences", "quarantine"):
        (run / t).mkdir(parents=True)
    base = _questions()
    vocab_counts: dict[str, int] = {}
    for a, b, _ in base:
        for w in (a + " " + b).split():
            vocab_counts[w] = vocab_counts.get(w, 0) + 1
    vocab = np.array(list(vocab_counts))
    weights = np.array(list(vocab_counts.values()), dtype=float)
    weights /= weights.sum()
    seen: set[str] = set()
    order = rng.permutation(n_pairs)  # pair ids in no order across waves, as real ids are
    t0 = time.time()
    for seq, start in enumerate(range(0, n_pairs, wave_size)):
        stop = min(start + wave_size, n_pairs)
        m = stop - start
        pair_rows, sent_rows = [], []
        toks: list[list[str]] = []
        wrds: list[list[str]] = []
        draws = iter(vocab[rng.choice(len(vocab), size=60 * m, p=weights)].tolist())
        coins = iter((rng.random(60 * m) < 0.33).tolist())
        for k in range(start, stop):
            qa, qb, label = base[k % len(base)]
            swap = {}
            sides = []
            for q in (qa, qb):
                ws = q.split()
                out = []
                for w in ws:
                    if w not in swap:
                        swap[w] = next(draws) if next(coins) else w
                    out.append(swap[w])
                sides.append(" ".join(out))
            ids = []
            for text in sides:
                sid = hashlib.sha256(text.encode()).hexdigest()[:16]
                tokens, word_ids, words = _tokens(text)
                ids.append((sid, tokens, words))
                if sid not in seen:
                    seen.add(sid)
                    sent_rows.append({"sentence_id": sid, "text": text, "n_tokens": len(tokens), "n_words": len(words),
                                      "tokens": tokens, "word_ids": word_ids, "words": words,
                                      "factor_error": float(rng.uniform(0, 0.01)), "n_steps": 2, "truncated": False,
                                      "embedding_norm": 1.0})  # fmt: skip
            (sa, ta, wa), (sb, tb, wb) = ids
            toks += [ta, tb]
            wrds += [wa, wb]
            pair_rows.append({"pair_id": str(order[k]), "row": int(order[k]), "split": "train", "label": float(label),
                              "text_a": sides[0], "text_b": sides[1], "sentence_id_a": sa, "sentence_id_b": sb,
                              "n_tokens_a": len(ta), "n_tokens_b": len(tb), "steps_a": 2, "steps_b": 2,
                              "truncated_a": False, "truncated_b": False,
                              "n_cells": len(ta) * len(tb), "n_word_cells": len(wa) * len(wb)})  # fmt: skip
        # cells and word cells, vectorized per batch of pairs
        sums = np.zeros((m, 3))
        for b0 in range(0, m, batch_pairs):
            b1 = min(b0 + batch_pairs, m)
            for table, lists in (("cells", toks), ("word_cells", wrds)):
                la = np.array([len(lists[2 * k]) for k in range(b0, b1)])
                lb = np.array([len(lists[2 * k + 1]) for k in range(b0, b1)])
                sizes = la * lb
                total = int(sizes.sum())
                pidx = np.repeat(np.arange(b1 - b0), sizes)
                within = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
                i = within // lb[pidx]
                j = within % lb[pidx]
                flat_a = np.concatenate([np.array(lists[2 * k], dtype=object) for k in range(b0, b1)])
                flat_b = np.concatenate([np.array(lists[2 * k + 1], dtype=object) for k in range(b0, b1)])
                off_a = np.repeat(np.cumsum(la) - la, sizes)
                off_b = np.repeat(np.cumsum(lb) - lb, sizes)
                xa = pa.array(flat_a, pa.string()).take(pa.array(off_a + i))
                xb = pa.array(flat_b, pa.string()).take(pa.array(off_b + j))
                value = rng.normal(0.0, 0.02, total)
                same = pc.equal(xa, xb).to_numpy(zero_copy_only=False)
                value[same] += rng.normal(0.08, 0.05, int(same.sum()))
                ids = pa.array([pair_rows[b0 + k]["pair_id"] for k in range(b1 - b0)], pa.string()).take(pa.array(pidx))
                if table == "cells":
                    cols = {"pair_id": ids, "i": pa.array(i, pa.int32()), "j": pa.array(j, pa.int32()), "token_a": xa,
                            "token_b": xb, "value": pa.array(value)}  # fmt: skip
                    k = b0 + pidx
                    sums[:, 0] += np.bincount(k, value, minlength=m)
                    sums[:, 1] += np.bincount(k, np.where(value > 0, value, 0.0), minlength=m)
                    sums[:, 2] += np.bincount(k, np.where(value < 0, value, 0.0), minlength=m)
                else:
                    cols = {"pair_id": ids, "u": pa.array(i, pa.int32()), "v": pa.array(j, pa.int32()), "word_a": xa,
                            "word_b": xb, "value": pa.array(value)}  # fmt: skip
                schema = SCHEMAS[table]
                data = pa.table({f.name: cols.get(f.name, pa.nulls(total, f.type)) for f in schema}, schema=schema)
                pq.write_table(data, run / table / part_name(seq, start + b0), **parquet_options(table))
        for k, row in enumerate(pair_rows):
            s, pos, neg = sums[k]
            score = float(np.clip(s + rng.normal(0, 0.02), -1, 1))
            row.update(attribution_sum=float(s), positive_sum=float(pos), negative_sum=float(neg), score=score,
                       target=score, completeness_error=float(s - score), ref_sim_a=float(rng.normal(0, 0.1)),
                       ref_sim_b=float(rng.normal(0, 0.1)), ref_term=float(rng.uniform(0.8, 1)),
                       factor_error_a=float(rng.uniform(0, 0.01)), factor_error_b=float(rng.uniform(0, 0.01)))  # fmt: skip
        n_sent = len(sent_rows)
        vectors = rng.normal(0, 0.05, n_sent * dim).astype(np.float32)
        offsets = pa.array(np.arange(n_sent + 1, dtype=np.int32) * dim)
        vector_columns = {"embedding": pa.ListArray.from_arrays(offsets, pa.array(vectors)),
                          "reference_embedding": pa.ListArray.from_arrays(offsets, pa.array(vectors * 0.5))}
        for table, rows in (("sentences", sent_rows), ("pairs", pair_rows)):
            schema = SCHEMAS[table]
            data = pa.table({f.name: vector_columns[f.name] if table == "sentences" and f.name in vector_columns
                             else pa.array([r.get(f.name) for r in rows], f.type) for f in schema}, schema=schema)
            pq.write_table(data, run / table / part_name(seq), **parquet_options(table))
        print(f"wave {seq}: {stop:,} pairs, {len(seen):,} sentences, {time.time() - t0:.0f} s", flush=True)
    quarantine = [{"row": n_pairs + k, "pair_id": f"q{k}", "reason": reason, "detail": "synthetic",
                   "text_a": "x", "text_b": "", "label": "0"}
                  for k, reason in enumerate(["too_long_a"] * 10 + ["empty_text_b"] * 4)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(quarantine, schema=SCHEMAS["quarantine"]),
                   run / "quarantine" / part_name(0), **parquet_options("quarantine"))  # fmt: skip
    manifest = {"run_id": "bench-serve", "config": {"model": "synthetic (bench/serve.py)", "mode": "approx",
                "similarity": "cos", "layer": 3, "n_layers": 6, "rule": "riemann", "steps": 2,
                "dataset": {"name": "qqp", "split": "train"}},
                "settings": {"model": "synthetic (bench/serve.py)", "layer": 3, "n_layers": 6, "mode": "approx",
                             "similarity": "cos", "rule": "riemann", "steps": 2}}  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (store / "complete.json").write_text(json.dumps({"pairs": n_pairs, "seed": seed, "seconds": time.time() - t0}))
    return run


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
            run = generate(store, args.pairs, args.seed, args.wave_size, args.batch_pairs, args.embedding_dim)
        made = json.loads(stamp.read_text())
    if args.generate_only:
        return 0
    from jobs import _sql, serve

    t = time.perf_counter()
    app = serve.App(run)
    opened = time.perf_counter() - t
    server = serve.make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    t = time.perf_counter()
    app.same_tokens.wait()
    cache_s = time.perf_counter() - t + 0.0
    con = _sql.connect(run)
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
        ("pairs: last page, sorted by |error|", "/pairs?sort=error&page=8086", None),
        (f"pairs: text search '{word}'", f"/pairs?q={q(word)}", None),
        (f"pairs: token search '{token}'", f"/pairs?token={q(token)}", None),
        ("pairs: filters (score > 0.5, label 1, |error| > 0.01)", "/pairs?min_score=0.5&min_label=1&min_error=0.01",
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
                   lambda: _sql.run_file(con, _sql.SQL_DIR / "lexical_ranks.sql")),
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
