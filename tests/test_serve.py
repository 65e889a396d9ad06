"""`xsbert serve` over real small stores (HTTP: pages, status codes, escaping of hostile strings, paging, filters,
the SQL shown), its checks of missing and half-written runs, the report's links into it, `xsbert show` (against
the stored matrix, and against `xsbert explain` on a real run), and the pages in headless Chromium.

The stores are Parquet run directories with the job's schemas and layout (jobs.store.SCHEMAS, a part per wave:
pairs/part-<wave>.parquet, cells/part-<wave>-<first>.parquet), written here with hostile strings in texts, tokens,
words and quarantine rows; every number a page shows is checked against the rows written (plain Python).
"""

from __future__ import annotations

import csv
import io
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from html import unescape
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from browser import Chromium, find_chromium

from jobs import cli, serve, sqlrun
from jobs.browse.heatmap import colour
from jobs.store import SCHEMAS
from xsbert_core import InputError

HOSTILE = ["<script>alert(1)</script>", "\"'><img src=x onerror=alert(2)>", "&amp;", "{{7*7}}"]
WORDS = ["the", "cat", "dog", "house", "is", "not", "big", "small", "runs", ".", HOSTILE[1], "'quote"]


# --------------------------------------------------------------------------- stores
def write_part(run: Path, table: str, name: str, rows: list[dict[str, Any]]) -> None:
    schema = SCHEMAS[table]
    (run / table).mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema),
                   run / table / name)  # fmt: skip


def sentence_row(sid: str, words: list[str]) -> dict[str, Any]:
    return {"sentence_id": sid, "text": " ".join(words), "n_tokens": len(words) + 2, "n_words": len(words),
            "tokens": ["[CLS]", *words, "[SEP]"], "word_ids": [None, *range(len(words)), None], "words": words}  # fmt: skip


def make_store(root: Path, name: str, n_pairs: int = 40, seed: int = 0, scale: float = 1.0, waves: int = 2,
               manifest: bool = True, shift: float = 0.0, words: dict[int, tuple[list[str], list[str]]] | None = None,
               text_b: dict[int, str] | None = None) -> tuple[Path, dict[str, list[dict[str, Any]]]]:  # fmt: skip
    """A run of `n_pairs` random pairs over WORDS (hostile strings among them) in `waves` waves, plus quarantine rows;
    values drawn from `seed` (the same texts for every seed), plus `shift`, multiplied by `scale`; `words` sets the
    words of some pairs (by number), `text_b` the stored text b of some."""
    texts = np.random.default_rng(0)
    rng = np.random.default_rng(seed)
    run = root / name
    data: dict[str, list[dict[str, Any]]] = {"pairs": [], "cells": [], "word_cells": [], "sentences": []}
    per_wave = -(-n_pairs // waves)
    for wave in range(waves):
        rows: dict[str, list[dict[str, Any]]] = {t: [] for t in data}
        for p in range(wave * per_wave, min(n_pairs, (wave + 1) * per_wave)):
            wa = [str(w) for w in texts.choice(WORDS, int(texts.integers(2, 7)))]
            wb = [str(w) for w in texts.choice(WORDS, int(texts.integers(2, 7)))]
            if p == 0:
                wa = ["the", "cat", "is", "not", "big"]
            if words and p in words:
                wa, wb = list(words[p][0]), list(words[p][1])
            sa, sb = sentence_row(f"s{p}a", wa), sentence_row(f"s{p}b", wb)
            rows["sentences"] += [sa, sb]
            pid = f"p{p:02d}" if p != 3 else f"p03{HOSTILE[0]}"
            cells = []
            for i, ta in enumerate(sa["tokens"]):
                for j, tb in enumerate(sb["tokens"]):
                    value = scale * (round(float(rng.normal(0, 0.1)), 3) + (0.3 if ta == tb else 0.0) + shift)
                    cells.append({"pair_id": pid, "i": i, "j": j, "token_a": ta, "token_b": tb, "value": value})
            rows["cells"] += cells
            for u, x in enumerate(wa):
                for v, y in enumerate(wb):
                    rows["word_cells"].append({"pair_id": pid, "u": u, "v": v, "word_a": x, "word_b": y,
                                               "value": scale * round(float(rng.normal(0, 0.1)), 3)})  # fmt: skip
            values = [c["value"] for c in cells]
            total = float(sum(values))
            text_a = sa["text"] + (f" {HOSTILE[0]}" if p % 5 == 0 else "")
            rows["pairs"].append({
                "pair_id": pid, "row": p, "split": "test", "label": float(p % 6), "text_a": text_a,
                "text_b": (text_b or {}).get(p, sb["text"]),
                "sentence_id_a": sa["sentence_id"], "sentence_id_b": sb["sentence_id"],
                "n_tokens_a": len(sa["tokens"]), "n_tokens_b": len(sb["tokens"]),
                "score": round(total + float(rng.normal(0, 0.05)), 4), "attribution_sum": total,
                "positive_sum": float(sum(v for v in values if v > 0)),
                "negative_sum": float(sum(v for v in values if v < 0)), "ref_sim_a": 0.01, "ref_sim_b": -0.02,
                "ref_term": 0.9, "target": total - 0.001 * p, "completeness_error": 0.001 * p,
                "factor_error_a": 0.001, "factor_error_b": 0.002, "steps_a": 2, "steps_b": 2, "truncated_a": False,
                "truncated_b": False, "n_cells": len(cells), "n_word_cells": len(wa) * len(wb),
            })  # fmt: skip
        if not rows["pairs"]:
            continue
        first = rows["pairs"][0]["row"]
        for table in ("cells", "word_cells"):
            write_part(run, table, f"part-{wave:06d}-{first:07d}.parquet", rows[table])
        write_part(run, "sentences", f"part-{wave:06d}.parquet", rows["sentences"])
        write_part(run, "pairs", f"part-{wave:06d}.parquet", rows["pairs"])
        for t in data:
            data[t] += rows[t]
    quarantine = [{"row": 1000 + k, "pair_id": f"q{k}", "reason": reason, "detail": f"detail {HOSTILE[0]}",
                   "text_a": HOSTILE[1], "text_b": "", "label": "1"}
                  for k, reason in enumerate(["empty_text_b", "empty_text_b", "too_long_a"])]  # fmt: skip
    write_part(run, "quarantine", "part-000000.parquet", quarantine)
    data["quarantine"] = quarantine
    if manifest:
        config = {"model": "hand-built", "mode": "approx", "similarity": "cos", "layer": 3, "n_layers": 6,
                  "rule": "riemann", "steps": 2}  # fmt: skip
        (run / "manifest.json").write_text(json.dumps({
            "run_id": name, "config": config, "settings": config,
            "tables": {"pairs": {"path": "pairs/*.parquet", "rows": n_pairs}}}), encoding="utf-8")  # fmt: skip
    return run, data


class Served:
    """An App and its server on a free port of 127.0.0.1, in a thread."""

    def __init__(self, run: Path, run2: Path | None = None, page_size: int = 10) -> None:
        self.app = serve.App(run, run2, page_size)
        self.server = serve.make_server(self.app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        assert self.app.same_tokens.wait(60)

    def get(self, path: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
        request = urllib.request.Request(self.url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, r.read().decode("utf-8"), dict(r.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode("utf-8"), dict(exc.headers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("serve-stores")
    run, data = make_store(root, "run", seed=1)
    run2, data2 = make_store(root, "run2", seed=2, scale=0.5)
    return {"run": run, "data": data, "run2": run2, "data2": data2, "root": root}


@pytest.fixture(scope="module")
def served(stores):
    s = Served(stores["run"], stores["run2"])
    yield s
    s.close()


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def listed_ids(page: str) -> list[str]:
    """The pair ids of a list page, in order (from the links of its rows)."""
    return [unescape(urllib.parse.unquote(m)) for m in re.findall(r"<tr class='pair'>.*?href='/pair\?id=([^']*)'>",
                                                                  page)]  # fmt: skip


def count(page: str) -> int:
    return int(re.search(r"id='count'><b>([\d,]+)</b>", page).group(1).replace(",", ""))


def every_page(served: Served, path: str) -> list[str]:
    """The ids over every page of a list."""
    ids, number = [], 1
    while True:
        status, page, _ = served.get(f"{path}{'&' if '?' in path else '?'}page={number}")
        assert status == 200, page
        ids += listed_ids(page)
        if "rel='next'" not in page:
            return ids
        number += 1


# --------------------------------------------------------------------------- HTTP: pages and status codes
def test_pages_and_status_codes(served, stores):
    pid = stores["data"]["pairs"][0]["pair_id"]
    for path in ("/", "/pairs", f"/pair?id={pid}", f"/pair?id={pid}&level=word", f"/pair?id={pid}&specials=1",
                 "/tokens", "/token?t=big", "/pairs?reason=any", "/pairs?reason=empty_text_b"):  # fmt: skip
        status, page, headers = served.get(path)
        assert status == 200, (path, page[:300])
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert "script-src" not in headers["Content-Security-Policy"] and "default-src 'none'" in headers[
            "Content-Security-Policy"]  # no script may run at all
    for path, status, text in (
        ("/nope", 404, "no page /nope"), ("/pair?id=missing", 404, "no pair with pair_id &#39;missing&#39;"),
        ("/pair?id=q0", 404, "quarantined: empty_text_b"), ("/pair", 400, "which pair"),
        ("/pairs?min_score=abc", 400, "min_score: not a number"), ("/pairs?min_score=nan", 400, "not a finite"),
        ("/pairs?page=0", 400, "page: 0 is outside"), ("/pairs?page=99", 404, "there are 4 pages"),
        ("/pairs?sort=text_a", 400, "sort: &#39;text_a&#39; is not one of"), ("/pairs?reason=nope", 400, "not a quarantine"),
        ("/tokens?min_count=x", 400, "min_count"), ("/token?t=zebra", 404, "no same-token cell"),
        ("/token", 400, "which token"), ("/pairs?size=100000", 400, "size"),
        ("/pairs?min_score=0.9&max_score=0.5", 400, "min_score 0.9 is above max_score 0.5: no pair can match"),
    ):  # fmt: skip
        got, page, _ = served.get(path)
        assert got == status and text in page, (path, got, page[-600:])
    status, page, _ = served.get("/pairs", method="POST")
    assert status == 405 and "read-only" in page
    status, body, headers = served.get("/pairs", method="HEAD")
    assert status == 200 and body == "" and int(headers["Content-Length"]) > 1000


def test_huge_whole_numbers_are_a_400_never_a_500(served):
    """A page or count past int64 (DuckDB's OFFSET overflowed: a 500) is a 400 that names the bound; the largest
    allowed page is past the end, a 404 that says how many pages there are."""
    huge = "9223372036854775807"
    for path in (f"/pairs?page={huge}", f"/pairs?reason=any&page={huge}", f"/tokens?page={huge}",
                 f"/token?t=big&page={huge}", f"/tokens?min_count={huge}", f"/pairs?page={huge}0000",
                 "/pairs?page=" + "9" * 5000):  # fmt: skip
        status, page, _ = served.get(path)
        assert status == 400 and "is outside 1..1,000,000,000,000" in page, (path, status, page[-600:])
    status, page, _ = served.get(f"/pairs?page={10**12}")
    assert status == 404 and "there are 4 pages" in page, page[-600:]


def raw(url: str, request: bytes, timeout: float = 30) -> tuple[int, bytes]:
    """Send `request` as it is (any Host, or none) to the server at `url`; (status, whole response)."""
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_only_requests_for_this_server_are_answered(served, stores):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 makes the browser send
    `Host: evil.example`. Only the address the server listens on, loopback addresses and localhost, with its port,
    are answered; another host (in Host or in an absolute URI) is a 403, no Host at all a 400 (HTTP/1.0 too: every
    browser and HTTP client sends one); no run data in either."""
    port = served.server.server_address[1]
    secret = stores["data"]["pairs"][1]["text_b"].encode()
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"127.0.0.2:{port}"):
        status, body = raw(served.url, f"GET /pairs?q=&sort=row HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert status == 200, (host, body[-300:])
    status, _ = raw(served.url, f"GET http://127.0.0.1:{port}/pairs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    assert status == 200
    for request, want in (
        (f"GET /pairs HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n", 403),
        ("GET /pairs HTTP/1.1\r\nHost: evil.example\r\n\r\n", 403),
        (f"GET /pairs HTTP/1.1\r\nHost: 127.0.0.1.evil.example:{port}\r\n\r\n", 403),
        (f"GET /pairs HTTP/1.1\r\nHost: 127.0.0.1:{port + 1}\r\n\r\n", 403),
        ("GET /pairs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 403),
        (f"GET http://evil.example/pairs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n", 403),
        (f"GET http://evil.example:{port}/pairs HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n", 403),
        (f"HEAD /pairs HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n", 403),
        ("GET /pairs HTTP/1.1\r\n\r\n", 400),
        ("GET /pairs HTTP/1.0\r\n\r\n", 400),
        ("GET /pairs HTTP/1.1\r\nHost: \r\n\r\n", 400),
    ):  # fmt: skip
        status, body = raw(served.url, request.encode())
        assert status == want, (request, body[-300:])
        assert secret not in body and b"Traceback" not in body


def test_host_check_by_listen_address():
    from jobs.browse.http import host_allowed

    me = socket.gethostname()
    assert host_allowed("localhost:8000", "127.0.0.1", 8000) and host_allowed("[::1]:8000", "127.0.0.1", 8000)
    assert host_allowed("10.1.2.3:8000", "10.1.2.3", 8000) and not host_allowed("10.1.2.4:8000", "10.1.2.3", 8000)
    assert host_allowed("node7:8000", "node7", 8000) and host_allowed("localhost", "127.0.0.1", 80)
    assert not host_allowed("localhost", "127.0.0.1", 8000) and not host_allowed("example.org:80", "127.0.0.1", 80)
    # every address: any IP address (a rebinding page has a name, never an address) and this machine's name
    assert host_allowed("10.9.8.7:8000", "0.0.0.0", 8000) and host_allowed(f"{me}:8000", "0.0.0.0", 8000)
    assert host_allowed("[fe80::1]:8000", "::", 8000) and not host_allowed("evil.example:8000", "0.0.0.0", 8000)
    for bad in (None, "", ":8000", "[::1:8000", "[::1]x", "localhost:80x", "localhost:8000:1"):
        assert not host_allowed(bad, "127.0.0.1", 8000), bad


def test_a_run_damaged_under_the_server_is_a_500_of_one_line_also_in_the_log(stores, tmp_path):
    """A cells part cut short while the server runs: the pair page is a 500 that says so in one line, and the log
    gets that line, not a traceback (a damaged file is no bug of the server's)."""
    import shutil

    run = shutil.copytree(stores["run"], tmp_path / "run")
    s = Served(run)
    s.server.server_close()
    s.server.shutdown()
    logged: list[str] = []
    s.server = serve.make_server(s.app, "127.0.0.1", 0, log=logged.append)
    s.url = f"http://127.0.0.1:{s.server.server_address[1]}"
    threading.Thread(target=s.server.serve_forever, daemon=True).start()
    try:
        pid = stores["data"]["pairs"][0]["pair_id"]
        assert s.get(f"/pair?id={q(pid)}")[0] == 200
        for part in (run / "cells").glob("*.parquet"):
            part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
        status, page, _ = s.get(f"/pair?id={q(pid)}")
        assert status == 500 and "the run cannot be read (" in page and "restart it on a whole run" in page
        errors = [line for line in logged if "cannot be read" in line or "Traceback" in line]
        assert len(errors) == 1 and "Traceback" not in errors[0] and errors[0].count("\n") == 0, logged
        assert errors[0].startswith(f"GET /pair?id={q(pid)}: 500: the run cannot be read ("), errors
    finally:
        s.close()


def test_many_concurrent_requests_are_answered_or_told_to_retry(stores):
    """Bounded work: 2 workers and 2 waiting. While 4 stalled clients hold every slot, 50 concurrent requests are
    each answered at once with 503 and Retry-After (before: a thread per request, a silent queue); once the
    stalled clients go, 50 concurrent requests are all answered, 200 or 503, none left hanging, and every 503
    carries Retry-After."""
    s = Served(stores["run"])
    s.server.server_close()
    s.server.shutdown()
    s.server = serve.make_server(s.app, "127.0.0.1", 0, workers=2, waiting=2)
    s.url = f"http://127.0.0.1:{s.server.server_address[1]}"
    threading.Thread(target=s.server.serve_forever, daemon=True).start()
    port = s.server.server_address[1]
    pid = stores["data"]["pairs"][0]["pair_id"]
    request = f"GET /pair?id={q(pid)} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    try:
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        for sock in stalled:
            sock.sendall(b"GET /pairs HTTP/1.1\r\n")  # and nothing more: each holds a slot
        time.sleep(0.5)
        with ThreadPoolExecutor(50) as pool:
            t0 = time.monotonic()
            answers = list(pool.map(lambda _: raw(s.url, request, timeout=20), range(50)))
            took = time.monotonic() - t0
        assert [a[0] for a in answers] == [503] * 50 and took < 15, took
        assert all(b"\r\nRetry-After: 1\r\n" in a[1] for a in answers)
        for sock in stalled:
            sock.close()
        time.sleep(0.5)
        with ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(lambda _: raw(s.url, request, timeout=60), range(50)))
        statuses = [a[0] for a in answers]
        assert set(statuses) <= {200, 503} and statuses.count(200) >= 4, statuses
        assert all(b"\r\nRetry-After: 1\r\n" in body for status, body in answers if status == 503)
        status, body = raw(s.url, request)
        assert status == 200 and pid.encode() in body
    finally:
        s.close()


def test_hostile_strings_are_escaped_everywhere(served, stores):
    """Texts, tokens, words, pair ids, quarantine rows and echoed parameters are text, never markup."""
    hostile_id = f"p03{HOSTILE[0]}"
    pages = [served.get(p)[1] for p in (
        "/pairs", f"/pairs?q={q(HOSTILE[0])}", f"/pairs?reason=any&q={q(HOSTILE[1])}", f"/pair?id={q(hostile_id)}",
        f"/pair?id={q(hostile_id)}&level=word", "/tokens?min_count=1", f"/token?t={q(HOSTILE[1])}",
        f"/pair?id={q(HOSTILE[1])}", f"/pairs?q={q(HOSTILE[1])}&token={q(HOSTILE[0])}", "/pairs?sort=pair_id")]  # fmt: skip
    for page in pages:
        assert "<script" not in page and "<img" not in page and "onerror=alert(2)>" not in page
    # a template expression in a query is echoed as the text it is, never evaluated
    status, echoed, _ = served.get(f"/pairs?q={q(HOSTILE[3])}")
    assert status == 200 and "value='{{7*7}}'" in echoed and "value='49'" not in echoed
    joined = "\n".join(pages)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in joined  # shown, as text
    assert "&#34;&#39;&gt;&lt;img src=x onerror=alert(2)&gt;" in joined  # the hostile token, as text
    status, page, _ = served.get(f"/pair?id={q(hostile_id)}")
    assert status == 200 and unescape(re.search(r"<h1>Pair <code>(.*?)</code>", page).group(1)) == hostile_id
    assert hostile_id in listed_ids(served.get("/pairs?sort=pair_id&order=asc")[1])
    # a control character in a query is no HTML text: echoed as U+FFFD, the search still the one asked for
    status, page, _ = served.get("/pairs?q=cat%00%1b")
    assert status == 200 and "\x00" not in page and "\x1b" not in page and "value='cat\ufffd\ufffd'" in page


def test_sql_parameters_are_bound_not_formatted(served, stores):
    n = len(stores["data"]["pairs"])
    for attack in ("'; drop view pairs; --", "x' or '1'='1", "%", "_"):
        status, page, _ = served.get(f"/pairs?q={q(attack)}")
        assert status == 200 and count(page) == 0, attack
    assert count(served.get("/pairs")[1]) == n  # the views are still there
    status, page, _ = served.get(f"/pair?id={q(chr(39) + ' or 1=1 --')}")
    assert status == 404


# --------------------------------------------------------------------------- the pairs list against plain Python
def expected(data, keep, key, descending=True) -> list[str]:
    rows = [p for p in data["pairs"] if keep(p)]
    with_key = [p for p in rows if key(p) is not None]
    with_key.sort(key=lambda p: p["pair_id"])
    with_key.sort(key=key, reverse=descending)
    return [p["pair_id"] for p in with_key] + sorted(p["pair_id"] for p in rows if key(p) is None)


def test_search_filters_sort_and_paging_are_the_rows(served, stores):
    data = stores["data"]
    sentences = {s["sentence_id"]: s for s in data["sentences"]}
    cases = [
        ("/pairs", lambda p: True, lambda p: p["score"], True),
        ("/pairs?sort=error&order=asc", lambda p: True, lambda p: abs(p["completeness_error"]), False),
        ("/pairs?q=CAT", lambda p: "cat" in p["text_a"].lower() or "cat" in p["text_b"].lower(), lambda p: p["score"], True),
        ("/pairs?q=p07", lambda p: p["pair_id"] == "p07", lambda p: p["score"], True),
        # a part of a pair id, in any case: p10..p19
        ("/pairs?q=P1", lambda p: p["pair_id"].startswith("p1"), lambda p: p["score"], True),
        ("/pairs?token=not&sort=label", lambda p: "not" in sentences[p["sentence_id_a"]]["tokens"]
         or "not" in sentences[p["sentence_id_b"]]["tokens"], lambda p: p["label"], True),
        # the token search ignores case: "[sep]" is every pair's [SEP]
        ("/pairs?token=NOT&sort=label", lambda p: "not" in sentences[p["sentence_id_a"]]["tokens"]
         or "not" in sentences[p["sentence_id_b"]]["tokens"], lambda p: p["label"], True),
        ("/pairs?token=%5Bsep%5D", lambda p: True, lambda p: p["score"], True),
        ("/pairs?min_score=0&max_score=1.5&sort=positive", lambda p: 0 <= p["score"] <= 1.5,
         lambda p: p["positive_sum"], True),
        ("/pairs?min_label=2&max_label=3&min_error=0.01&sort=tokens&order=asc",
         lambda p: 2 <= p["label"] <= 3 and abs(p["completeness_error"]) >= 0.01,
         lambda p: p["n_tokens_a"] + p["n_tokens_b"], False),
        ("/pairs?max_negative=-1&min_sum=-0.5&sort=negative",
         lambda p: p["negative_sum"] <= -1 and p["attribution_sum"] >= -0.5, lambda p: p["negative_sum"], True),
    ]  # fmt: skip
    for path, keep, key, descending in cases:
        want = expected(data, keep, key, descending)
        assert want, path  # every case selects something
        status, first, _ = served.get(path)
        assert status == 200 and count(first) == len(want), path
        assert f"of {len(data['pairs'])} pairs match" in first
        got = every_page(served, path)
        assert got == want, path
    # pages of 10: 40 pairs are 4 pages, the last one full; the page size can be changed
    assert re.search(r"page 1 of 4\b", served.get("/pairs")[1])
    assert len(listed_ids(served.get("/pairs?size=7&page=6")[1])) == 40 - 35


def test_quarantine_rows_by_reason(served, stores):
    status, page, _ = served.get("/pairs?reason=empty_text_b")
    assert status == 200 and count(page) == 2 and "of 3 quarantined rows" in page
    assert "quarantined: empty_text_b (2)" in page and "quarantined: too_long_a (1)" in page
    assert count(served.get("/pairs?reason=any")[1]) == 3


# --------------------------------------------------------------------------- the rows of a list page as CSV
def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def csv_link(page: str) -> str:
    return unescape(re.search(r"<a class='csv' id='csv' href='([^']*)'", page).group(1))


def test_each_list_page_downloads_all_its_rows_as_csv_with_its_filters(served, stores):
    data = stores["data"]
    by_id = {p["pair_id"]: p for p in data["pairs"]}
    for path in ("/pairs", "/pairs?q=CAT&sort=label&order=asc", "/pairs?min_score=0&max_score=1.5&sort=positive",
                 "/pairs?token=not&sort=tokens"):  # fmt: skip
        _, page, _ = served.get(f"{path}{'&' if '?' in path else '?'}page=2&size=7")
        link = csv_link(page)
        assert link.startswith("/pairs.csv?") and "page=" not in link and "size=" not in link, link
        status, text, headers = served.get(link)
        assert status == 200 and headers["Content-Type"] == "text/csv; charset=utf-8"
        assert headers["Content-Disposition"] == f'attachment; filename="pairs-{stores["run"].name}.csv"'
        rows = csv_rows(text)
        assert [r["pair_id"] for r in rows] == every_page(served, path), path  # every row, in the page's order
        for r in rows:
            want = by_id[r["pair_id"]]
            assert float(r["score"]) == pytest.approx(want["score"]) and r["text_b"] == want["text_b"]
            assert float(r["negative_sum"]) == pytest.approx(want["negative_sum"])
    # the quarantined rows of a reason
    rows = csv_rows(served.get(csv_link(served.get("/pairs?reason=empty_text_b")[1]))[1])
    assert [r["row"] for r in rows] == ["1000", "1001"] and {r["reason"] for r in rows} == {"empty_text_b"}
    # the tokens, and one token's cells
    _, page, _ = served.get("/tokens?min_count=3&include_special=0&sort=mean")
    want = sqlrun.run_file(sqlrun.connect(stores["run"], variables={"min_count": 3, "include_special": False}),
                           "lexical_ranks")  # fmt: skip
    rows = csv_rows(served.get(csv_link(page))[1])
    assert [(int(r["rank"]), r["token"]) for r in rows] == list(zip(want["rank"].to_list(), want["token"].to_list()))
    cells = sorted(((c["value"], c["pair_id"]) for c in data["cells"] if c["token_a"] == c["token_b"] == "big"),
                   key=lambda x: (x[0], x[1]))  # fmt: skip
    _, page, _ = served.get("/token?t=big&order=asc")
    rows = csv_rows(served.get(csv_link(page))[1])
    assert [r["pair_id"] for r in rows] == [pid for _, pid in cells]
    np.testing.assert_allclose([float(r["value"]) for r in rows], [v for v, _ in cells])
    # bad parameters are the page's errors
    assert served.get("/pairs.csv?min_score=abc")[0] == 400 and served.get("/token.csv")[0] == 400


FORMULAS = {1: '=HYPERLINK("http://evil.example","click")', 2: "+1+cmd|' /C calc'!A0", 3: "-2+3+cmd", 4: "@SUM(A1:A9)",
            5: "\t=1+1", 6: "\r=1+1"}


def test_csv_cells_that_a_spreadsheet_would_run_are_text(tmp_path):
    run, data = make_store(tmp_path, "formulas", n_pairs=8, waves=1, text_b=FORMULAS,
                           words={7: (["=cmd", "the"], ["=cmd", "cat"])})  # fmt: skip
    s = Served(run)
    try:
        rows = {r["pair_id"]: r for r in csv_rows(s.get("/pairs.csv?sort=pair_id&order=asc")[1])}
        for p, text in FORMULAS.items():
            assert rows[data["pairs"][p]["pair_id"]]["text_b"] == "'" + text  # shown as text by a spreadsheet
        assert rows["p00"]["text_b"] == data["pairs"][0]["text_b"]  # plain text unchanged
        negative = [r["negative_sum"] for r in rows.values()]
        assert all(v.startswith("-") and float(v) < 0 for v in negative)  # numbers stay numbers
        tokens = [r["token"] for r in csv_rows(s.get("/tokens.csv?min_count=1")[1])]
        assert "'=cmd" in tokens and "=cmd" not in tokens
        cells = csv_rows(s.get("/token.csv?t=%3Dcmd")[1])
        assert [r["pair_id"] for r in cells] == ["p07"] and float(cells[0]["value"]) == pytest.approx(
            next(c["value"] for c in data["cells"] if c["pair_id"] == "p07" and c["token_a"] == c["token_b"] == "=cmd"))
    finally:
        s.close()


# --------------------------------------------------------------------------- a pair
def heatmap_values(page: str, side: str) -> list[float]:
    block = page.split(f"id='side-{side}'", 1)[1].split("<table class='data top'>", 1)[0]
    return [float(v) for v in re.findall(r"<rect class='c' [^>]*data-value='([^']+)'", block)]


def stored_matrix(data, pid: str, specials: bool = False) -> np.ndarray:
    pair = next(p for p in data["pairs"] if p["pair_id"] == pid)
    sents = {s["sentence_id"]: s for s in data["sentences"]}
    ids_a, ids_b = sents[pair["sentence_id_a"]]["word_ids"], sents[pair["sentence_id_b"]]["word_ids"]
    m = np.zeros((len(ids_a), len(ids_b)))
    for c in data["cells"]:
        if c["pair_id"] == pid:
            m[c["i"], c["j"]] = c["value"]
    rows = [i for i, w in enumerate(ids_a) if specials or w is not None]
    cols = [j for j, w in enumerate(ids_b) if specials or w is not None]
    return m[np.ix_(rows, cols)]


def test_pair_page_heatmaps_top_cells_and_difference(served, stores):
    pid = f"p03{HOSTILE[0]}"
    status, page, _ = served.get(f"/pair?id={q(pid)}")
    assert status == 200
    one, two = stored_matrix(stores["data"], pid), stored_matrix(stores["data2"], pid)
    np.testing.assert_allclose(heatmap_values(page, "run"), one.ravel(), rtol=1e-5)
    np.testing.assert_allclose(heatmap_values(page, "run2"), two.ravel(), rtol=1e-5)
    np.testing.assert_allclose(heatmap_values(page, "difference"), (two - one).ravel(), rtol=1e-5, atol=1e-9)
    # colours: centred at 0 (white), red above, blue below
    assert colour(0.0, 1.0) == "#f7f7f7" and colour(1.0, 1.0) == "#b2182b"
    assert colour(-1.0, 1.0) == "#2166ac" and colour(-5.0, 1.0) == "#2166ac"
    big = float(one.max())
    assert f"fill='{colour(big, float(np.abs(one).max()))}' data-value='{big:.6g}'" in page
    # the top positive cell of run, with its tokens
    top = page.split("id='side-run'", 1)[1].split("top positive", 1)[1]
    assert f"{big:+.4f}" in top.split("</tr>", 2)[1]
    # the specials toggle and the word level
    _, page, _ = served.get(f"/pair?id={q(pid)}&specials=1")
    np.testing.assert_allclose(heatmap_values(page, "run"), stored_matrix(stores["data"], pid, True).ravel(), rtol=1e-5)
    _, page, _ = served.get(f"/pair?id={q(pid)}&level=word")
    words = sorted((c["u"], c["v"], c["value"]) for c in stores["data"]["word_cells"] if c["pair_id"] == pid)
    np.testing.assert_allclose(heatmap_values(page, "run"), [v for _, _, v in words], rtol=1e-5)
    # pair facts
    row = next(p for p in stores["data"]["pairs"] if p["pair_id"] == pid)
    assert f"{row['score']:+.6f}" in page and f"{row['attribution_sum']:+.6f}" in page


def test_an_empty_top_table_says_none(tmp_path):
    run, data = make_store(tmp_path, "positive", n_pairs=2, waves=1, shift=1.0)  # every cell > 0
    assert all(c["value"] > 0 for c in data["cells"])
    s = Served(run)
    try:
        _, page, _ = s.get("/pair?id=p01")
        top = page.split("id='side-run'", 1)[1].split("<table class='data top'>", 1)[1].split("</table>", 1)[0]
        rows = top.split("<tbody>", 1)[1].split("</tr>")
        assert "<td colspan='2' class='none'>none</td>" in rows[0]  # top negative: none
        assert "class='num pos'" in rows[0] and top.count("class='none'") == 1  # the positive side is listed
    finally:
        s.close()


def test_heatmap_cells_are_sized_to_a_readable_minimum_and_can_be_resized(tmp_path):
    from jobs.browse.heatmap import MAX_AUTO_PX, MIN_CELL_PX, cell_size

    assert cell_size(13) == MAX_AUTO_PX and cell_size(40) >= MIN_CELL_PX and cell_size(500) == MIN_CELL_PX
    long = [f"w{k}" for k in range(38)]
    run, data = make_store(tmp_path, "long", n_pairs=2, waves=1, words={0: (long, long[::-1])})
    s = Served(run)
    try:
        _, page, _ = s.get("/pair?id=p00&specials=1")  # 40 x 40 tokens
        assert len(heatmap_values(page, "run")) == 1600
        sizes = set(re.findall(r"<rect class='c' x='\d+' y='\d+' width='(\d+)' height='\1'", page))
        assert len(sizes) == 1 and int(sizes.pop()) == cell_size(40) >= MIN_CELL_PX
        _, page, _ = s.get("/pair?id=p00&cell=40")
        assert set(re.findall(r"<rect class='c' [^>]*width='(\d+)'", page)) == {"40"}
        assert "?id=p00&amp;cell=26'>smaller" in page and "?id=p00&amp;cell=60'>larger" in page
        assert s.get("/pair?id=p00&cell=1000")[0] == 400
    finally:
        s.close()


def test_pair_page_reads_its_wave_and_its_sql_runs_in_xsbert_sql(served, stores, capsys):
    pid = stores["data"]["pairs"][-1]["pair_id"]  # in wave 1
    _, page, _ = served.get(f"/pair?id={pid}")
    assert "read from the parts of wave 1 (cells/part-000001*.parquet)" in page
    commands = [unescape(c) for c in re.findall(r"<pre class='cmd'>(.*?)</pre>", page, re.DOTALL)]
    cells_cmd = next(c for c in commands if "from cells " in c and "--run2" not in c)
    import shlex

    argv = shlex.split(cells_cmd)
    assert argv[:4] == ["xsbert", "sql", "--run", str(stores["run"])]
    assert cli.main([*argv[1:], "--csv"]) == 0
    got = pl.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    want = sorted((c["i"], c["j"], c["value"]) for c in stores["data"]["cells"] if c["pair_id"] == pid)
    np.testing.assert_allclose(np.array(sorted(zip(got["i"], got["j"], got["value"]))), np.array(want), rtol=1e-9)


def test_a_store_without_wave_parts_is_read_whole(tmp_path):
    run, data = make_store(tmp_path, "flat", n_pairs=6, waves=1)
    for table in ("pairs", "cells", "word_cells", "sentences"):
        for part in (run / table).glob("*.parquet"):
            part.rename(part.with_name(f"data-{table}.parquet"))
    s = Served(run)
    try:
        _, page, _ = s.get("/pair?id=p04")
        assert "read from the parts of wave" not in page
        np.testing.assert_allclose(heatmap_values(page, "run"), stored_matrix(data, "p04").ravel(), rtol=1e-5)
    finally:
        s.close()


# --------------------------------------------------------------------------- tokens
def test_tokens_page_is_lexical_ranks_sql_and_links_the_pairs(served, stores):
    want = sqlrun.run_file(sqlrun.connect(stores["run"], variables={"min_count": 3}), "lexical_ranks")
    status, page, _ = served.get("/tokens?min_count=3&size=500")
    assert status == 200 and count(page) == want.height
    rows = re.findall(r"<tr class='token'><td class='num'>(\d+)</td><td><a href='/token\?t=([^']*)'>", page)
    assert [(int(r), unescape(urllib.parse.unquote_plus(t))) for r, t in rows] == list(
        zip(want["rank"].to_list(), want["token"].to_list()))
    assert "xsbert sql --run" in page and "-f lexical_ranks --var min_count=3 --var include_special=true" in page
    # without the special tokens
    want = sqlrun.run_file(sqlrun.connect(stores["run"], variables={"min_count": 3, "include_special": False}),
                         "lexical_ranks")  # fmt: skip
    assert count(served.get("/tokens?min_count=3&include_special=0")[1]) == want.height
    # without parameters, the file's own defaults (jobs.sqlfiles.default)
    page = served.get("/tokens")[1]
    assert count(page) == sqlrun.run_file(sqlrun.connect(stores["run"]), "lexical_ranks").height
    assert "--var min_count=30 --var include_special=true" in page
    # a token's cells, largest first, each linked to its pair
    cells = sorted(((c["value"], c["pair_id"]) for c in stores["data"]["cells"]
                    if c["token_a"] == c["token_b"] == "big"), key=lambda x: (-x[0], x[1]))  # fmt: skip
    status, page, _ = served.get("/token?t=big&size=500")
    assert status == 200 and count(page) == len(cells)
    assert listed_ids(page) == [pid for _, pid in cells]


# --------------------------------------------------------------------------- runs that cannot be served
def test_missing_and_half_written_runs_are_one_line(tmp_path, capsys):
    run, _ = make_store(tmp_path, "whole", n_pairs=4, waves=1)
    cases = {}
    cases["missing"] = (tmp_path / "nope", "no such directory")
    bare, _ = make_store(tmp_path, "no-manifest", n_pairs=4, waves=1, manifest=False)
    cases["no manifest"] = (bare, "no manifest.json: a half-written run")
    no_cells, _ = make_store(tmp_path, "no-cells", n_pairs=4, waves=1)
    for part in (no_cells / "cells").glob("*.parquet"):
        part.unlink()
    cases["no cells"] = (no_cells, "no cells/*.parquet: a half-written run")
    torn, _ = make_store(tmp_path, "torn", n_pairs=4, waves=1)
    part = next((torn / "cells").glob("*.parquet"))
    part.write_bytes(part.read_bytes()[:100])
    cases["torn part"] = (torn, "its cells table cannot be read (Invalid Input Error: No magic bytes found at end of file")
    short, _ = make_store(tmp_path, "short", n_pairs=4, waves=2)
    next((short / "pairs").glob("part-000001*.parquet")).unlink()
    cases["parts missing"] = (short, "manifest.json lists 4 pairs but pairs/ holds 2")
    for name, (path, text) in cases.items():
        with pytest.raises(InputError, match=re.escape(text)):
            serve.App(path)
        assert cli.main(["serve", "--run", str(path), "--port", "0"]) == 2, name
        err = capsys.readouterr().err.strip()
        assert err.startswith("xsbert serve: error: ") and text in err and len(err.splitlines()) == 1, (name, err)
    assert cli.main(["serve", "--run", str(run), "--run2", str(tmp_path / "nope"), "--port", "0"]) == 2
    assert "--run2" in capsys.readouterr().err
    serve.App(run)  # the whole one opens


def test_a_port_in_use_is_one_line(stores, capsys):
    """The port taken: one line and exit 2 (it was a traceback, the server's half-made pool closed before it was
    made, then an abort from the app's background DuckDB build at exit)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--run", str(stores["run"]), "--port", str(port), "-q"]) == 2
    err = capsys.readouterr().err
    assert err == f"xsbert serve: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


# --------------------------------------------------------------------------- xsbert show
def test_show_prints_the_stored_pair_as_explain_does(stores, tmp_path, capsys):
    pid = "p00"
    assert cli.main(["show", "--run", str(stores["run"]), "--pair", pid, "--words", "--top", "3",
                     "--png", str(tmp_path / "p.png")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    row = next(p for p in stores["data"]["pairs"] if p["pair_id"] == pid)
    lines = out.splitlines()
    assert lines[0] == "model hand-built  layer 3/6  approx  cos  riemann N=2"
    assert lines[1] == f"a: {row['text_a']}" and lines[2] == f"b: {row['text_b']}"
    assert lines[3] == f"score f(a,b)          {row['score']:+.6f}"
    assert f"sum of attributions   {row['attribution_sum']:+.6f}" in lines[4]
    full = stored_matrix(stores["data"], pid, specials=True)
    tokens = ["[CLS]", "the", "cat", "is", "not", "big", "[SEP]"]
    flat = np.argsort(-np.abs(full), axis=None)[:3]
    top = lines[lines.index("top 3 token pairs:") + 1:][:3]
    for line, (i, j) in zip(top, zip(*np.unravel_index(flat, full.shape))):
        assert line.split()[0] == f"{full[i, j]:+.4f}" and line.split()[1] == tokens[i]
    assert "top 3 word pairs (mean over tokens):" in out and f"wrote {tmp_path / 'p.png'}" in out
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["show", "--run", str(stores["run"]), "--pair", "q1"]) == 2
    assert "no such pair" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert cli.main(["show", "--run", str(stores["run"]), "--pair", pid, "--png", str(tmp_path / "a-file" / "p")]) == 2
    err = capsys.readouterr().err
    assert err == f"xsbert show: error: --png {tmp_path}/a-file/p: cannot write there (Not a directory)\n"


@pytest.mark.slow
def test_show_equals_explain_on_a_real_run(real_runs, capsys):
    """The store's view of a pair (xsbert show) is what xsbert explain computes again with the run's settings."""
    run = real_runs["stsb"]
    con = sqlrun.connect(run)
    pid, text_a, text_b = con.sql("select pair_id, text_a, text_b from pairs order by pair_id limit 1").fetchall()[0]
    assert cli.main(["show", "--run", str(run), "--pair", pid, "--words"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert cli.main(["explain", text_a, text_b, "--layer", "-1", "--steps", "2", "--words"]) == 0
    explained = capsys.readouterr().out.splitlines()
    assert len(shown) == len(explained)
    number = re.compile(r"[-+]?\d+\.\d+(?:e[-+]\d+)?")
    for a, b in zip(shown, explained):
        assert number.sub("#", a) == number.sub("#", b), (a, b)  # the same words, tokens and order
        for x, y in zip(number.findall(a), number.findall(b)):
            assert float(x) == pytest.approx(float(y), abs=2e-4 if "e" not in x else 1e-5), (a, b)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    from test_sql import make_real_runs

    return make_real_runs(tmp_path_factory)


# --------------------------------------------------------------------------- the report links into serve
def test_the_report_links_its_sections_and_examples_into_serve(stores, served, tmp_path):
    """Each link names its run (run=<id>): the server of that run answers it; one of another run says which run the
    link is for (404), where it answered with its own run's pairs before."""
    from jobs import report

    assert report.cli(["--run", str(stores["run"]), "--out", str(tmp_path / "r"), "--var", "min_count=3", "-q"]) == 0
    page = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    run_id = json.loads((tmp_path / "r" / "report.json").read_text())["run"]["run_id"]
    assert f"href='http://127.0.0.1:8000/tokens?run={run_id}'>Browse the pairs behind it</a>" in page
    examples = json.loads((tmp_path / "r" / "report.json").read_text())["sections"][-1]["findings"]
    links = re.findall(r"href='http://127.0.0.1:8000(/[^']*)'", page)
    for f in examples:
        link = f"/pair?id={q(f['values']['pair_id'])}&amp;run={run_id}"
        assert link in links
        status, _, _ = served.get(unescape(link))
        assert status == 200
    assert links and all(f"run={run_id}" in link for link in links)
    assert f"xsbert serve --run {stores['run']}" in page
    for path in ("/pairs?sort=score&run=0123456789abcdef", "/tokens?run=0123456789abcdef",
                 "/pairs.csv?run=0123456789abcdef"):  # fmt: skip
        status, body, _ = served.get(path)
        assert status == 404 and "this link is for run 0123456789abcdef, and this server serves run " in body, path
        assert f"serves run {run_id} and " in body
    assert report.cli(["--run", str(stores["run"]), "--out", str(tmp_path / "r2"), "--serve-url", "none", "-q"]) == 0
    assert "xsbert serve" not in (tmp_path / "r2" / "index.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- what a person sees (Chromium)
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary: Debian's `chromium` package (.ci/run installs it)")
def test_in_chromium_the_heatmap_is_drawn_and_the_search_narrows_the_list(served, stores):
    from io import BytesIO

    from PIL import Image

    data = stores["data"]
    with Chromium(1400, 1000) as browser:
        browser.goto(served.url + "/pairs")
        assert browser.eval("document.querySelectorAll('tr.pair').length") == 10
        assert browser.eval("document.getElementById('count').innerText").startswith("40 of 40 pairs match")
        # type a word into the search box and press Enter, as a person does
        browser.type_into("input[name=q]", "dog")
        browser.press_enter()
        want = [p for p in data["pairs"] if "dog" in p["text_a"].lower() or "dog" in p["text_b"].lower()]
        assert 0 < len(want) < 40
        text = browser.eval("document.getElementById('count').innerText")
        assert text.startswith(f"{len(want)} of 40 pairs match"), text
        rows = browser.eval("[...document.querySelectorAll('tr.pair')].map(r => r.innerText.toLowerCase())")
        assert len(rows) == min(10, len(want)) and all("dog" in r for r in rows)
        assert browser.eval("document.querySelector('input[name=q]').value") == "dog"
        # a hostile text is shown as text and ran nothing
        browser.goto(served.url + f"/pairs?q={q('<script>')}")
        assert browser.eval("document.querySelectorAll('script').length") == 0
        assert HOSTILE[0] in browser.eval("document.body.innerText")
        # follow the first pair's link: its heatmap is drawn, cells coloured by value
        browser.goto(served.url + "/pair?id=p00")
        pid_matrix = stored_matrix(data, "p00")
        rects = browser.eval("""[...document.querySelectorAll('#side-run svg rect.c')].map(r => {
            const b = r.getBoundingClientRect(); return [b.width, b.height, r.getAttribute('fill'),
            r.querySelector('title').textContent]; })""")
        assert len(rects) == pid_matrix.size and all(w > 5 and h > 5 for w, h, _, _ in rects)
        assert rects[0][3] == f"the × {pid_matrix_label(data, 'p00')}: {pid_matrix[0, 0]:+.5f}"
        # on screen: red where the largest cell is, blue where the most negative is
        browser.eval("document.querySelector('#side-run svg').scrollIntoView()")
        shot = Image.open(BytesIO(browser.screenshot())).convert("RGB")
        for k, want_red in ((int(np.argmax(pid_matrix)), True), (int(np.argmin(pid_matrix)), False)):
            box = browser.eval(f"""(b => [b.x + b.width / 2, b.y + b.height / 2])(
                document.querySelectorAll('#side-run svg rect.c')[{k}].getBoundingClientRect())""")
            r, g, b = shot.getpixel((int(box[0]), int(box[1])))
            assert (r > b + 60) if want_red else (b > r + 60), (k, (r, g, b))


def pid_matrix_label(data, pid: str) -> str:
    pair = next(p for p in data["pairs"] if p["pair_id"] == pid)
    sent = next(s for s in data["sentences"] if s["sentence_id"] == pair["sentence_id_b"])
    return sent["tokens"][1]


@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary: Debian's `chromium` package (.ci/run installs it)")
def test_in_chromium_a_40_by_40_heatmap_is_readable_and_scrolls_in_its_box(tmp_path):
    long = [f"word{k}" for k in range(38)]
    run, _ = make_store(tmp_path, "long", n_pairs=2, waves=1, words={0: (long, long[::-1])})
    s = Served(run)
    try:
        with Chromium(900, 900) as browser:
            browser.goto(s.url + "/pair?id=p00&specials=1")
            boxes = browser.eval("""[...document.querySelectorAll('#side-run svg rect.c')].map(r => {
                const b = r.getBoundingClientRect(); return [b.width, b.height]; })""")
            assert len(boxes) == 1600 and min(min(b) for b in boxes) >= 20  # drawn at least 20 px a side
            labels = browser.eval("""[...document.querySelectorAll('#side-run svg g text[text-anchor=end]')].map(t => {
                const b = t.getBoundingClientRect(); return [b.top, b.bottom]; })""")
            assert len(labels) == 40
            assert all(b[0] >= a[1] - 0.5 for a, b in zip(labels, labels[1:]))  # row labels do not overlap
            # the map scrolls inside its box; the page itself does not scroll sideways
            box = browser.eval("(e => [e.scrollWidth, e.clientWidth])(document.querySelector('#side-run .heatmap'))")
            assert box[0] > box[1]
            assert browser.eval("document.documentElement.scrollWidth <= window.innerWidth + 1")
    finally:
        s.close()
