"""sql/negation_signs.sql (Fig 8's count, each sign clear of its completeness error, with intervals) and
sql/syntactic_relations_pairs.sql (Fig 6's shares per pair, with bootstrap intervals), each against a slow,
obviously correct computation of the same thing in plain Python: the sign at the smallest clear N by a loop over the
runs' rows, the exact binomial interval from scipy, and the bootstrap by drawing the same clusters with a Python
copy of the files' hash and taking numpy's percentiles."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats
from test_sql import (
    SQL,
    make_run,
    negation_run,
    random_parses,
    random_run,
    records,
    relations_run,
    run_sql,
    sentence,
    write_table,
)

from jobs import sqlrun
from xsbert_core import InputError


# --------------------------------------------------------------------------- the slow references
def lowbias32(x: int) -> int:
    """C. Wellons' 32-bit integer hash, as the files' xs_hash macro computes it."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def draws(seed: int, resamples: int, n: int) -> list[list[int]]:
    """The cluster indices of each resample: resample b hashes (seed * 2654435769 + b), its d-th draw
    (that hash + d), scaled to [0, n)."""
    out = []
    for b in range(resamples):
        h = lowbias32((seed * 2654435769 + b) % 2**32)
        out.append([(lowbias32((h + d) % 2**32) * n) >> 32 for d in range(n)])
    return out


def percentile_interval(values: list[float]) -> tuple[float, float]:
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def macro(name: str, file: str) -> str:
    text = (SQL / file).read_text(encoding="utf-8")
    found = re.search(rf"^create or replace temp macro {name}\(.*?;$", text, re.M | re.S)
    assert found, (file, name)
    return found.group(0)


def test_the_shared_logic_is_read_from_sql_lib():
    """negation_signs.sql finds the negation pairs with negation.sql's macro, syntactic_relations_pairs.sql takes
    the top cells with syntactic_relations.sql's, and the two interval files draw with the same hash: each is one
    file of sql/lib/ that both read (tests/test_sql.py checks that no file keeps a copy)."""
    reads = {name: [line for line in (SQL / name).read_text(encoding="utf-8").splitlines() if line.startswith(".read")]
             for name in ("negation.sql", "negation_signs.sql", "syntactic_relations.sql",
                          "syntactic_relations_pairs.sql")}  # fmt: skip
    assert ".read sql/lib/negation_pairs.sql" in reads["negation.sql"] and \
        ".read sql/lib/negation_pairs.sql" in reads["negation_signs.sql"]  # fmt: skip
    assert ".read sql/lib/syntactic_top_cells.sql" in reads["syntactic_relations.sql"] and \
        ".read sql/lib/syntactic_top_cells.sql" in reads["syntactic_relations_pairs.sql"]  # fmt: skip
    for name in ("negation_signs.sql", "syntactic_relations_pairs.sql"):
        assert ".read sql/lib/resample.sql" in reads[name], name
    for name in ("xs_hash_step", "xs_hash", "xs_resample_hash", "xs_draw"):
        assert macro(name, "lib/resample.sql"), name


def test_the_hash_is_lowbias32_and_its_draws_cover_the_clusters():
    con = duckdb.connect()
    for name in ("xs_hash_step", "xs_hash", "xs_resample_hash", "xs_draw"):
        con.execute(macro(name, "lib/resample.sql"))
    xs = [0, 1, 2, 12345, 2**31, 2**32 - 1]
    assert [con.sql(f"select xs_hash({x}::ubigint)").fetchall()[0][0] for x in xs] == [lowbias32(x) for x in xs]
    got = con.sql("select b, d, xs_draw(xs_resample_hash(7, b), d, 13) as k from range(5) t(b), range(13) u(d) "
                  "order by b, d").fetchall()  # fmt: skip
    assert [k for _, _, k in got] == [k for row in draws(7, 5, 13) for k in row]
    many = draws(0, 400, 10)
    assert {k for row in many for k in row} == set(range(10))  # every cluster gets drawn
    counts = np.bincount([k for row in many for k in row], minlength=10)
    assert counts.min() > 300 and counts.max() < 500  # 4,000 draws, about 400 each


def test_the_binomial_interval_is_scipys_exact_one():
    con = duckdb.connect()
    for name in ("xs_binomial_tail", "xs_binomial_low", "xs_binomial_high"):
        con.execute(macro(name, "negation_signs.sql"))
    for k, n in ((13, 80), (10, 80), (0, 80), (80, 80), (1, 1), (0, 1), (21, 23), (0, 19), (392, 1379)):
        low, high = con.sql(f"select xs_binomial_low({k}, {n}), xs_binomial_high({k}, {n})").fetchall()[0]
        ci = stats.binomtest(k, n).proportion_ci(method="exact")
        assert low == pytest.approx(ci.low, abs=1e-9) and high == pytest.approx(ci.high, abs=1e-9), (k, n)
    assert con.sql("select xs_binomial_low(0, 0), xs_binomial_high(0, 0)").fetchall()[0] == (None, None)


# --------------------------------------------------------------------------- negation_signs.sql
def negation_pair_rows(k: int) -> tuple[str, list[str], list[str]]:
    """Pair k of a negation run whose ids follow --dataset negation: an STS-B id and the side (:1 / :2), two
    pairs per STS-B pair (clusters of two)."""
    words = [f"w{k}", "is", "not", "good", "."]
    return f"MSRpar:2012test:{k // 2:04d}:{k % 2 + 1}", words, [w for w in words if w != "not"]


def negation_runs(root: Path, n_pairs: int, steps: tuple[int, ...], rng: np.random.Generator,
                  only: dict[int, set[int]] | None = None) -> tuple[list[Path], dict[int, dict[str, dict]]]:  # fmt: skip
    """One run per N of the same negation pairs (side a has the not): every token cell random, the not-word's row
    a random total that moves a little with N, and a completeness error that shrinks with N. `only[N]`: the pair
    numbers that run holds (a run of the pairs left unclear, say). Returns the runs and, per N and pair id, the
    row the reference reads: not total (the not token's row against every token of b), error, score, sum."""
    base = rng.normal(0.02, 0.05, n_pairs)
    runs, truth = [], {}
    for n in steps:
        pairs, sents, cells, word_cells, truth[n] = [], [], [], [], {}
        for k in range(n_pairs):
            if only and n in only and k not in only[n]:
                continue
            pid, wa, wb = negation_pair_rows(k)
            sa, sb = sentence(f"{pid}a", wa), sentence(f"{pid}b", wb)
            sents += [sa, sb]
            total = float(base[k] + rng.normal(0, 0.2 / n))
            err = float(rng.normal(0, 0.4 / n))
            score = float(rng.uniform(0.3, 0.9))
            row_cells = rng.normal(0, 0.01, (len(sa["tokens"]), len(sb["tokens"])))
            not_row = wa.index("not") + 1
            row_cells[not_row] += (total - row_cells[not_row].sum()) / row_cells.shape[1]  # the row sums to total
            cells += [{"pair_id": pid, "i": i, "j": j, "value": float(row_cells[i, j])}
                      for i in range(row_cells.shape[0]) for j in range(row_cells.shape[1])]  # fmt: skip
            word_cells += [{"pair_id": pid, "u": i - 1, "v": j - 1, "value": float(row_cells[i, j])}
                           for i in range(1, row_cells.shape[0] - 1) for j in range(1, row_cells.shape[1] - 1)]
            attribution_sum = float(row_cells.sum())
            pairs.append({"pair_id": pid, "text_a": " ".join(wa), "text_b": " ".join(wb), "sentence_id_a": sa[
                "sentence_id"], "sentence_id_b": sb["sentence_id"], "score": score, "attribution_sum": attribution_sum,
                "completeness_error": err, "steps_a": n, "steps_b": n})  # fmt: skip
            truth[n][pid] = {"not": float(row_cells[not_row].sum()), "err": err, "score": score,
                             "sum": attribution_sum}  # fmt: skip
        runs.append(make_run(root, f"N{n}", pairs, cells=cells, word_cells=word_cells, sentences=sents))
    return runs, truth


def slow_signs(truth: dict[int, dict[str, dict]], margin: float) -> dict[str, dict[str, Any]]:
    """Per pair: the value at the smallest N whose |error| < margin x |not| (None: no such N)."""
    out = {}
    for pid in sorted({p for rows in truth.values() for p in rows}):
        chosen = None
        for n in sorted(truth):
            row = truth[n].get(pid)
            if row is not None and abs(row["err"]) < margin * abs(row["not"]):
                chosen = {"N": n, **row}
                break
        signs = {np.sign(truth[n][pid]["not"]) for n in truth if pid in truth[n]}
        out[pid] = {"chosen": chosen, "unstable": len(signs) > 1, "n_runs": sum(pid in truth[n] for n in truth)}
    return out


def connect_runs(runs: list[Path], **variables: Any) -> duckdb.DuckDBPyConnection:
    return sqlrun.connect(runs[0], None, {"other_runs": [str(r) for r in runs[1:]], **variables})


def test_negation_signs_take_each_sign_at_the_smallest_clear_n(tmp_path):
    rng = np.random.default_rng(3)
    runs, truth = negation_runs(tmp_path, 24, (8, 16, 32), rng)
    margin = 0.1
    df = sqlrun.run_file(connect_runs([runs[2], runs[0], runs[1]], resamples=300), SQL / "negation_signs.sql")
    expected = slow_signs(truth, margin)
    got = records(df, "pair_id")
    assert set(got) == set(expected) and df["pair_id"].to_list() == sorted(expected)
    for pid, want in expected.items():
        row, chosen = got[pid], want["chosen"]
        assert row["n_runs"] == 3 and row["steps"] == [8, 16, 32] and row["is_sign_unstable"] == want["unstable"]
        assert row["not_attributions"] == pytest.approx([truth[n][pid]["not"] for n in (8, 16, 32)])
        assert row["is_clear"] == (chosen is not None)
        if chosen is None:
            assert row["chosen_steps"] is None and row["is_negative"] is None and row["not_attribution"] is None
            continue
        assert row["chosen_steps"] == chosen["N"] and row["is_negative"] == (chosen["not"] < 0)
        assert row["not_attribution"] == pytest.approx(chosen["not"])
        assert row["completeness_error"] == pytest.approx(chosen["err"])
        assert row["relative"] == pytest.approx(chosen["not"] / chosen["score"])
        assert row["relative_plus_one"] == pytest.approx(chosen["not"] / (chosen["score"] + 1))
        assert row["relative_to_sum"] == pytest.approx(chosen["not"] / chosen["sum"])
    clear = [w["chosen"] for w in expected.values() if w["chosen"]]
    k, n = sum(c["not"] < 0 for c in clear), len(clear)
    first = df.row(0, named=True)
    assert 0 < n < 24 and 0 < k < n  # the fixture has clear and unclear pairs, negative and positive ones
    assert (first["n_pairs"], first["n_clear"], first["n_not_clear"], first["n_negative"]) == (24, n, 24 - n, k)
    assert first["n_pairs"] == first["n_clear"] + first["n_not_clear"]  # every pair accounted for
    assert first["share_negative"] == pytest.approx(k / n)
    ci = stats.binomtest(k, n).proportion_ci(method="exact")
    assert (first["ci_low"], first["ci_high"]) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert first["n_unstable"] == sum(w["unstable"] for w in expected.values())
    for column, of in (("relative", lambda c: c["not"] / c["score"]),
                       ("relative_plus_one", lambda c: c["not"] / (c["score"] + 1)),
                       ("relative_to_sum", lambda c: c["not"] / c["sum"])):  # fmt: skip
        assert first[f"p90_abs_{column}"] == pytest.approx(np.percentile([abs(of(c)) for c in clear], 90))

    # The bootstrap over the STS-B pairs (clusters of the two sides), drawn as the file draws them.
    cluster_of = {pid: pid.rsplit(":", 1)[0] for pid in expected}
    clusters = sorted({cluster_of[p] for p, w in expected.items() if w["chosen"]})
    tally = {c: [0, 0] for c in clusters}  # clear, negative
    for pid, w in expected.items():
        if w["chosen"]:
            tally[cluster_of[pid]][0] += 1
            tally[cluster_of[pid]][1] += w["chosen"]["not"] < 0
    shares = [sum(tally[clusters[i]][1] for i in row) / sum(tally[clusters[i]][0] for i in row)
              for row in draws(0, 300, len(clusters))]  # fmt: skip
    assert first["n_clusters"] == len(clusters) and first["resamples"] == 300
    assert (first["boot_low"], first["boot_high"]) == pytest.approx(percentile_interval(shares))
    assert {r["cluster_id"] for r in df.iter_rows(named=True)} == set(cluster_of.values())


def test_negation_signs_read_a_run_of_the_unclear_pairs_only(tmp_path):
    """The pairs left unclear at N = 8, attributed again at 16 and 32 (runs of those pairs only), as a user reruns
    them; a pair counts the runs that hold it."""
    rng = np.random.default_rng(5)
    first_runs, first = negation_runs(tmp_path / "a", 16, (8,), rng)
    unclear = {int(pid.split(":")[2]) * 2 + int(pid[-1]) - 1 for pid, w in slow_signs(first, 0.1).items()
               if w["chosen"] is None}  # fmt: skip
    assert unclear
    rng2 = np.random.default_rng(5)  # the same base values, then the later N's noise
    more_runs, more = negation_runs(tmp_path / "b", 16, (8, 16, 32), rng2, only={16: unclear, 32: unclear})
    truth = {8: first[8], 16: more[16], 32: more[32]}
    df = sqlrun.run_file(connect_runs([first_runs[0], *more_runs[1:]], resamples=50), SQL / "negation_signs.sql")
    expected = slow_signs(truth, 0.1)
    got = records(df, "pair_id")
    for pid, want in expected.items():
        assert got[pid]["n_runs"] == want["n_runs"]
        assert got[pid]["chosen_steps"] == (want["chosen"] or {}).get("N")
    # a run given twice is read once
    again = sqlrun.run_file(connect_runs([first_runs[0], *more_runs[1:], first_runs[0]], resamples=50),
                            SQL / "negation_signs.sql")  # fmt: skip
    assert again.equals(df)


def test_negation_signs_margin_cluster_and_definition_settings(tmp_path):
    rng = np.random.default_rng(11)
    runs, truth = negation_runs(tmp_path, 12, (8, 16), rng)
    loose = sqlrun.run_file(connect_runs(runs, margin=0.5, resamples=20), SQL / "negation_signs.sql")
    expected = slow_signs(truth, 0.5)
    assert {r["pair_id"]: r["chosen_steps"] for r in loose.iter_rows(named=True)} == {
        p: (w["chosen"] or {}).get("N") for p, w in expected.items()}
    by_pair = sqlrun.run_file(connect_runs(runs, sign_clusters="pair", resamples=20), SQL / "negation_signs.sql")
    assert by_pair["cluster_id"].to_list() == by_pair["pair_id"].to_list()
    words = sqlrun.run_file(connect_runs(runs, definition="word_cells", resamples=20), SQL / "negation_signs.sql")
    assert set(words["definition"]) == {"word_cells"}
    with pytest.raises(duckdb.Error, match="sign_clusters must be source or pair"):
        sqlrun.run_file(connect_runs(runs, sign_clusters="triplet"), SQL / "negation_signs.sql")


def test_negation_signs_refuse_runs_of_other_settings_or_without_cells(tmp_path):
    rng = np.random.default_rng(2)
    runs, _ = negation_runs(tmp_path, 4, (8, 16), rng)
    manifest = runs[1] / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"layer": 3', '"layer": 4'))
    with pytest.raises(duckdb.Error, match="must share model, mode, similarity and layer"):
        sqlrun.run_file(connect_runs(runs), SQL / "negation_signs.sql")
    manifest.write_text(manifest.read_text().replace('"layer": 4', '"layer": 3, "cells": "same-token"'))
    with pytest.raises(duckdb.Error, match="negation_signs.sql needs every cell; run .*N16 stores --cells same-token"):
        sqlrun.run_file(connect_runs(runs), SQL / "negation_signs.sql")
    with pytest.raises(InputError, match="--var other_runs .*no such directory"):
        sqlrun.connect(runs[0], None, {"other_runs": f"{runs[1]},{tmp_path / 'missing'}"})


def test_negation_signs_of_one_run_count_the_signs_clear_at_its_n(tmp_path):
    """One run: the sign of each pair at that run's N where clear; as negation.sql's values."""
    rng = np.random.default_rng(4)
    runs, truth = negation_runs(tmp_path, 10, (16,), rng)
    df = run_sql(runs[0], "negation_signs.sql", resamples=20)
    neg = records(run_sql(runs[0], "negation.sql"), "pair_id")
    for row in df.iter_rows(named=True):
        clear = abs(truth[16][row["pair_id"]]["err"]) < 0.1 * abs(neg[row["pair_id"]]["not_attribution"])
        assert row["is_clear"] == clear and row["n_runs"] == 1
        if clear:
            assert row["not_attribution"] == pytest.approx(neg[row["pair_id"]]["not_attribution"])


def test_negation_signs_on_the_planted_negation_store(tmp_path):
    """negation.sql's planted store (N = 16, errors of a few 1e-3): n6's not-word cells were pruned, its total is 0
    and no error is below a tenth of it: not counted; the other three are clear, n1 negative."""
    run = negation_run(tmp_path)
    df = run_sql(run, "negation_signs.sql", resamples=50)
    assert df["pair_id"].to_list() == ["n1", "n2", "n4", "n6"]
    assert df["is_clear"].to_list() == [True, True, True, False] and df["chosen_steps"].to_list() == [16, 16, 16, None]
    first = df.row(0, named=True)
    assert (first["n_clear"], first["n_not_clear"], first["n_negative"]) == (3, 1, 1)
    neg = records(run_sql(run, "negation.sql"), "pair_id")
    assert df["not_attribution"].to_list()[:3] == pytest.approx([neg[p]["not_attribution"] for p in ("n1", "n2", "n4")])

    # A store without completeness errors (made before they were recorded): nothing is clear, nothing counted,
    # the share and its intervals null rather than an error.
    table = pq.read_table(run / "pairs" / "part-000000.parquet")
    table = table.set_column(table.schema.get_field_index("completeness_error"), "completeness_error",
                             pa.nulls(table.num_rows, pa.float64()))  # fmt: skip
    pq.write_table(table, run / "pairs" / "part-000000.parquet")
    first = run_sql(run, "negation_signs.sql", resamples=50).row(0, named=True)
    assert (first["n_clear"], first["n_not_clear"]) == (0, 4)
    assert first["share_negative"] is None and first["ci_low"] is None and first["boot_low"] is None


def test_xsbert_sql_takes_other_runs_comma_separated(tmp_path, capsys):
    from jobs.cli import main as xsbert

    rng = np.random.default_rng(6)
    runs, _ = negation_runs(tmp_path, 6, (8, 16), rng)
    code = xsbert(["sql", "--run", str(runs[0]), "-f", "negation_signs", "--var", f"other_runs={runs[1]}",
                   "--var", "resamples=10", "--csv"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and out.splitlines()[0].startswith("pair_id,cluster_id") and len(out.splitlines()) == 7
    assert "[8, 16]" in out  # the list of N, as JSON text


# --------------------------------------------------------------------------- syntactic_relations_pairs.sql
def slow_pair_counts(run: Path, top_share: float) -> dict[str, dict[str, int]]:
    """Per pair, its top cells as syntactic_relations.sql's slow test takes them (the k largest word cells, ties by
    the smaller u, then v), labelled by the parses (unaligned / unparsed as the file says)."""
    tables = {t: pq.read_table(run / t).to_pylist() for t in ("pairs", "sentences", "word_cells", "parses")}
    words = {s["sentence_id"]: s["n_words"] for s in tables["sentences"]}
    deprel: dict[tuple[str, int], str] = {}
    parsed = {p["sentence_id"] for p in tables["parses"]}
    for p in tables["parses"]:
        deprel[(p["sentence_id"], p["u"])] = p["deprel"] or "unaligned"
    out = {}
    for pair in tables["pairs"]:
        cells = [c for c in tables["word_cells"] if c["pair_id"] == pair["pair_id"]]
        if not cells:
            continue
        k = max(1, int(np.ceil(top_share * words[pair["sentence_id_a"]] * words[pair["sentence_id_b"]])))
        top = sorted(cells, key=lambda c: (-c["value"], c["u"], c["v"]))[:k]
        counts = {"n_top": 0, "n_nsubj": 0, "n_same": 0, "n_parsed": 0}
        for c in top:
            rel = [deprel.get((sid, w), "unaligned") if sid in parsed else "unparsed"
                   for sid, w in ((pair["sentence_id_a"], c["u"]), (pair["sentence_id_b"], c["v"]))]  # fmt: skip
            real = all(r not in ("unaligned", "unparsed") for r in rel)
            counts["n_top"] += 1
            counts["n_nsubj"] += rel == ["nsubj", "nsubj"]
            counts["n_same"] += real and rel[0] == rel[1]
            counts["n_parsed"] += real
        out[pair["pair_id"]] = counts
    return out


def slow_components(run: Path, pair_ids: set[str]) -> dict[str, str]:
    """Pairs linked through shared sentences (union-find): pair -> the smallest pair id of its component."""
    pairs = [p for p in pq.read_table(run / "pairs").to_pylist() if p["pair_id"] in pair_ids]
    parent = {p["pair_id"]: p["pair_id"] for p in pairs}

    def find(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    by_sentence: dict[str, list[str]] = {}
    for p in pairs:
        for sid in {p["sentence_id_a"], p["sentence_id_b"]}:
            by_sentence.setdefault(sid, []).append(p["pair_id"])
    for members in by_sentence.values():
        for other in members[1:]:
            a, b = sorted((find(members[0]), find(other)))
            parent[b] = a
    return {p: min(q for q in parent if find(q) == find(p)) for p in parent}


SHARES = {"nsubj_share": ("n_nsubj", "n_top"), "nsubj_share_of_parsed": ("n_nsubj", "n_parsed"),
          "same_function_share": ("n_same", "n_top"), "same_share_of_parsed": ("n_same", "n_parsed"),
          "unaligned_share": ("n_unaligned", "n_top")}  # fmt: skip


def shared_sentence_run(root: Path) -> Path:
    """random_run's pairs, some of them sharing a sentence (pair 2k+1 takes pair 2k's sentence a, and pair 9 pair
    3's b), with random parses: clusters of one, two and more pairs."""
    rng = np.random.default_rng(9)
    run, data = random_run(root, "r", rng, n_pairs=16)
    pairs = data["pairs"]
    for k in range(0, 12, 2):
        pairs[k + 1]["sentence_id_a"] = pairs[k]["sentence_id_a"]
    pairs[9]["sentence_id_b"] = pairs[3]["sentence_id_b"]
    used = {p[f"sentence_id_{s}"] for p in pairs for s in "ab"}
    # the word cells must fit the sentences a pair now points to: rebuild them from those sentences' words
    words = {s["sentence_id"]: s["words"] for s in data["sentences"]}
    word_cells = [{"pair_id": p["pair_id"], "u": u, "v": v, "value": round(float(rng.normal(0, 0.1)), 2)}
                  for p in pairs for u in range(len(words[p["sentence_id_a"]]))
                  for v in range(len(words[p["sentence_id_b"]]))]  # fmt: skip
    sents = [s for s in data["sentences"] if s["sentence_id"] in used]
    run = make_run(root, "shared", pairs, data["cells"], word_cells, sents)
    write_table(run, "parses", random_parses({**data, "sentences": sents}, rng))
    return run


@pytest.mark.parametrize("cluster_by", ["sentence", "pair"])
def test_syntactic_relations_pairs_counts_and_intervals_against_a_slow_bootstrap(tmp_path, cluster_by):
    run = shared_sentence_run(tmp_path)
    df = run_sql(run, "syntactic_relations_pairs.sql", top_share=0.25, relation_clusters=cluster_by, resamples=400, seed=3)
    counts = slow_pair_counts(run, 0.25)
    got = records(df, "pair_id")
    assert set(got) == set(counts)
    for pid, want in counts.items():
        assert {k: got[pid][k] for k in want} == want
        assert got[pid]["n_unaligned"] == want["n_top"] - want["n_parsed"]
    clusters = slow_components(run, set(counts)) if cluster_by == "sentence" else {p: p for p in counts}
    assert {p: r["cluster_id"] for p, r in got.items()} == clusters
    if cluster_by == "sentence":
        assert len(set(clusters.values())) < len(clusters)  # some pairs do share a sentence
    # the whole run's shares, and each share's interval from the same draws over the clusters
    names = sorted(set(clusters.values()))
    tally = {c: {k: 0 for k in ("n_top", "n_nsubj", "n_same", "n_parsed", "n_unaligned")} for c in names}
    for pid, want in counts.items():
        for key, value in {**want, "n_unaligned": want["n_top"] - want["n_parsed"]}.items():
            tally[clusters[pid]][key] += value
    first = df.row(0, named=True)
    assert (first["n_pairs"], first["n_clusters"], first["resamples"]) == (len(counts), len(names), 400)
    assert first["cluster_by"] == cluster_by
    if cluster_by == "sentence":  # the file's default on a run of up to 50,000 pairs
        default = run_sql(run, "syntactic_relations_pairs.sql", resamples=10).row(0, named=True)
        assert default["cluster_by"] == "sentence"
    resamples = draws(3, 400, len(names))
    for share, (num, den) in SHARES.items():
        total = {k: sum(t[k] for t in tally.values()) for k in (num, den)}
        assert first[share] == pytest.approx(total[num] / total[den]), share
        values = [sum(tally[names[i]][num] for i in row) / sum(tally[names[i]][den] for i in row)
                  for row in resamples]  # fmt: skip
        assert (first[f"{share}_low"], first[f"{share}_high"]) == pytest.approx(percentile_interval(values)), share


def test_syntactic_relations_pairs_sum_to_the_files_counts(tmp_path):
    """The per-pair counts add up to syntactic_relations.sql's relation-pair counts and shares (one run, two
    files: the same top cells)."""
    rng = np.random.default_rng(7)
    run, data = random_run(tmp_path, "r", rng, n_pairs=12)
    write_table(run, "parses", random_parses(data, rng))
    pairs = run_sql(run, "syntactic_relations_pairs.sql", top_share=0.25, resamples=10)
    whole = run_sql(run, "syntactic_relations.sql", top_share=0.25)
    assert int(pairs["n_top"].sum()) == int(whole["n"].sum())
    nsubj = whole.filter((whole["relation_a"] == "nsubj") & (whole["relation_b"] == "nsubj"))["n"].sum()
    assert int(pairs["n_nsubj"].sum()) == int(nsubj)
    row, first = whole.row(0, named=True), pairs.row(0, named=True)
    assert first["same_function_share"] == pytest.approx(row["same_function_share"])
    assert first["unaligned_share"] == pytest.approx(row["unaligned_share"])
    parsed = row["same_function_share"] + row["mixed_share"]
    assert first["same_share_of_parsed"] == pytest.approx(row["same_function_share"] / parsed)


def test_syntactic_relations_pairs_on_the_known_top_cells(tmp_path):
    run = relations_run(tmp_path)  # top cells: det-det, nsubj-nsubj, amod-unaligned, nsubj-unparsed, nsubj-root
    first = run_sql(run, "syntactic_relations_pairs.sql", resamples=50).row(0, named=True)
    assert first["n_pairs"] == 4
    assert first["nsubj_share"] == pytest.approx(0.2) and first["nsubj_share_of_parsed"] == pytest.approx(1 / 3)
    assert first["same_function_share"] == pytest.approx(0.4) and first["unaligned_share"] == pytest.approx(0.4)
    for share in SHARES:
        assert first[f"{share}_low"] <= first[share] <= first[f"{share}_high"], share
