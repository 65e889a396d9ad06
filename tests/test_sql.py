"""The analyses (sql/*.sql), `jobs.sqlrun`, `xsbert sql`, and the built-in negation / adjectives datasets.

Each sql/ file runs on hand-built Parquet run directories (schemas from jobs.store.SCHEMAS) whose
answers are known: planted effects (a lexical bias, a negative *not*, adjective cells, a known
top-10% set) and, for every number, a slow plain-Python/numpy/scipy computation of the same
quantity on the same rows. Then on small real runs (all-MiniLM-L6-v2 through the real job on a local
2-CPU Ray, FAST settings), through the duckdb CLI exactly as docs/ANALYSES.md says, and through
`xsbert sql`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from jobs import sqlfiles, sqlrun
from jobs.attribution import datasets as _datasets
from jobs.attribution import inputs as _inputs
from jobs.attribution import validate as _validate
from jobs.store import SCHEMAS
from xsbert_core import InputError

ROOT = Path(__file__).resolve().parents[1]
SQL = ROOT / "sql"
DUCKDB_CLI = Path(sys.executable).parent / "duckdb"
FILES = sorted(p.name for p in SQL.glob("*.sql"))
TWO_RUN_FILES = ("agreement.sql", "lexical_ranks_compare.sql")
VOCAB = ["the", "cat", "dog", "house", "is", "not", "big", "small", "runs", "."]


# --------------------------------------------------------------------------- hand-built run directories
def write_table(run: Path, table: str, rows: list[dict[str, Any]], extra: tuple[str, ...] = ()) -> None:
    """One Parquet part of `table` (its SCHEMAS columns, missing values null; `extra` string columns after)."""
    schema = SCHEMAS[table]
    for name in extra:
        schema = schema.append(pa.field(name, pa.string()))
    (run / table).mkdir(parents=True, exist_ok=True)
    data = pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)
    pq.write_table(data, run / table / "part-000000.parquet")


def make_run(
    root: Path,
    name: str,
    pairs: list[dict[str, Any]],
    cells: list[dict[str, Any]] = (),
    word_cells: list[dict[str, Any]] = (),
    sentences: list[dict[str, Any]] = (),
    parses: list[dict[str, Any]] | None = None,
    mode: str = "approx",
    similarity: str = "cos",
) -> Path:
    """A run directory as jobs.attribute writes it (every table, manifest.json); parses only when given."""
    run = root / name
    extra = tuple(k for k in dict.fromkeys(k for p in pairs for k in p) if k not in SCHEMAS["pairs"].names)
    write_table(run, "pairs", pairs, extra)
    for table, rows in (("cells", cells), ("word_cells", word_cells), ("sentences", sentences), ("quarantine", [])):
        write_table(run, table, list(rows))
    if parses is not None:
        write_table(run, "parses", parses)
    config = {"model": "hand-built", "mode": mode, "similarity": similarity, "layer": 3}
    (run / "manifest.json").write_text(json.dumps({"run_id": name, "config": config}, indent=1))
    return run


def sentence(sid: str, words: list[str], special: tuple[str, str] = ("[CLS]", "[SEP]")) -> dict[str, Any]:
    """A sentences row: one token per word between two special tokens."""
    return {"sentence_id": sid, "text": " ".join(words), "n_tokens": len(words) + 2, "n_words": len(words),
            "tokens": [special[0], *words, special[1]], "word_ids": [None, *range(len(words)), None],
            "words": words}  # fmt: skip


def run_sql(run: Path, name: str, run2: Path | None = None, **variables: Any) -> pl.DataFrame:
    return sqlrun.run_file(sqlrun.connect(run, run2, variables), SQL / name)


def avg_ranks_desc(values: list[float]) -> np.ndarray:
    """Average ranks, 1 = largest."""
    return stats.rankdata([-v for v in values], method="average")


def random_run(
    root: Path, name: str, rng: np.random.Generator, n_pairs: int = 12, bias: dict[str, float] | None = None,
    mode: str = "approx", similarity: str = "cos",
) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    """Random sentences of VOCAB, full cell grids (values rounded to 0.01, so ties occur), random pair numbers;
    `bias` adds to the same-token cells of a token. Returns the run and its rows."""
    bias = bias or {}
    data: dict[str, list[dict[str, Any]]] = {"pairs": [], "cells": [], "word_cells": [], "sentences": []}
    for p in range(n_pairs):
        sa = sentence(f"{name}-{p}a", list(rng.choice(VOCAB, int(rng.integers(2, 7)))))
        sb = sentence(f"{name}-{p}b", list(rng.choice(VOCAB, int(rng.integers(2, 7)))))
        data["sentences"] += [sa, sb]
        pid = f"p{p:02d}"
        for i, ta in enumerate(sa["tokens"]):
            for j, tb in enumerate(sb["tokens"]):
                value = round(float(rng.normal(0, 0.1)), 2) + (bias.get(ta, 0.0) if ta == tb else 0.0)
                data["cells"].append({"pair_id": pid, "i": i, "j": j, "token_a": ta, "token_b": tb, "value": value})
        for u, wa in enumerate(sa["words"]):
            for v, wb in enumerate(sb["words"]):
                data["word_cells"].append({"pair_id": pid, "u": u, "v": v, "word_a": wa, "word_b": wb,
                                           "value": round(float(rng.normal(0, 0.1)), 2)})  # fmt: skip
        positive = float(rng.uniform(0, 3))
        data["pairs"].append({
            "pair_id": pid, "row": p, "split": "test", "label": float(rng.integers(0, 6)),
            "text_a": sa["text"], "text_b": sb["text"], "sentence_id_a": sa["sentence_id"],
            "sentence_id_b": sb["sentence_id"], "n_tokens_a": len(sa["tokens"]), "n_tokens_b": len(sb["tokens"]),
            "score": round(float(rng.uniform(-1, 1)), 1),
            "attribution_sum": positive - 0.5, "positive_sum": positive, "negative_sum": -0.5,
            "ref_sim_a": float(rng.normal(0, 0.1)), "ref_sim_b": float(rng.normal(0, 0.1)),
            "ref_term": float(rng.uniform(0.8, 1.0)),
        })  # fmt: skip
    run = make_run(root, name, data["pairs"], data["cells"], data["word_cells"], data["sentences"], mode=mode,
                   similarity=similarity)  # fmt: skip
    return run, data


def records(df: pl.DataFrame, key: str) -> dict[Any, dict[str, Any]]:
    return {r[key]: r for r in df.iter_rows(named=True)}


def close(a: float | None, b: float | None) -> bool:
    """Equal up to rounding; None (SQL null) equals only None, and NaN only NaN."""
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def no_nan(df: pl.DataFrame) -> bool:
    """No float column holds a NaN (nulls are fine)."""
    return not any(df[c].is_nan().any() for c in df.columns if df[c].dtype.is_float())


# --------------------------------------------------------------------------- every file
@pytest.mark.parametrize("name", FILES)
def test_each_file_is_one_documented_lowercase_statement(name):
    """One query per file, after the macros that write its per-run logic once (`create or replace temp macro`) and
    at most a `set variable` that decides how it runs (agreement.sql's plan) or stops a run it cannot read
    (adjectives.sql's guard: DuckDB's binder would fail the query on a missing column before any guard in it ran)."""
    import duckdb

    text = sqlfiles.text(SQL / name)  # with the macros of sql/lib/ it reads
    *before, query = duckdb.extract_statements(text)
    assert query.type == duckdb.StatementType.SELECT
    macros = [s for s in before if s.type == duckdb.StatementType.CREATE]
    assert before[: len(macros)] == macros  # the macros first
    for macro in macros:
        code = "\n".join(line.split("--")[0] for line in macro.query.splitlines())
        assert re.match(r"\s*create or replace temp macro \w+\(", code), macro.query[:200]
    rest = before[len(macros):]
    assert not rest or (name in ("agreement.sql", "adjectives.sql") and len(rest) == 1
                        and rest[0].type == duckdb.StatementType.SET)  # fmt: skip
    header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
    for field in ("Question", "Paper", "Inputs", "Grain", "Columns", "Params", "Run"):
        assert re.search(rf"^-- {field}\b", header, re.M), field
    assert f"-f sql/{name}" in header
    code = "\n".join(line.split("--")[0] for line in text.splitlines())
    assert not re.search(r"\b(SELECT|FROM|WHERE|GROUP BY|JOIN|WITH)\b", code)  # lowercase keywords
    assert re.search(r"^with\b", code, re.M) and "getvariable('run')" in code


def _macro(name: str, macro: str) -> str:
    """The text of `create or replace temp macro <macro>` in sql/<name>, up to its `;`."""
    text = (SQL / name).read_text(encoding="utf-8")
    found = re.search(rf"^create or replace temp macro {macro}\(.*?;$", text, re.M | re.S)
    assert found, (name, macro)
    return found.group(0)


def test_the_shared_macros_are_written_once_in_sql_lib():
    """What several files use is one macro in sql/lib/ (a run's lexical ranks, the cells guard, the negation pairs,
    the top cells' relations, a cluster bootstrap's draws), which each file reads with the duckdb CLI's `.read`
    (jobs.sqlfiles.text does the same for the Python side), never a copy."""
    shared = {m: lib.stem for lib in sorted((SQL / "lib").glob("*.sql"))
              for m in re.findall(r"^create or replace temp macro (\w+)\(", lib.read_text(encoding="utf-8"), re.M)}
    assert {"lexical_token_ranks": "lexical_token_ranks", "cells_guard": "cells_guard",
            "negation_pairs": "negation_pairs", "syntactic_top_cells": "syntactic_top_cells", "xs_hash": "resample",
            "xs_draw": "resample", "xs_cluster_draws": "resample"}.items() <= shared.items()  # fmt: skip
    users = {name: 0 for name in shared}
    for path in sorted(SQL.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        assert "from read_text(" not in text.split("cells_guard as (", 1)[-1].split("),", 1)[0], path.name
        for name, lib in shared.items():
            assert f"temp macro {name}(" not in text, (path.name, name)
            if re.search(rf"\b{name}\(", text):
                users[name] += 1
                assert f".read sql/lib/{lib}.sql" in text.splitlines(), (path.name, name)
                assert f"temp macro {name}(" in sqlfiles.text(path), (path.name, name)
    assert users["cells_guard"] >= 7 and users["lexical_token_ranks"] == 2 and users["negation_pairs"] == 2
    assert users["syntactic_top_cells"] == 2 and users["xs_cluster_draws"] == 2 and users["xs_draw"] == 0
    compare = (SQL / "lexical_ranks_compare.sql").read_text(encoding="utf-8")
    assert "lexical_token_ranks(getvariable('run'))" in compare and "lexical_token_ranks(getvariable('run2'))" in compare
    agreement = (SQL / "agreement.sql").read_text(encoding="utf-8")
    for macro in ("agreement_cells", "agreement_pairs", "agreement_special"):  # each run's inputs, written once
        assert agreement.count(f"{macro}(getvariable('run'))") >= 1 and f"{macro}(getvariable('run2'))" in agreement
    assert agreement.count("read_parquet(") == 4  # cells, word_cells, pairs, sentences: once each, in the macros


def test_files_are_the_documented_set():
    assert set(FILES) >= {"lexical_ranks.sql", "lexical_ranks_compare.sql", "syntactic_relations.sql", "negation.sql",
                          "adjectives.sql", "reference_terms.sql", "pos_neg_sums.sql", "agreement.sql",
                          "table1.sql"}  # fmt: skip
    doc = (ROOT / "docs" / "ANALYSES.md").read_text(encoding="utf-8")
    for name in FILES:
        assert f"## `{name}`" in doc, name  # a section per file


# --------------------------------------------------------------------------- lexical ranks
def slow_lexical(cells, min_count: int, include_special: bool = False) -> dict[str, tuple]:
    """token -> (n, mean, std, rank) in plain Python: rank = 1 + number of tokens with a larger mean."""
    groups: dict[str, list[float]] = defaultdict(list)
    for c in cells:
        if c["token_a"] == c["token_b"] and (include_special or c["token_a"] not in ("[CLS]", "[SEP]")):
            groups[c["token_a"]].append(c["value"])
    kept = {t: v for t, v in groups.items() if len(v) >= min_count}
    means = {t: sum(v) / len(v) for t, v in kept.items()}
    return {
        t: (len(v), means[t], float(np.std(v, ddof=1)) if len(v) > 1 else None,
            1 + sum(m > means[t] + 1e-12 for m in means.values()))
        for t, v in kept.items()
    }  # fmt: skip


def check_lexical(df: pl.DataFrame, expected: dict[str, tuple]) -> None:
    assert df.columns == ["token", "n", "mean", "std", "rank"]
    got = records(df, "token")
    assert set(got) == set(expected)
    for token, (n, mean, std, rank) in expected.items():
        row = got[token]
        assert (row["n"], row["rank"]) == (n, rank), token
        assert close(row["mean"], mean) and close(row["std"], std), token
    assert df["rank"].to_list() == sorted(df["rank"].to_list())


def test_lexical_ranks_find_a_planted_bias(tmp_path):
    run, data = random_run(tmp_path, "r", np.random.default_rng(1), n_pairs=30, bias={"cat": 1.0})
    df = run_sql(run, "lexical_ranks.sql", min_count=3)
    assert df.row(0, named=True)["token"] == "cat" and df.row(0, named=True)["rank"] == 1
    check_lexical(df, slow_lexical(data["cells"], 3, include_special=True))
    assert {"[CLS]", "[SEP]"} <= set(df["token"].to_list())  # the paper ranks special tokens: in by default
    words_only = run_sql(run, "lexical_ranks.sql", min_count=3, include_special=False)
    check_lexical(words_only, slow_lexical(data["cells"], 3))
    assert "[CLS]" not in words_only["token"].to_list() and "[SEP]" not in words_only["token"].to_list()
    default = run_sql(run, "lexical_ranks.sql")  # min_count 30
    check_lexical(default, slow_lexical(data["cells"], 30, include_special=True))


def test_lexical_ranks_compare_is_scipys_spearman_with_ties(tmp_path):
    rng = np.random.default_rng(2)
    run1, data1 = random_run(tmp_path, "r1", rng, n_pairs=25)
    run2, data2 = random_run(tmp_path, "r2", rng, n_pairs=25)
    # Exact ties of token means in both runs (values that are sums of powers of two stay exact).
    for data, tied, run in ((data1, ("is", "big"), run1), (data2, ("dog", "house", "runs"), run2)):
        for c in data["cells"]:
            if c["token_a"] == c["token_b"] and c["token_a"] in tied:
                c["value"] = 0.25
        write_table(run, "cells", data["cells"])
    df = run_sql(run1, "lexical_ranks_compare.sql", run2, min_count=2)
    assert df.columns == ["token", "n_1", "mean_1", "std_1", "rank_1", "n_2", "mean_2", "std_2", "rank_2",
                          "shared_rank_1", "shared_rank_2", "n_shared", "spearman"]  # fmt: skip
    e1, e2 = slow_lexical(data1["cells"], 2, True), slow_lexical(data2["cells"], 2, True)  # special tokens ranked
    shared = sorted(set(e1) & set(e2))
    assert {"[CLS]", "[SEP]"} <= set(shared)
    words_only = run_sql(run1, "lexical_ranks_compare.sql", run2, min_count=2, include_special=False)
    w1, w2 = slow_lexical(data1["cells"], 2), slow_lexical(data2["cells"], 2)
    assert sorted(words_only["token"].to_list()) == sorted(set(w1) & set(w2)) == [t for t in shared if t[0] != "["]
    assert sorted(df["token"].to_list()) == shared and len(shared) >= 6
    got = records(df, "token")
    m1, m2 = [e1[t][1] for t in shared], [e2[t][1] for t in shared]
    assert len(set(m2)) < len(m2)  # the planted tie is among the shared tokens
    rho = stats.spearmanr(m1, m2).statistic
    assert df["spearman"].to_list() == [pytest.approx(rho, rel=1e-12)] * len(shared)
    assert df["n_shared"].to_list() == [len(shared)] * len(shared)
    for t, r1, r2 in zip(shared, avg_ranks_desc(m1), avg_ranks_desc(m2)):
        assert (got[t]["shared_rank_1"], got[t]["shared_rank_2"]) == (r1, r2)
        assert (got[t]["rank_1"], got[t]["rank_2"], got[t]["n_1"]) == (e1[t][3], e2[t][3], e1[t][0])
    assert got["dog"]["rank_2"] == got["house"]["rank_2"]  # tied means share a rank in lexical_ranks


# --------------------------------------------------------------------------- table 1
def test_table1_is_scipys_spearman_times_100_with_ties(tmp_path):
    run, data = random_run(tmp_path, "r", np.random.default_rng(3), n_pairs=40)
    data["pairs"][0]["label"] = None  # no label: left out
    write_table(run, "pairs", data["pairs"])
    df = run_sql(run, "table1.sql")
    assert df.columns == ["model", "mode", "similarity", "layer", "n_pairs", "spearman_x100", "spearman", "pearson"]
    row = df.row(0, named=True)
    labelled = [p for p in data["pairs"] if p["label"] is not None]
    scores, labels = [p["score"] for p in labelled], [p["label"] for p in labelled]
    assert len(set(scores)) < len(scores) and len(set(labels)) < len(labels)  # ties on both sides
    assert row["n_pairs"] == 39 and (row["model"], row["mode"], row["layer"]) == ("hand-built", "approx", 3)
    assert row["spearman_x100"] == pytest.approx(100 * stats.spearmanr(scores, labels).statistic, rel=1e-12)
    assert row["pearson"] == pytest.approx(stats.pearsonr(scores, labels).statistic, rel=1e-12)


# --------------------------------------------------------------------------- syntactic relations
def relations_run(root: Path, name: str = "rel", parsers: tuple[str, ...] = ("stanza", "spacy")) -> Path:
    """Four pairs whose top cells and relations are known (see test_syntactic_relations_known_top_cells)."""
    sents = {
        "a1": ["the", "cat", "runs"], "b1": ["a", "dog", "runs", "."],
        "a2": ["big", "house"], "b2": ["small", "house", "is", "big"],
        "a3": ["dog"], "b3": ["cat"],
        "a4": ["cat", "runs"], "b4": ["dog", "runs"],
    }  # fmt: skip
    deprels = {"the": "det", "a": "det", "cat": "nsubj", "dog": "nsubj", "runs": "root", ".": "punct",
               "big": "amod", "small": "amod", "house": "nsubj", "is": "cop"}  # fmt: skip
    planted = {  # pair -> {(u, v): value}; every other cell gets a value below them
        "p1": {(1, 1): 0.9, (2, 2): 0.9, (0, 0): 0.9},  # k = ceil(0.1 * 12) = 2: a three-way tie, (0,0), (1,1) win
        "p2": {(0, 3): 0.7},  # k = 1: big ~ big, b's "big" did not align with a parser word
        "p3": {(0, 0): 0.1},  # k = 1: a3 was never parsed
        "p4": {(0, 1): 0.8},  # k = 1: cat ~ runs, nsubj ~ root: mixed
    }
    pairs, word_cells = [], []
    for k in range(1, 5):
        a, b, pid = sents[f"a{k}"], sents[f"b{k}"], f"p{k}"
        pairs.append({"pair_id": pid, "sentence_id_a": f"a{k}", "sentence_id_b": f"b{k}", "score": 0.5})
        for u in range(len(a)):
            for v in range(len(b)):
                value = planted[pid].get((u, v), -5.0 if (u + v) % 2 else 0.05 * (u - v))  # large negatives
                word_cells.append({"pair_id": pid, "u": u, "v": v, "value": value})
    parses = []
    for sid, words in sents.items():
        if sid == "a3":
            continue
        for u, w in enumerate(words):
            aligned = not (sid == "b2" and u == 3)
            for parser in parsers:
                deprel = (deprels[w] if parser == "stanza" else "dep") if aligned else None
                parses.append({"sentence_id": sid, "u": u, "word": w, "deprel": deprel, "aligned": aligned,
                               "alignment": "one_to_one" if aligned else "many_to_one", "parser": parser})  # fmt: skip
    return make_run(root, name, pairs, word_cells=word_cells,
                    sentences=[sentence(s, w) for s, w in sents.items()], parses=parses)  # fmt: skip


def test_syntactic_relations_known_top_cells(tmp_path):
    run = relations_run(tmp_path)
    df = run_sql(run, "syntactic_relations.sql")  # stanza's rows are preferred over spacy's
    assert df.columns == ["relation_a", "relation_b", "n", "share", "is_same_function", "same_function_share",
                          "mixed_share", "unaligned_share"]  # fmt: skip
    got = {(r["relation_a"], r["relation_b"]): (r["n"], r["is_same_function"]) for r in df.iter_rows(named=True)}
    assert got == {("det", "det"): (1, True), ("nsubj", "nsubj"): (1, True), ("amod", "unaligned"): (1, False),
                   ("nsubj", "unparsed"): (1, False), ("nsubj", "root"): (1, False)}  # fmt: skip
    assert df["share"].to_list() == [0.2] * 5
    row = df.row(0, named=True)
    assert (row["same_function_share"], row["mixed_share"], row["unaligned_share"]) == (0.4, 0.2, 0.4)
    spacy = run_sql(run, "syntactic_relations.sql", parser="spacy")  # the `parser` variable picks the rows
    assert {(r["relation_a"], r["relation_b"]) for r in spacy.iter_rows(named=True)} == {
        ("dep", "dep"), ("dep", "unaligned"), ("dep", "unparsed")}
    only_spacy = run_sql(relations_run(tmp_path, "rel-spacy", parsers=("spacy",)), "syntactic_relations.sql")
    assert only_spacy["n"].sum() == 5 and "det" not in only_spacy["relation_a"].to_list()


def random_parses(data: dict, rng: np.random.Generator) -> list[dict]:
    """spaCy-style parses rows for every word of a random_run's sentences: a random relation, 10% unaligned."""
    labels = ["nsubj", "obj", "det", "amod", "root"]
    parses = []
    for s in data["sentences"]:
        for u, w in enumerate(s["words"]):
            aligned = bool(rng.random() > 0.1)
            parses.append({"sentence_id": s["sentence_id"], "u": u, "word": w, "aligned": aligned, "parser": "spacy",
                           "deprel": str(rng.choice(labels)) if aligned else None})  # fmt: skip
    return parses


def test_syntactic_relations_equal_a_slow_top_share(tmp_path):
    rng = np.random.default_rng(4)
    run, data = random_run(tmp_path, "r", rng, n_pairs=15)
    parses = random_parses(data, rng)
    write_table(run, "parses", parses)
    relation = {(p["sentence_id"], p["u"]): p["deprel"] or "unaligned" for p in parses}
    pair_of = {p["pair_id"]: p for p in data["pairs"]}
    n_words = {s["sentence_id"]: s["n_words"] for s in data["sentences"]}
    for top_share in (0.10, 0.25):
        cells: dict[str, list[dict]] = defaultdict(list)
        for c in data["word_cells"]:
            cells[c["pair_id"]].append(c)
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for pid, rows in cells.items():
            p = pair_of[pid]
            k = max(1, math.ceil(top_share * n_words[p["sentence_id_a"]] * n_words[p["sentence_id_b"]]))
            for c in sorted(rows, key=lambda c: (-c["value"], c["u"], c["v"]))[:k]:
                pair = sorted((relation[p["sentence_id_a"], c["u"]], relation[p["sentence_id_b"], c["v"]]))
                counts[tuple(pair)] += 1
        df = run_sql(run, "syntactic_relations.sql", top_share=top_share)
        assert {(r["relation_a"], r["relation_b"]): r["n"] for r in df.iter_rows(named=True)} == counts
        total = sum(counts.values())
        same = sum(n for (a, b), n in counts.items() if a == b != "unaligned") / total
        row = df.row(0, named=True)
        assert row["same_function_share"] == pytest.approx(same)
        assert row["same_function_share"] + row["mixed_share"] + row["unaligned_share"] == pytest.approx(1.0)
        assert df["share"].sum() == pytest.approx(1.0) and df["n"].to_list() == sorted(df["n"].to_list())[::-1]


def test_syntactic_relations_on_stored_ranks_choose_the_same_top_cells(tmp_path):
    """A run whose word cells carry their stored ranks (store version 3) chooses its top cells by rank: the same rows
    as by value, with ties at the top (relations_run: three cells of 0.9 for k = 2; random_run: values rounded to
    0.01) and for a run pruned as --min-abs prunes (ranked over every cell, only the larger ones stored). Ranks that
    ordered the cells otherwise would decide: the query reads them."""
    from polars.testing import assert_frame_equal

    rng = np.random.default_rng(8)
    random, data = random_run(tmp_path, "r", rng, n_pairs=15)
    parses = random_parses(data, rng)
    write_table(random, "parses", parses)

    def ranked(run: Path, name: str, keep=None, reverse: str | None = None) -> Path:
        """A copy with stored ranks (word cells ranked over all of them), then only the word cells `keep` keeps;
        `reverse`: that pair's ranks reversed."""
        copy = stored_ranks_copy(tmp_path, name, run)
        words = sqlrun.connect(copy).sql("select * from word_cells").pl().to_dicts()
        if reverse:
            n = sum(w["pair_id"] == reverse for w in words)
            words = [{**w, "value_rank": n + 1 - w["value_rank"]} if w["pair_id"] == reverse else w for w in words]
        write_table(copy, "word_cells", [w for w in words if keep is None or keep(w)])
        write_table(copy, "parses", sqlrun.connect(run).sql("select * from parses").pl().to_dicts())
        return copy

    def pruned(run: Path, name: str, keep) -> Path:
        """The run without ranks, with only the word cells `keep` keeps."""
        copy = tmp_path / name
        shutil.copytree(run, copy)
        words = sqlrun.connect(run).sql("select * from word_cells").pl().to_dicts()
        write_table(copy, "word_cells", [w for w in words if keep(w)])
        return copy

    def big(w: dict) -> bool:
        return abs(w["value"]) >= 0.05

    for run, variables in ((relations_run(tmp_path), {}), (random, {"top_share": 0.10}), (random, {"top_share": 0.25})):
        want = run_sql(run, "syntactic_relations.sql", **variables)
        with_ranks = ranked(run, f"{run.name}-ranked-{len(variables)}")
        assert sqlrun.connect(with_ranks).sql("select count(value_rank) from word_cells").fetchall()[0][0] > 0
        assert_frame_equal(run_sql(with_ranks, "syntactic_relations.sql", **variables), want)
        want_pruned = run_sql(pruned(run, f"{run.name}-pruned-{variables}", big), "syntactic_relations.sql",
                              **variables)  # fmt: skip
        got_pruned = run_sql(ranked(run, f"{run.name}-ranked-pruned-{variables}", keep=big),
                             "syntactic_relations.sql", **variables)  # fmt: skip
        assert_frame_equal(got_pruned, want_pruned)
    reversed_ranks = ranked(random, "reversed", reverse="p00")
    assert not run_sql(reversed_ranks, "syntactic_relations.sql").equals(run_sql(random, "syntactic_relations.sql"))


# --------------------------------------------------------------------------- negation
NEGATION_PAIRS = [
    # pair_id, text_a, text_b, words_a, words_b, word cells of the not-word (None: no row is detected)
    ("n1", "This is not good.", "This is good.", ["This", "is", "not", "good", "."], ["This", "is", "good", "."],
     [-0.2, 0.1, -0.3, 0.05]),
    ("n2", "A good idea.", "Not a good idea.", ["A", "good", "idea", "."], ["Not", "a", "good", "idea", "."],
     [0.1, 0.2, 0.0, 0.1]),
    ("n3", "I cannot go.", "I go.", ["I", "cannot", "go", "."], ["I", "go", "."], None),
    ("n4", "He did not not go.", "He did not go.", ["He", "did", "not", "not", "go", "."],
     ["He", "did", "not", "go", "."], [0.1, 0.1, 0.1, 0.1, 0.1]),
    ("n5", "The cat runs.", "The dog runs.", ["The", "cat", "runs", "."], ["The", "dog", "runs", "."], None),
    ("n6", "It is not red.", "It is red.", ["It", "is", "not", "red", "."], ["It", "is", "red", "."], []),
]  # fmt: skip


# Each token cell of the not-word against a special token of the other side (one token per word, sentence()):
# in the paper's total to the not token, not in its word cells.
NOT_SPECIAL = 0.05


def negation_run(root: Path) -> Path:
    """Word cells as NEGATION_PAIRS plants them (every other one 1.0) and the same values as token cells (token
    u + 1 is word u), plus special-token cells: NOT_SPECIAL in the not-word's row or column, 0.01 elsewhere."""
    pairs, sents, word_cells, cells = [], [], [], []
    for k, (pid, ta, tb, wa, wb, not_cells) in enumerate(NEGATION_PAIRS):
        sents += [sentence(f"{pid}a", wa), sentence(f"{pid}b", wb)]
        pairs.append({"pair_id": pid, "text_a": ta, "text_b": tb, "sentence_id_a": f"{pid}a",
                      "sentence_id_b": f"{pid}b", "score": 0.5, "attribution_sum": 0.5 + 0.1 * k,
                      "completeness_error": 1e-3 * (k + 1), "steps_a": 16, "steps_b": 16})  # fmt: skip
        side_a = len(wa) > len(wb)
        for u in range(len(wa)):
            for v in range(len(wb)):
                not_index = wa.index("not") if side_a and "not" in wa else None
                if not side_a and "Not" in wb:
                    not_index = wb.index("Not")
                is_not = not_cells is not None and (u if side_a else v) == not_index
                if is_not and not not_cells:
                    continue  # n6: the not-word's cells were pruned (--min-abs)
                value = not_cells[v if side_a else u] if is_not else 1.0
                word_cells.append({"pair_id": pid, "u": u, "v": v, "value": value})
        for i in range(len(wa) + 2):
            for j in range(len(wb) + 2):
                word = (i - 1, j - 1) if 0 < i <= len(wa) and 0 < j <= len(wb) else None
                if word is not None:
                    found = [c["value"] for c in word_cells if c["pair_id"] == pid and (c["u"], c["v"]) == word]
                    if found:
                        cells.append({"pair_id": pid, "i": i, "j": j, "value": found[0]})
                    continue
                not_index = next((k for k, w in enumerate(wa if side_a else wb) if w.lower() == "not"), None)
                in_not = not_index is not None and (i if side_a else j) == not_index + 1
                if in_not and not_cells == []:
                    continue  # n6: pruned
                cells.append({"pair_id": pid, "i": i, "j": j, "value": NOT_SPECIAL if in_not else 0.01})
    return make_run(root, "neg", pairs, cells=cells, word_cells=word_cells, sentences=sents)


def test_negation_the_papers_definition_is_the_default(tmp_path):
    """definition = 'paper' (the default): the total attribution to the not token (its token cells against every
    token of the other side, special tokens included) and its share of the prediction f(a, b) (the score)."""
    df = run_sql(negation_run(tmp_path), "negation.sql")
    assert df.columns == ["pair_id", "text_a", "text_b", "score", "attribution_sum", "not_side", "not_index",
                          "not_total", "not_word_attribution", "word_attribution_sum", "definition",
                          "not_attribution", "relative", "relative_plus_one", "relative_to_sum", "is_negative",
                          "share_negative", "p90_abs_relative", "p90_abs_relative_plus_one",
                          "p90_abs_relative_to_sum"]
    assert df["pair_id"].to_list() == ["n1", "n2", "n4", "n6"] and set(df["definition"]) == {"paper"}
    got = records(df, "pair_id")
    planted = {pid: sum(cells or []) for pid, _, _, _, _, cells in NEGATION_PAIRS}
    # the not-word's row (a) or column (b) meets the other side's two special tokens; n6's were pruned
    expected = {pid: planted[pid] + (0 if pid == "n6" else 2 * NOT_SPECIAL) for pid in ("n1", "n2", "n4", "n6")}
    for pid, total in expected.items():
        row = got[pid]
        assert row["not_total"] == pytest.approx(total) and row["not_attribution"] == pytest.approx(total)
        assert row["not_word_attribution"] == pytest.approx(planted[pid])
        assert row["relative"] == pytest.approx(total / row["score"]) and row["is_negative"] == (total < 0)
        # the two other readings of the paper's "of the prediction": f(a, b) + 1 (Eq. 4's sum) and sum(A)
        assert row["relative_plus_one"] == pytest.approx(total / (row["score"] + 1))
        assert row["relative_to_sum"] == pytest.approx(total / row["attribution_sum"])
    relative = [total / 0.5 for total in expected.values()]
    assert df["p90_abs_relative"][0] == pytest.approx(np.percentile(np.abs(relative), 90))
    for column, over in (("relative_plus_one", lambda pid: 1.5),
                         ("relative_to_sum", lambda pid: got[pid]["attribution_sum"])):
        shares = [total / over(pid) for pid, total in expected.items()]
        assert df[f"p90_abs_{column}"][0] == pytest.approx(np.percentile(np.abs(shares), 90))
    assert set(df["share_negative"]) == {0.25}
    with pytest.raises(duckdb.Error, match="definition must be paper or word_cells"):
        run_sql(negation_run(tmp_path / "x"), "negation.sql", definition="ours")


def test_negation_finds_the_not_and_its_planted_negative_attribution(tmp_path):
    """definition = 'word_cells' (ours, an option): the not-word's word cells over the sum of all word cells."""
    df = run_sql(negation_run(tmp_path), "negation.sql", definition="word_cells")
    assert df["pair_id"].to_list() == ["n1", "n2", "n4", "n6"]  # not "cannot", not a pair without a not
    got = records(df, "pair_id")
    # every other word cell is 1.0 (negation_run): the pair's word cells sum to the not-word's plus the rest
    n_rest = {pid: len(wa) * len(wb) - (len(wa) if len(wa) < len(wb) else len(wb))
              for pid, _, _, wa, wb, _ in NEGATION_PAIRS}  # fmt: skip
    expected = {  # pair: not_side, not_index, not_attribution, the sum of the pair's word cells
        "n1": ("a", 2, -0.35, -0.35 + n_rest["n1"]), "n2": ("b", 0, 0.4, 0.4 + n_rest["n2"]),
        "n4": ("a", 2, 0.5, 0.5 + n_rest["n4"]), "n6": ("a", 2, 0.0, 0.0 + n_rest["n6"]),
    }  # fmt: skip
    for pid, (side, index, total, word_sum) in expected.items():
        row = got[pid]
        assert (row["not_side"], row["not_index"]) == (side, index)
        assert row["not_attribution"] == pytest.approx(total) and row["is_negative"] == (total < 0)
        assert row["word_attribution_sum"] == pytest.approx(word_sum)
        assert row["relative"] == pytest.approx(total / word_sum)  # numerator and denominator: word cells
    relative = [total / s for _, _, total, s in expected.values()]
    assert set(df["share_negative"].to_list()) == {0.25}
    assert df["p90_abs_relative"][0] == pytest.approx(np.percentile(np.abs(relative), 90))


# --------------------------------------------------------------------------- adjectives
def adjectives_run(root: Path) -> Path:
    t = "This house is X."
    rows = [  # pair_id, triplet, kind, words_a, words_b, cell values {(u, v): value}
        ("q1", "beautiful/pretty/ugly", "synonym", ["This", "house", "is", "beautiful", "."],
         ["This", "house", "is", "pretty", "."], {(3, 3): 0.4}),
        ("q2", "beautiful/pretty/ugly", "opposite", ["This", "house", "is", "beautiful", "."],
         ["This", "house", "is", "ugly", "."], {(3, 3): -0.1}),
        ("q3", "big/huge/small", "opposite", ["This", "house", "is", "big", "."], ["That", "house", "is", "small", "."],
         {}),  # two words differ: no adjective cell
        ("q4", "big/huge/small", "synonym", ["This", "house", "is", "big", "."], ["This", "house", "is", "huge", "."],
         None),  # the adjective cell was pruned
        ("q5", None, None, ["A", "b"], ["A", "c"], {}),  # not an adjective pair
        ("q6", "ugly/hideous/beautiful", "opposite", ["This", "house", "is", "ugly", "."],
         ["This", "house", "is", "beautiful", "."], {(3, 3): -0.1}),  # q2's sentences swapped: a repeat
    ]  # fmt: skip
    pairs, sents, word_cells = [], [], []
    for pid, triplet, kind, wa, wb, planted in rows:
        sents += [sentence(f"{pid}a", wa), sentence(f"{pid}b", wb)]
        pairs.append({"pair_id": pid, "sentence_id_a": f"{pid}a", "sentence_id_b": f"{pid}b", "score": 0.7,
                      "attribution_sum": 0.9, "triplet": triplet, "kind": kind, "template": t if triplet else None})
        for u in range(len(wa)):
            for v in range(len(wb)):
                if planted is None and (u, v) == (3, 3):
                    continue
                word_cells.append({"pair_id": pid, "u": u, "v": v, "value": (planted or {}).get((u, v), 0.01)})
    return make_run(root, "adj", pairs, word_cells=word_cells, sentences=sents)


def test_adjectives_read_the_adjective_cell(tmp_path):
    df = run_sql(adjectives_run(tmp_path), "adjectives.sql")
    assert df.columns == ["pair_id", "triplet", "kind", "template", "word_a", "word_b", "u", "attribution", "score",
                          "attribution_sum", "is_repeat"]  # fmt: skip
    got = {r["pair_id"]: (r["kind"], r["word_a"], r["word_b"], r["u"], r["attribution"], r["is_repeat"])
           for r in df.iter_rows(named=True)}  # fmt: skip
    assert got == {"q1": ("synonym", "beautiful", "pretty", 3, 0.4, False),
                   "q2": ("opposite", "beautiful", "ugly", 3, -0.1, False),
                   "q3": ("opposite", None, None, None, None, False), "q4": ("synonym", "big", "huge", 3, None, False),
                   "q6": ("opposite", "ugly", "beautiful", 3, -0.1, True)}  # the same two sentences as q2  # fmt: skip
    assert set(df["template"].to_list()) == {"This house is X."}


# --------------------------------------------------------------------------- reference terms, pos/neg sums
def test_reference_terms_quantiles_and_shares(tmp_path):
    run, data = random_run(tmp_path, "r", np.random.default_rng(5), n_pairs=60)
    for near_zero, threshold in ((None, None), (0.05, 0.95)):
        variables = {} if near_zero is None else {"near_zero": near_zero, "term_threshold": threshold}
        df = run_sql(run, "reference_terms.sql", **variables)
        assert df.columns == ["quantity", "n", "mean", "std", "min", "q05", "q25", "median", "q75", "q95", "max",
                              "near_zero", "share_near_zero", "term_threshold", "share_below_threshold"]  # fmt: skip
        assert df["quantity"].to_list() == ["ref_sim_a", "ref_sim_b", "ref_sim", "ref_term"]
        a, b, t = (np.array([p[k] for p in data["pairs"]]) for k in ("ref_sim_a", "ref_sim_b", "ref_term"))
        nz, th = near_zero or 0.1, threshold or 0.9
        for row, x in zip(df.iter_rows(named=True), (a, b, np.concatenate([a, b]), t)):
            q = np.quantile(x, [0.05, 0.25, 0.5, 0.75, 0.95])
            assert row["n"] == len(x) and row["mean"] == pytest.approx(x.mean())
            assert row["std"] == pytest.approx(x.std(ddof=1)) and (row["min"], row["max"]) == (x.min(), x.max())
            assert [row[k] for k in ("q05", "q25", "median", "q75", "q95")] == pytest.approx(q)
            assert row["share_near_zero"] == pytest.approx(np.mean(np.abs(x) <= nz))
            assert row["share_below_threshold"] == pytest.approx(np.mean(x < th))
            assert (row["near_zero"], row["term_threshold"]) == (nz, th)
        assert 0 < df["share_near_zero"][2] < 1 and 0 < df["share_below_threshold"][3] < 1


def slow_bins(values: list[float], width: float) -> list[tuple[float, float]]:
    """(bin_low, bin_high] of each value: right-closed bins of `width`."""
    return [(math.ceil(x / width) * width + 0.0 - width, math.ceil(x / width) * width + 0.0) for x in values]


@pytest.mark.parametrize("mode,similarity,max_score", [("approx", "cos", 2.0), ("exact", "cos", 1.0),
                                                        ("approx", "dot", None)])  # fmt: skip
def test_pos_neg_sums_share_over_the_maximum_by_score_bin(tmp_path, mode, similarity, max_score):
    run, data = random_run(tmp_path, "r", np.random.default_rng(6), n_pairs=50, mode=mode, similarity=similarity)
    data["pairs"][0]["score"] = -0.1  # its bin is (-0.25, 0.0], not (-0.25, -0.0]
    write_table(run, "pairs", data["pairs"])
    for override in (None, 1.5):
        df = run_sql(run, "pos_neg_sums.sql", **({} if override is None else {"max_score": override}))
        assert df.columns == ["score_bin", "bin_low", "bin_high", "n_pairs", "mean_score", "mean_attribution_sum",
                              "mean_positive_sum", "mean_negative_sum", "max_positive_sum", "min_negative_sum",
                              "n_positive_exceeds", "share_positive_exceeds", "max_score", "mode",
                              "similarity"]  # fmt: skip
        limit = override if override is not None else max_score
        scores = [p["score"] for p in data["pairs"]]
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for p, key in zip(data["pairs"], slow_bins(scores, 0.25)):
            groups[key].append(p)
        groups[("all",)] = data["pairs"]
        assert df["score_bin"][-1] == "all" and "(-0.25, 0.0]" in df["score_bin"].to_list()
        assert len(df) == len(groups)
        for row in df.iter_rows(named=True):
            key = ("all",) if row["score_bin"] == "all" else (row["bin_low"], row["bin_high"])
            rows = groups[key]
            positive = [p["positive_sum"] for p in rows]
            assert row["n_pairs"] == len(rows) and row["mean_positive_sum"] == pytest.approx(np.mean(positive))
            assert row["max_score"] == limit and (row["mode"], row["similarity"]) == (mode, similarity)
            if limit is None:
                assert row["share_positive_exceeds"] is None
            else:
                assert row["n_positive_exceeds"] == sum(x > limit for x in positive)
                assert row["share_positive_exceeds"] == pytest.approx(np.mean([x > limit for x in positive]))


# --------------------------------------------------------------------------- agreement
AGREEMENT_COLUMNS = ["score_bin", "bin_low", "bin_high", "n_pairs", "n_correlated", "spearman_mean", "spearman_std",
                     "pearson_mean", "pearson_std", "jaccard_top3_mean", "jaccard_top3_std", "jaccard_top10_mean",
                     "jaccard_top10_std", "level", "include_special", "top_by"]  # fmt: skip


def slow_agreement(pairs1, pairs2, cells1, cells2, sentences, include_special=True, top_by="abs", ij=("i", "j")):
    """Per compared pair: (mean score, spearman, pearson, jaccard top-3, top-10) by scipy and sorted(), over the
    cells of both runs (content cells only unless include_special; ij: the cell columns), None for no
    correlation."""
    specials = {s["sentence_id"]: {k for k, w in enumerate(s["word_ids"]) if w is None} for s in sentences}
    p2 = {p["pair_id"]: p for p in pairs2}
    by1, by2 = defaultdict(dict), defaultdict(dict)
    for rows, by in ((cells1, by1), (cells2, by2)):
        for c in rows:
            by[c["pair_id"]][c[ij[0]], c[ij[1]]] = c["value"]

    def top(cells: dict, k: int) -> set:
        key = (lambda kv: (-abs(kv[1]), kv[0])) if top_by == "abs" else (lambda kv: (-kv[1], kv[0]))
        return {cell for cell, _ in sorted(cells.items(), key=key)[:k]}

    out = []
    for p in pairs1:
        pid, q = p["pair_id"], p2.get(p["pair_id"])
        if q is None or any(p[k] != q[k] for k in ("sentence_id_a", "sentence_id_b", "n_tokens_a", "n_tokens_b")):
            continue
        keys = sorted(set(by1[pid]) & set(by2[pid]))
        if not include_special:
            sa, sb = specials[p["sentence_id_a"]], specials[p["sentence_id_b"]]
            keys = [k for k in keys if k[0] not in sa and k[1] not in sb]
        if not keys:
            continue
        c1, c2 = {k: by1[pid][k] for k in keys}, {k: by2[pid][k] for k in keys}
        x, y = [c1[k] for k in keys], [c2[k] for k in keys]
        varies = len(set(x)) > 1 and len(set(y)) > 1
        jac = [len(top(c1, k) & top(c2, k)) / len(top(c1, k) | top(c2, k)) for k in (3, 10)]
        out.append(((p["score"] + q["score"]) / 2, stats.spearmanr(x, y).statistic if varies else None,
                    stats.pearsonr(x, y).statistic if varies else None, *jac))  # fmt: skip
    return out


def check_agreement_rows(df: pl.DataFrame, per_pair: list[tuple], width: float) -> None:
    """agreement.sql's rows against per-pair numbers: the bins' and 'all''s counts, means and spreads."""
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for row, key in zip(per_pair, slow_bins([r[0] for r in per_pair], width)):
        groups[key].append(row)
    groups[("all",)] = per_pair
    assert len(df) == len(groups) and df["score_bin"][-1] == "all"
    for row in df.iter_rows(named=True):
        rows = groups[("all",) if row["score_bin"] == "all" else (row["bin_low"], row["bin_high"])]
        assert row["n_pairs"] == len(rows)
        for k, name in enumerate(("spearman", "pearson", "jaccard_top3", "jaccard_top10"), start=1):
            values = [r[k] for r in rows if r[k] is not None]
            if not values:
                assert row[f"{name}_mean"] is None, name
                continue
            assert row[f"{name}_mean"] == pytest.approx(np.mean(values), rel=1e-9), name
            if len(values) > 1:
                assert row[f"{name}_std"] == pytest.approx(np.std(values, ddof=1), rel=1e-6, abs=1e-12), name
            else:
                assert row[f"{name}_std"] is None


@pytest.mark.parametrize("include_special,top_by", [(False, "abs"), (True, "abs"), (False, "value"), (True, "value")])
def test_agreement_per_pair_spearman_pearson_jaccard_by_bin(tmp_path, include_special, top_by):
    """Per pair against scipy and sorted(), by bins of 0.25 and 0.5: content cells (the default: the paper's) or all
    cells, top-K by |value| (the default) or by signed value."""
    rng = np.random.default_rng(7)
    run1, data1 = random_run(tmp_path, "r1", rng, n_pairs=14)
    cells2 = []
    for c in data1["cells"]:
        value = c["value"] + float(rng.normal(0, 0.05))
        if c["pair_id"] == "p00":
            value = round(value, 1)  # ties in run 2
        cells2.append({**c, "value": value})
    for c in data1["cells"]:
        if c["pair_id"] == "p02" and c["i"] < 2:
            c["value"] = 0.5 if c["j"] % 2 else -0.5  # ties in |value| among the top cells of run 1
    pairs2 = [{**p, "score": p["score"] + float(rng.normal(0, 0.05))} for p in data1["pairs"][1:]]  # p00 only in run 1
    # Same pair ids, cells on the same (i, j), but not the same pair: another text (p03) or another tokenisation
    # (p04): left out, not compared cell by cell.
    pairs2[2]["sentence_id_b"] = "another-text"
    pairs2[3]["n_tokens_a"] += 1
    pairs1, cells1 = data1["pairs"], data1["cells"]
    # p01: cells pruned in run 2 (as --min-abs would), so the pair is compared on the cells of both
    cells2 = [c for c in cells2 if c["pair_id"] != "p01" or (c["i"] + c["j"]) % 3]
    write_table(run1, "cells", cells1)
    run2 = make_run(tmp_path, "r2", pairs2, cells2, [], data1["sentences"], mode="exact")
    per_pair = slow_agreement(pairs1, pairs2, cells1, cells2, data1["sentences"], include_special, top_by)
    assert len(per_pair) == 11
    variables = {"top_by": top_by} if top_by != "abs" else {}
    if include_special:
        variables["include_special"] = True
    df_default = run_sql(run1, "agreement.sql", run2, **variables)
    for width in (0.25, 0.5):
        df = df_default if width == 0.25 else run_sql(run1, "agreement.sql", run2, bin_width=width, **variables)
        assert df.columns == AGREEMENT_COLUMNS
        assert set(df["level"]) == {"token"} and set(df["include_special"]) == {include_special}
        assert set(df["top_by"]) == {top_by}
        assert df["n_correlated"].to_list() == df["n_pairs"].to_list()  # every pair here has a correlation
        check_agreement_rows(df, per_pair, width)
    all_row = df.row(len(df) - 1, named=True)
    assert all_row["n_pairs"] == 11 and 0 < all_row["jaccard_top10_mean"] < 1 and 0 < all_row["spearman_mean"] < 1
    from polars.testing import assert_frame_equal

    assert_frame_equal(run_sql(run1, "agreement.sql", run2, pair_fraction=1.0, **variables), df_default)
    subset = run_sql(run1, "agreement.sql", run2, pair_fraction=0.5, **variables).row(-1, named=True)["n_pairs"]
    assert 0 < subset < 11 and subset == run_sql(run1, "agreement.sql", run2, pair_fraction=0.5,
                                                 **variables)["n_pairs"][-1]  # fmt: skip


def test_agreement_word_level_is_the_word_matrices(tmp_path):
    """level 'word': word_cells compared as the token cells are (u, v for i, j), against scipy."""
    rng = np.random.default_rng(29)
    run1, data = random_run(tmp_path, "w1", rng, n_pairs=10)
    words2 = [{**c, "value": c["value"] + float(rng.normal(0, 0.05))} for c in data["word_cells"]]
    pairs2 = [{**p, "score": p["score"] + 0.1} for p in data["pairs"]]
    run2 = make_run(tmp_path, "w2", pairs2, data["cells"], words2, data["sentences"])
    per_pair = slow_agreement(data["pairs"], pairs2, data["word_cells"], words2, data["sentences"], True, "abs",
                              ij=("u", "v"))  # fmt: skip
    for variables in ({"level": "word"}, {"level": "word", "include_special": False}):
        df = run_sql(run1, "agreement.sql", run2, **variables)
        assert set(df["level"]) == {"word"} and set(df["include_special"]) == {True}  # words have no specials
        check_agreement_rows(df, per_pair, 0.25)
    token = run_sql(run1, "agreement.sql", run2)
    assert token["spearman_mean"][-1] != df["spearman_mean"][-1]  # the token cells are another matrix
    for name, value in (("level", "sentence"), ("top_by", "signed")):
        with pytest.raises(Exception, match=name):
            run_sql(run1, "agreement.sql", run2, **{name: value})


# --------------------------------------------------------------------------- agreement on the stored ranks
def stored_ranks_copy(root: Path, name: str, run: Path, min_abs: float = 0.0) -> Path:
    """A copy of a hand-built run with what the job stores since store version 3, computed here with scipy's rankdata
    and sorted(): each cell's average rank among its pair's cells (value_rank) and content cells (content_rank, null
    for a special token's cell), each word cell's among the word cells, and per pair the top-10 lists (largest |value|
    or value first, ties by the smaller row, then column); the manifest says version 3 and `min_abs`."""
    con = sqlrun.connect(run)
    pairs, cells, words, sentences = (con.sql(f"select * from {t}").pl().to_dicts()
                                      for t in ("pairs", "cells", "word_cells", "sentences"))  # fmt: skip
    specials = {x["sentence_id"]: {k for k, w in enumerate(x["word_ids"]) if w is None} for x in sentences}
    by_pair: dict[str, dict[str, list]] = defaultdict(lambda: {"cells": [], "words": []})
    for c in cells:
        by_pair[c["pair_id"]]["cells"].append(c)
    for c in words:
        by_pair[c["pair_id"]]["words"].append(c)

    def rank(rows: list[dict], column: str) -> None:
        for row, r in zip(rows, stats.rankdata([x["value"] for x in rows], method="average")):
            row[column] = float(r)

    def top(rows: list[dict], by: str, ij: tuple[str, str]) -> list[dict]:
        key = (lambda x: (-abs(x["value"]), x[ij[0]], x[ij[1]])) if by == "abs" else (
            lambda x: (-x["value"], x[ij[0]], x[ij[1]]))
        return [{ij[0]: x[ij[0]], ij[1]: x[ij[1]]} for x in sorted(rows, key=key)[:10]]

    for p in pairs:
        own = by_pair[p["pair_id"]]
        sa, sb = specials[p["sentence_id_a"]], specials[p["sentence_id_b"]]
        content = [c for c in own["cells"] if c["i"] not in sa and c["j"] not in sb]
        for c in own["cells"]:
            c["content_rank"] = None
        rank(own["cells"], "value_rank")
        rank(content, "content_rank")
        rank(own["words"], "value_rank")
        for by in ("abs", "value"):
            p[f"top10_{by}"] = top(own["cells"], by, ("i", "j"))
            p[f"content_top10_{by}"] = top(content, by, ("i", "j"))
            p[f"word_top10_{by}"] = top(own["words"], by, ("u", "v"))
    out = make_run(root, name, pairs, cells, words, sentences)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["config"].update(store_version=3, min_abs=min_abs)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def agreement_path(run1: Path, run2: Path, **variables: Any) -> tuple[pl.DataFrame, bool, str]:
    """agreement.sql's rows, whether it took the stored ranks (its first statement's decision) and the plan of
    its query."""
    import duckdb

    con = sqlrun.connect(run1, run2, variables)
    df = sqlrun.run_file(con, SQL / "agreement.sql")
    stored = con.execute("select getvariable('agreement_stored_ranks')").fetchall()[0][0]
    query = duckdb.extract_statements(sqlfiles.text(SQL / "agreement.sql"))[-1].query
    plan = "\n".join(row[1] for row in con.execute("explain " + query).fetchall())
    return df, stored, plan


def sorts(plan: str) -> bool:
    """The plan ranks cells in a window (rank() over a partition), beyond numbering the pairs (row_number())."""
    return re.search(r"rank\(\) OVER \(PARTITION BY", plan) is not None


def test_agreement_on_stored_ranks_equals_ranking_here(tmp_path):
    """Two whole runs whose store holds the ranks: agreement.sql takes them (no window sort in its plan) and gives
    what ranking here gives (use_stored_ranks=false) and what scipy and sorted() give, at every setting (content
    or all cells, top-K by |value| or value, token or word level); with ties in values and in |value| at the top,
    a pair constant in one run and a pair left out. Where the stored ranks do not apply (a run pruned by
    --min-abs, a store without them, other special tokens for content cells) it ranks here."""
    rng = np.random.default_rng(31)
    run1, data = random_run(tmp_path, "s1", rng, n_pairs=16)
    cells2, words2 = [], []
    for c in data["cells"]:
        value = c["value"] + float(rng.normal(0, 0.05))
        if c["pair_id"] == "p00":
            value = round(value, 1)  # coarse ties in run 2
        elif c["pair_id"] == "p01":
            value = -0.125  # constant in run 2: no correlation
        elif c["pair_id"] == "p02" and c["i"] < 2:
            value = 0.5 if c["j"] % 2 else -0.5  # ties in |value| among the top cells
        cells2.append({**c, "value": value})
    words2 = [{**c, "value": c["value"] + float(rng.normal(0, 0.05))} for c in data["word_cells"]]
    pairs2 = [{**p, "score": p["score"] + float(rng.normal(0, 0.05))} for p in data["pairs"]]
    pairs2[3]["n_tokens_a"] += 1  # another tokenisation: left out
    plain2 = make_run(tmp_path, "s2", pairs2, cells2, words2, data["sentences"], mode="exact")
    ranked1, ranked2 = stored_ranks_copy(tmp_path, "s1r", run1), stored_ranks_copy(tmp_path, "s2r", plain2)
    for level, include_special, top_by in [("token", False, "abs"), ("token", True, "abs"), ("token", False, "value"),
                                           ("token", True, "value"), ("word", True, "abs"), ("word", True, "value")]:
        variables = {"level": level, "include_special": include_special, "top_by": top_by}
        got, stored, plan = agreement_path(ranked1, ranked2, **variables)
        want, sorted_here, plan_here = agreement_path(ranked1, ranked2, use_stored_ranks=False, **variables)
        assert stored and not sorted_here
        assert not sorts(plan) and sorts(plan_here)
        assert_same_agreement(got, want, str(variables))
        rows1, rows2, ij = ((data["cells"], cells2, ("i", "j")) if level == "token" else
                            (data["word_cells"], words2, ("u", "v")))  # fmt: skip
        per_pair = slow_agreement(data["pairs"], pairs2, rows1, rows2, data["sentences"], include_special, top_by, ij)
        assert len(per_pair) == 15
        check_agreement_rows(got, per_pair, 0.25)
        assert got["n_correlated"][-1] == (14 if level == "token" else 15)  # p01 is constant in run 2's cells
    # Where the stored ranks do not apply, it ranks here, and says so.
    pruned2 = stored_ranks_copy(tmp_path, "s2p", plain2, min_abs=0.05)
    for run1_, run2_ in ((ranked1, pruned2), (run1, ranked2), (ranked1, plain2)):
        got, stored, plan = agreement_path(run1_, run2_)
        assert not stored and sorts(plan)
    other = [{**x, "word_ids": [None, None, *x["word_ids"][2:]]} if x["sentence_id"] == data["pairs"][5][
        "sentence_id_a"] else x for x in data["sentences"]]  # fmt: skip
    specials2 = stored_ranks_copy(tmp_path, "s2s", make_run(tmp_path, "s2o", pairs2, cells2, words2, other))
    assert not agreement_path(ranked1, specials2)[1]  # content cells: run 1's special tokens
    assert agreement_path(ranked1, specials2, include_special=True)[1]  # every cell: the specials do not matter


# --------------------------------------------------------------------------- degenerate pairs: null, not NaN
def degenerate_runs(root: Path) -> tuple[Path, Path, dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Two runs of 10 pairs, all compared: p00's values are constant in run 2, p01 shares one cell (run 2 keeps
    only (1, 1), as --min-abs pruning can). Those two score 0.9 (the (0.75, 1.0] bin), the others at most 0.7.
    Returns both runs, run 1's rows and run 2's cells."""
    rng = np.random.default_rng(12)
    run1, data = random_run(root, "d1", rng, n_pairs=10)
    for p in data["pairs"]:
        p["score"] = 0.9 if p["pair_id"] in ("p00", "p01") else min(p["score"], 0.7)
    write_table(run1, "pairs", data["pairs"])
    cells2 = [{**c, "value": 0.25 if c["pair_id"] == "p00" else c["value"] + float(rng.normal(0, 0.05))}
              for c in data["cells"] if c["pair_id"] != "p01" or (c["i"], c["j"]) == (1, 1)]  # fmt: skip
    run2 = make_run(root, "d2", data["pairs"], cells2, [], data["sentences"], mode="exact")
    return run1, run2, data, cells2


def test_agreement_degenerate_pairs_are_null_and_counted_not_nan_or_an_error(tmp_path):
    run1, run2, data, cells2 = degenerate_runs(tmp_path)
    df = run_sql(run1, "agreement.sql", run2, include_special=True)  # no "STDDEV_SAMP is out of range"
    assert no_nan(df)
    by_pair2 = defaultdict(dict)
    for c in cells2:
        by_pair2[c["pair_id"]][c["i"], c["j"]] = c["value"]
    assert len(by_pair2["p01"]) == 1 and len(set(by_pair2["p00"].values())) == 1  # the two degenerate pairs
    per_pair = slow_agreement(data["pairs"], data["pairs"], data["cells"], cells2, data["sentences"])
    assert [r[1] is None for r in per_pair] == [True, True] + [False] * 8  # p00, p01: no correlation
    spearman, pearson = [r[1] for r in per_pair[2:]], [r[2] for r in per_pair[2:]]
    jaccard3, jaccard10 = [r[3] for r in per_pair], [r[4] for r in per_pair]
    rows = records(df, "score_bin")
    total, top_bin = rows["all"], rows["(0.75, 1.0]"]
    # Counted in n_pairs and the Jaccard columns; the correlations are over the 8 other pairs.
    assert (total["n_pairs"], total["n_correlated"]) == (10, 8)
    assert close(total["spearman_mean"], float(np.mean(spearman)))
    assert total["spearman_std"] == pytest.approx(np.std(spearman, ddof=1), rel=1e-6)
    assert close(total["pearson_mean"], float(np.mean(pearson)))
    assert total["pearson_std"] == pytest.approx(np.std(pearson, ddof=1), rel=1e-6)
    assert close(total["jaccard_top3_mean"], float(np.mean(jaccard3)))
    assert close(total["jaccard_top10_mean"], float(np.mean(jaccard10)))
    # A bin of degenerate pairs only: no correlation at all, null (never NaN); its Jaccard still there.
    assert (top_bin["n_pairs"], top_bin["n_correlated"]) == (2, 0)
    for col in ("spearman_mean", "spearman_std", "pearson_mean", "pearson_std"):
        assert top_bin[col] is None, col
    assert close(top_bin["jaccard_top3_mean"], float(np.mean(jaccard3[:2])))
    assert sum(r["n_pairs"] for r in rows.values()) == 20  # the bins and 'all'
    # The duckdb CLI, as documented: no error, NULL and no nan.
    cli = subprocess.run([str(DUCKDB_CLI), "-csv", "-cmd", f"set variable run = '{run1}'", "-cmd",
                          f"set variable run2 = '{run2}'", "-cmd", "set variable include_special = true", "-f",
                          "sql/agreement.sql"], cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    assert cli.returncode == 0 and not cli.stderr, cli.stderr
    assert "nan" not in cli.stdout.lower() and "NULL" in cli.stdout


# --------------------------------------------------------------------------- agreement: equal to the reference
AGREEMENT_REFERENCE = ROOT / "tests" / "sql_reference" / "agreement_windows.sql"


def assert_same_agreement(got: pl.DataFrame, want: pl.DataFrame, case: str) -> None:
    """Row for row: the same bins and counts, floats equal up to rounding, null exactly where null (the columns of
    `want`: the reference query has no settings columns)."""
    assert got.columns[: len(want.columns)] == want.columns, case
    assert got.height == want.height, (case, got, want)
    for g, w in zip(got.iter_rows(named=True), want.iter_rows(named=True)):
        for col in want.columns:
            if col in ("score_bin", "bin_low", "bin_high", "n_pairs", "n_correlated", "level", "include_special",
                       "top_by"):  # fmt: skip
                assert g[col] == w[col], (case, col, g, w)
            else:
                assert close(g[col], w[col]), (case, col, g[col], w[col])


def agreement_case_runs(root: Path) -> dict[str, tuple[Path, Path]]:
    """Pairs of runs that stress what the two queries could disagree on: ties in values and in |value| (values
    rounded to 0.01 and 0.1, +-v pairs), constant pairs, one-cell pairs, pairs with no matched cell, cells pruned
    as --min-abs prunes them, pairs left out (other texts, other token counts, in one run only), pairs whose top
    cells all lie at one end of the value order (all positive, all negative), and a run against itself."""
    rng = np.random.default_rng(19)
    cases: dict[str, tuple[Path, Path]] = {}
    run1, data1 = random_run(root, "t1", rng, n_pairs=30)  # values rounded to 0.01: ties
    cells1 = []
    for c in data1["cells"]:
        k = int(c["pair_id"][1:])
        if k % 6 == 1:
            c = {**c, "value": abs(c["value"]) + 0.01}  # all positive: the top cells are the largest values
        elif k % 6 == 2:
            c = {**c, "value": -abs(c["value"]) - 0.01}  # all negative: the top cells are the smallest values
        elif k % 6 == 3 and c["i"] < 3:
            c = {**c, "value": 0.5 if (c["i"] + c["j"]) % 2 else -0.5}  # ties in |value| at the top
        elif k == 4:
            c = {**c, "value": 0.25}  # constant in run 1
        cells1.append(c)
    write_table(run1, "cells", cells1)
    cells2, pairs2 = [], []
    for p in data1["pairs"]:
        k = int(p["pair_id"][1:])
        if k == 29:
            continue  # in run 1 only
        p2 = {**p, "score": p["score"] + float(rng.normal(0, 0.1))}
        if k == 28:
            p2["sentence_id_b"] = "another-text"
        if k == 27:
            p2["n_tokens_a"] += 1
        pairs2.append(p2)
    for c in cells1:
        k = int(c["pair_id"][1:])
        value = c["value"] + float(rng.normal(0, 0.05))
        if k % 5 == 0:
            value = round(value, 1)  # coarse ties in run 2
        if k == 10:
            value = -0.125  # constant in run 2
        if k == 11 and (c["i"], c["j"]) != (1, 2):
            continue  # one matched cell
        if k == 12 and c["i"] % 2 == 0:
            continue  # pruned: compared on the cells of both
        if k == 13:
            continue  # no cell of this pair in run 2: left out
        cells2.append({**c, "value": value})
    run2 = make_run(root, "t2", pairs2, cells2, [], data1["sentences"], mode="exact")
    cases["ties, degenerate and left-out pairs"] = (run1, run2)
    cases["a run against itself"] = (run1, run1)
    # --min-abs as the job applies it: each run keeps the cells with |value| >= its threshold
    for name, threshold, cells in (("m1", 0.05, cells1), ("m2", 0.08, cells2)):
        kept = [c for c in cells if abs(c["value"]) >= threshold]
        source = data1["pairs"] if name == "m1" else pairs2
        counts = {p["pair_id"]: sum(c["pair_id"] == p["pair_id"] for c in kept) for p in source}
        make_run(root, name, [{**p, "n_cells": counts[p["pair_id"]]} for p in source], kept, [], data1["sentences"])
    cases["both runs pruned (--min-abs 0.05 / 0.08)"] = (root / "m1", root / "m2")
    run1d, run2d, _, _ = degenerate_runs(root)
    cases["degenerate_runs"] = (run1d, run2d)
    return cases


def test_agreement_equals_the_window_function_reference(tmp_path):
    """sql/agreement.sql against the query it replaced (tests/sql_reference/agreement_windows.sql): the same rows
    on every case, by score bins of 0.25 and of 0.05 (nearly a pair per bin, so the per-pair numbers are compared
    through the means and spreads of small bins), on all pairs and on the pair_fraction subset."""
    assert "window" in AGREEMENT_REFERENCE.read_text() and "over by_value_1" in AGREEMENT_REFERENCE.read_text()
    cases = agreement_case_runs(tmp_path)
    covered = set()
    for case, (run1, run2) in cases.items():
        for variables in ({}, {"bin_width": 0.05}, {"bin_width": 0.05, "pair_fraction": 0.5}):
            con = sqlrun.connect(run1, run2, variables)
            want = sqlrun.run_file(con, AGREEMENT_REFERENCE)
            got = run_sql(run1, "agreement.sql", run2, include_special=True, **variables)  # the reference's cells
            assert_same_agreement(got, want, f"{case} {variables}")
            assert no_nan(got)
            total = got.row(-1, named=True)
            if total["n_correlated"] < total["n_pairs"]:
                covered.add("pairs without a correlation")
            if 0 < total["n_pairs"] and total["jaccard_top10_mean"] < 1:
                covered.add("top-10 sets that differ")
            if got.height > 3:
                covered.add("several bins")
    assert covered == {"pairs without a correlation", "top-10 sets that differ", "several bins"}
    # The cases hold what they claim: ties in both runs, a pair with no matched cell, one with a single one.
    run1, run2 = cases["ties, degenerate and left-out pairs"]
    con = sqlrun.connect(run1, run2)
    ties = con.execute("""select count(*) filter (where n > 1) from (select pair_id, value, count(*) as n from cells
                      group by all)""").fetchall()[0][0]  # fmt: skip
    matched = dict(con.execute("""select pair_id, count(c2.value) from cells c1 left join cells_2 c2 using (pair_id, i, j)
                              group by 1""").fetchall())  # fmt: skip
    assert ties > 50 and matched["p13"] == 0 and matched["p11"] == 1


@pytest.mark.slow
def test_agreement_equals_the_reference_on_real_runs(real_runs, tmp_path):
    """The same on the small real runs (all-MiniLM-L6-v2 through the job): a run against
    itself, and against a copy pruned as --min-abs would (the cells with |value| at least the median |value| of the
    run; n_cells the rows kept); all cells against the reference, and content cells (the default) against the
    reference on copies without the special tokens' cells."""
    stsb = real_runs["stsb"]
    con = sqlrun.connect(stsb)
    threshold = con.execute("select median(abs(value)) from cells").fetchall()[0][0]
    cells = con.sql(f"select * from cells where abs(value) >= {threshold}").pl().to_dicts()
    kept = defaultdict(int)
    for c in cells:
        kept[c["pair_id"]] += 1
    pairs = con.sql("select * from pairs").pl().to_dicts()
    sentences = con.sql("select * from sentences").pl().to_dicts()
    pruned = make_run(tmp_path, "pruned", [{**p, "n_cells": kept[p["pair_id"]]} for p in pairs], cells, [], sentences)
    assert min(kept.values()) > 0
    content = "token_a not in ('[CLS]', '[SEP]') and token_b not in ('[CLS]', '[SEP]')"
    no_specials = {}
    for run in (stsb, pruned):
        rows = sqlrun.connect(run).sql(f"select * from cells where {content}").pl().to_dicts()
        no_specials[run] = make_run(tmp_path, f"{run.name}-content", pairs, rows, [], sentences)
    for run2 in (stsb, pruned):
        for variables in ({}, {"bin_width": 0.05}):
            want = sqlrun.run_file(sqlrun.connect(stsb, run2, variables), AGREEMENT_REFERENCE)
            got = run_sql(stsb, "agreement.sql", run2, include_special=True, **variables)
            assert_same_agreement(got, want, f"{run2.name} {variables}")
            assert got.row(-1, named=True)["n_pairs"] == 8
            want = sqlrun.run_file(sqlrun.connect(no_specials[stsb], no_specials[run2], variables), AGREEMENT_REFERENCE)
            got = run_sql(stsb, "agreement.sql", run2, **variables)
            assert_same_agreement(got, want, f"content {run2.name} {variables}")


def test_table1_undefined_spearman_is_null_not_nan(tmp_path):
    run, data = random_run(tmp_path, "r", np.random.default_rng(13), n_pairs=6)
    cases = {
        "constant labels": [{**p, "label": 3.0} for p in data["pairs"]],
        "constant scores": [{**p, "score": 0.5} for p in data["pairs"]],
        "one labelled pair": [{**p, "label": p["label"] if p["pair_id"] == "p00" else None} for p in data["pairs"]],
    }
    for case, pairs in cases.items():
        write_table(run, "pairs", pairs)
        row = run_sql(run, "table1.sql").row(0, named=True)
        assert row["n_pairs"] == (1 if case == "one labelled pair" else 6), case
        assert (row["spearman_x100"], row["spearman"], row["pearson"]) == (None, None, None), (case, row)


def self_cells_run(root: Path, name: str, values: dict[str, float]) -> Path:
    """One pair of two sentences of the tokens of `values`: each token's same-token cell is its value."""
    sa, sb = sentence(f"{name}-a", list(values)), sentence(f"{name}-b", list(values))
    cells = [{"pair_id": "p00", "i": i, "j": j, "token_a": ta, "token_b": tb,
              "value": values.get(ta, 0.0) if ta == tb else 0.0}
             for i, ta in enumerate(sa["tokens"]) for j, tb in enumerate(sb["tokens"])]  # fmt: skip
    pair = {"pair_id": "p00", "row": 0, "split": "test", "text_a": sa["text"], "text_b": sb["text"],
            "sentence_id_a": sa["sentence_id"], "sentence_id_b": sb["sentence_id"],
            "n_tokens_a": sa["n_tokens"], "n_tokens_b": sb["n_tokens"], "score": 0.5}  # fmt: skip
    return make_run(root, name, [pair], cells, [], [sa, sb])


def test_lexical_ranks_compare_undefined_spearman_is_null_not_nan(tmp_path):
    run = self_cells_run(tmp_path, "r", {"cat": 0.5, "dog": 0.1, "big": -0.2})
    cases = {  # run2's values -> (n_shared, spearman)
        "one shared token": ({"cat": 0.3, "house": 0.2}, 1, None),
        "all shared means tied": ({"cat": 0.25, "dog": 0.25, "big": 0.25}, 3, None),
        "same order": ({"cat": 0.4, "dog": 0.2, "big": 0.0}, 3, 1.0),
    }
    for case, (values, n_shared, rho) in cases.items():
        df = run_sql(run, "lexical_ranks_compare.sql", self_cells_run(tmp_path, case.replace(" ", "-"), values),
                     min_count=1, include_special=False)  # fmt: skip  (the words' ranks: the cases are about them)
        assert df["n_shared"].to_list() == [n_shared] * n_shared, case
        assert all(close(x, rho) for x in df["spearman"].to_list()), (case, df["spearman"].to_list())


def test_close_tells_nan_from_null():
    nan = float("nan")
    assert close(None, None) and close(nan, nan) and close(0.5, 0.5 + 1e-12)
    assert not close(None, nan) and not close(nan, None) and not close(None, 0.0) and not close(nan, 0.0)


# --------------------------------------------------------------------------- the duckdb CLI, as documented
def store_for(name: str, root: Path) -> tuple[Path, Path | None]:
    """A hand-built run (and second run) on which `name` returns rows."""
    if name in ("negation.sql", "negation_signs.sql"):
        return negation_run(root), None
    if name == "adjectives.sql":
        return adjectives_run(root), None
    if name in ("syntactic_relations.sql", "syntactic_relations_pairs.sql"):
        return relations_run(root), None
    run, data = random_run(root, "r", np.random.default_rng(8), n_pairs=20)
    if name not in TWO_RUN_FILES:
        return run, None
    cells2 = [{**c, "value": c["value"] * 0.5 + 0.01 * (c["i"] - c["j"])} for c in data["cells"]]
    return run, make_run(root, "r2", data["pairs"], cells2, [], data["sentences"])


def test_variable_defaults_are_read_from_the_sql_files(tmp_path):
    """jobs.sqlfiles.default gives the literal of a file's `coalesce(getvariable(name), literal)` as DuckDB reads it;
    the analyses take their defaults from there (declared once)."""
    from jobs.analyses import agreement, lexical_ranks, lexical_ranks_compare, syntactic_relations

    con, seen = duckdb.connect(), 0
    for path in sqlfiles.sources():
        for name, _ in set(re.findall(sqlfiles._DEFAULT_RE.format(name=r"(\w+)"), sqlfiles.text(path), re.I)):
            value = sqlfiles.default(str(path), name)  # one default per file
            literal = re.search(sqlfiles._DEFAULT_RE.format(name=name), sqlfiles.text(path), re.I).group(1)
            want = con.execute(f"select {literal}").fetchone()[0]  # a decimal for 0.25
            assert isinstance(value, bool) == isinstance(want, bool) and isinstance(value, str) == isinstance(want, str)
            assert value == (want if isinstance(want, (bool, str)) else pytest.approx(float(want))), (path.name, name)
            seen += 1
    assert seen >= 10
    assert (lexical_ranks.MIN_COUNT, lexical_ranks_compare.INCLUDE_SPECIAL, agreement.BIN_WIDTH,
            syntactic_relations.TOP_SHARE) == (30, True, 0.25, 0.10)  # fmt: skip
    bad = tmp_path / "two.sql"
    bad.write_text("select coalesce(getvariable('k'), 1), coalesce(getvariable('k'), 2), 'it''s'", encoding="utf-8")
    with pytest.raises(ValueError, match="2 defaults of variable k"):
        sqlfiles.default(str(bad), "k")
    with pytest.raises(ValueError, match="0 defaults of variable absent"):
        sqlfiles.default(str(bad), "absent")
    bad.write_text("select coalesce(getvariable('s'), 'it''s')", encoding="utf-8")
    assert sqlfiles.default(str(bad), "s") == "it's"


def test_each_file_header_states_its_variables_defaults_as_the_file_sets_them():
    """A file's `-- Params` block names every variable it gives a default, with that default (numbers by value)."""
    literal = r"\(?('(?:[^']|'')*'|true|false|-?\d+(?:\.\d+)?)"
    checked = 0
    for path in sqlfiles.sources():
        own = path.read_text(encoding="utf-8")  # its own defaults, not those of the files it .reads
        block = re.search(r"^-- Params(.*?)(?=^-- [A-Z][a-z]+ |^(?!--))", own, re.S | re.M)
        for name, _ in set(re.findall(sqlfiles._DEFAULT_RE.format(name=r"(\w+)"), own, re.I)):
            stated = re.search(rf"\b{name}\s+{literal}", block.group(1) if block else "", re.I)
            assert stated, f"{path.name}: -- Params does not state {name}'s default"
            said, default = stated.group(1).lower(), sqlfiles.default(str(path), name)
            if isinstance(default, bool) or isinstance(default, str):
                assert said.strip("'") == str(default).lower(), (path.name, name, said)
            else:
                assert float(said) == default, (path.name, name, said)
            checked += 1
    assert checked >= 15


@pytest.mark.parametrize("name", FILES)
def test_duckdb_cli_runs_each_file_as_documented(tmp_path, name):
    run, run2 = store_for(name, tmp_path)
    cmds = ["-cmd", f"set variable run = '{run}'"]
    if run2 is not None:
        cmds += ["-cmd", f"set variable run2 = '{run2}'"]
    if name.startswith("lexical"):
        cmds += ["-cmd", "set variable min_count = 2"]
    # Exactly the documented command (box output), from the repository root ...
    shown = subprocess.run([str(DUCKDB_CLI), *cmds, "-f", f"sql/{name}"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0 and not shown.stderr, shown.stderr
    # ... and as CSV: the same rows as through Python.
    out = subprocess.run([str(DUCKDB_CLI), "-csv", *cmds, "-f", f"sql/{name}"], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # fmt: skip
    cli = pl.read_csv(out.stdout.encode(), infer_schema_length=None, null_values="NULL")
    variables = {"min_count": 2} if name.startswith("lexical") else {}
    py = run_sql(run, name, run2, **variables)
    assert cli.columns == py.columns and cli.height == py.height > 0
    assert [c for c in cli.columns if c in shown.stdout]  # the table shows the columns
    for col in py.columns:
        if py[col].dtype.is_float():
            assert np.allclose(cli[col].cast(pl.Float64).to_numpy(), py[col].to_numpy(), equal_nan=True), col
        elif py[col].dtype.is_nested():  # a list of numbers: the CLI writes it as [1, 2.5]
            for text, values in zip(cli[col].to_list(), py[col].to_list()):
                assert (text is None) == (values is None), col
                if values is not None:
                    assert np.allclose(json.loads(text), values), col
        else:
            assert cli[col].cast(pl.String).to_list() == py[col].cast(pl.String).to_list(), col


# --------------------------------------------------------------------------- jobs.sqlrun and `xsbert sql`
def xsbert_sql(capsys, *argv: str) -> tuple[int, str, str]:
    from jobs.cli import main as xsbert

    try:
        code = xsbert(["sql", *argv])
    except SystemExit as exc:  # a usage error, as argparse stops on it
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_connect_views_and_variables(tmp_path):
    run, _ = random_run(tmp_path, "r", np.random.default_rng(9), n_pairs=5)
    run2 = relations_run(tmp_path)
    con = sqlrun.connect(run, run2, {"min_count": 7, "word": "it's", "flag": True})
    views = {r[0] for r in con.sql("select view_name from duckdb_views() where not internal").fetchall()}
    assert views == {"pairs", "cells", "word_cells", "sentences", "quarantine",
                     "pairs_2", "cells_2", "word_cells_2", "sentences_2", "quarantine_2", "parses_2"}  # fmt: skip
    assert con.sql("select count(*) from pairs").fetchall() == [(5,)]
    assert con.sql("select count(*) from parses_2").fetchall()[0][0] > 0
    got = con.sql("select getvariable('run'), getvariable('run2'), getvariable('min_count'), getvariable('word'), "
                  "getvariable('flag')").fetchall()  # fmt: skip
    assert got == [(str(run), str(run2), 7, "it's", True)]
    with pytest.raises(InputError, match="--run"):
        sqlrun.connect(run, variables={"run": "x"})
    assert sqlrun.parse_vars(["a=3", "b=0.5", "c=true", "d=text", "e='12'", "f=null"]) == {
        "a": 3, "b": 0.5, "c": True, "d": "text", "e": "12", "f": None}


def test_run_path_with_glob_characters_reads_its_own_run(tmp_path, capsys):
    """A run under `runs[1]` (DuckDB reads `[...]`, `*`, `?` as a glob): the views and a sql/ file read that run,
    and a sibling `runs1` that the unescaped glob `runs[1]` would match is not read."""
    run, _ = random_run(tmp_path / "runs[1]*?", "r", np.random.default_rng(11), n_pairs=6)
    random_run(tmp_path / "runs1*?", "r", np.random.default_rng(12), n_pairs=4)
    code, out, err = xsbert_sql(capsys, "--run", str(run), "--csv", "select count(*) as n from pairs")
    assert (code, err) == (0, "") and out.splitlines() == ["n", "6"], (out, err)
    code, out, err = xsbert_sql(capsys, "--run", str(run), "--file", str(SQL / "lexical_ranks.sql"),
                                "--var", "min_count=3", "--csv")  # fmt: skip
    assert code == 0 and not err and "\n[CLS],6," in out, (out, err)  # this run's 6 pairs, not the sibling's 4
    con = sqlrun.connect(run, run)
    assert con.sql("select getvariable('run')").fetchall()[0][0] != str(run)  # escaped for DuckDB's glob
    assert con.sql("select count(*) from pairs_2").fetchall() == [(6,)]


def test_xsbert_sql_prints_a_table_and_csv(tmp_path, capsys):
    run, data = random_run(tmp_path, "r", np.random.default_rng(10), n_pairs=30, bias={"dog": 1.0})
    code, out, err = xsbert_sql(capsys, "--run", str(run), "select count(*) as n_pairs, max(score) as top from pairs")
    assert code == 0 and not err
    assert "n_pairs" in out and " 30 " in out and out.rstrip().endswith("1 row")
    code, out, _ = xsbert_sql(capsys, "--run", str(run), "--file", "sql/lexical_ranks.sql", "--var", "min_count=3")
    assert code == 0 and "dog" in out.splitlines()[3]  # header, rule, first row: the planted bias ranks first
    code, out, _ = xsbert_sql(capsys, "--run", str(run), "-f", "lexical_ranks", "--var", "min_count=3", "--csv")
    csv = pl.read_csv(out.encode())
    expected = run_sql(run, "lexical_ranks.sql", min_count=3)
    assert code == 0 and csv["token"].to_list() == expected["token"].to_list()
    assert np.allclose(csv["mean"].to_numpy(), expected["mean"].to_numpy())
    code, out, _ = xsbert_sql(capsys, "--run", str(run), "select * from cells", "--max-rows", "5")
    assert code == 0 and f"showing 5 of {len(data['cells'])} rows" in out
    code, out, _ = xsbert_sql(capsys, "--run", str(run), "select tokens from sentences limit 1", "--csv")
    assert code == 0 and json.loads(pl.read_csv(out.encode())["tokens"][0])[0] == "[CLS]"  # lists as JSON
    code, out, _ = xsbert_sql(capsys, "--run", str(run), "--run2", str(run), "select count(*) from cells_2")
    assert code == 0 and str(len(data["cells"])) in out


def test_xsbert_sql_bad_inputs_exit_2_with_one_line(tmp_path, capsys):
    run, _ = random_run(tmp_path, "r", np.random.default_rng(11), n_pairs=3)
    cases = [
        (["--run", str(run), "selec 1"], "syntax error"),
        (["--run", str(run), "select", "1", "--csv"],  # unquoted: argparse's line had said only `arguments: 1`
         'unrecognized arguments: 1; quote the query as one argument: "select 1" (see xsbert sql --help)'),
        (["--run", str(run), "select 1", "--bogus"], "unrecognized arguments: --bogus (see xsbert sql --help)"),
        (["--run", str(tmp_path / "missing"), "select 1"], "no such directory"),
        (["--run", str(tmp_path), "select 1"], "not a run directory"),  # the store root, not a run
        (["--run", str(run), "--file", "sql/syntactic_relations.sql"], "python -m jobs.parse --run"),
        (["--run", str(run), "select * from parses"], "python -m jobs.parse --run"),
        (["--run", str(run), "--file", "sql/agreement.sql"], "--run2"),
        (["--run", str(run), "select * from pairs_2"], "--run2"),
        (["--run", str(run), "select * from nope"], "nope"),
        (["--run", str(run), "--file", "sql/adjectives.sql"],  # not an adjectives run: was DuckDB's binder error
         f"adjectives.sql needs a run of --dataset adjectives (pairs.triplet, pairs.kind); the pairs of run {run} have "
         "no such columns"),
        (["--run", str(run)], "QUERY or --file"),
        (["--run", str(run), "select 1", "--file", "sql/table1.sql"], "QUERY or --file"),
        (["--run", str(run), "--file", "sql/nope.sql"], "no such file"),
        (["--run", str(run), "--file", "table1", "--var", "min_count"], "NAME=VALUE"),
        (["--run", str(run), "--file", "lexical_ranks", "--var", "min_cout=10"],  # a typo is not the default
         "--var min_cout: lexical_ranks reads no such variable (it reads: include_special, min_count)"),
        (["--run", str(run), "--file", "lexical_ranks", "--var", "min_count=ten"], "min_count takes a number"),
        # a variable the file sets itself is not one to give (it was listed, and the file overwrote what was given)
        (["--run", str(run), "--run2", str(run), "--file", "agreement", "--var", "agreement_stored_ranks=true"],
         "--var agreement_stored_ranks: agreement reads no such variable (it reads: bin_width, include_special, level, "
         "pair_fraction, top_by, use_stored_ranks)"),
        (["--run", str(run), "--file", "negation", "--var", "definition=2"],  # 'paper' or 'word_cells'
         "--var definition=2: definition takes a text (its default: 'paper'; quote a text that looks like a number"),
        (["--run", str(run), "select 1", "--max-rows", "0"], "--max-rows"),
        (["--run", str(run), "  "], "empty"),
    ]
    # a file of one's own: not UTF-8, `.read`ing one that is not there, or itself
    (tmp_path / "latin1.sql").write_bytes("select 'caf\u00e9'".encode("latin-1"))
    (tmp_path / "reads.sql").write_text(".read sql/lib/nope.sql\nselect 1\n", encoding="utf-8")
    (tmp_path / "self.sql").write_text(f".read {tmp_path / 'self.sql'}\nselect 1\n", encoding="utf-8")
    cases += [(["--run", str(run), "--file", str(tmp_path / "latin1.sql")], "not UTF-8 text (byte 0xe9 at offset 11)"),
              (["--run", str(run), "--file", str(tmp_path / "reads.sql")], "cannot read "),
              (["--run", str(run), "--file", str(tmp_path / "self.sql")], "reads itself")]  # fmt: skip
    (run / "manifest.json").unlink()
    cases.append((["--run", str(run), "--file", "pos_neg_sums"], "manifest.json"))
    for argv, message in cases:
        code, out, err = xsbert_sql(capsys, *argv)
        assert code == 2 and not out, argv
        assert len(err.strip().splitlines()) == 1 and err.startswith("xsbert sql: error: ") and message in err, (argv, err)


def test_empty_run_gives_empty_answers_not_errors(tmp_path):
    run = make_run(tmp_path, "empty", [], parses=[])
    write_table(run, "pairs", [], ("triplet", "kind", "template"))
    for name in FILES:
        df = run_sql(run, name, run if name in TWO_RUN_FILES else None)
        if name in ("table1.sql", "reference_terms.sql"):
            assert df["n_pairs" if name == "table1.sql" else "n"].to_list() == [0] * len(df)
        elif name in ("pos_neg_sums.sql", "agreement.sql"):
            assert df["score_bin"].to_list() == ["all"] and df["n_pairs"][0] == 0
        else:
            assert df.height == 0, name


# --------------------------------------------------------------------------- built-in datasets, --keep-columns
def test_negation_dataset_is_every_sentence_with_one_standalone_not():
    pairs = _validate.load_pairs("negation")
    rows = pairs.rows
    assert (pairs.source.split, pairs.columns.label, pairs.columns.keep) == ("test", None, ())
    # The slow definition: unique STS-B test texts whose words ([\w'’-]+ runs) contain "not" exactly once.
    stsb = pl.read_csv(_inputs.BUNDLED_STSB, separator="\t", quote_char=None, infer_schema_length=0)
    test = stsb.filter(pl.col("split") == "test")
    texts = set(test["sentence1"].to_list()) | set(test["sentence2"].to_list())
    expected = {t for t in texts if [w.lower() for w in re.findall(r"[\w'’-]+", t)].count("not") == 1}
    assert set(rows.text_a) == expected and len(rows) == len(expected) == 80 and rows.pair_id.is_unique
    for a, b in zip(rows.text_a, rows.text_b):
        words_a, words_b = re.findall(r"[\w'’-]+", a), re.findall(r"[\w'’-]+", b)
        k = [w.lower() for w in words_a].index("not")
        assert [w.lower() for w in words_a[:k] + words_a[k + 1 :]] == [w.lower() for w in words_b]
    assert _datasets.remove_not("Not a good idea.") == "A good idea."
    assert _datasets.remove_not("Why not?") == "Why?"
    for text in ("I cannot go.", "It isn't.", "A not-so-good day.", "Not now, not ever.", "Knot."):
        assert _datasets.remove_not(text) is None, text
    assert len(_validate.load_pairs("negation", split="dev").rows) > 0


def test_adjectives_dataset_triplets_templates_and_columns():
    pairs = _validate.load_pairs("adjectives")
    rows = pairs.rows
    assert pairs.columns.keep == ("triplet", "kind", "template") and pairs.columns.label is None
    assert len(rows) == 23 * len(_datasets.TEMPLATES) * 2 and rows.pair_id.is_unique
    assert rows["keep:triplet"].nunique() == 23 and set(rows["keep:kind"]) == {"synonym", "opposite"}
    assert "This house is X." in set(rows["keep:template"]) and len(_datasets.TEMPLATES) >= 3
    for a, b, triplet, kind, template in zip(rows.text_a, rows.text_b, rows["keep:triplet"], rows["keep:kind"],
                                             rows["keep:template"]):  # fmt: skip
        anchor, synonym, opposite = triplet.split("/")
        other = synonym if kind == "synonym" else opposite
        assert (a, b) == (template.replace("X", anchor), template.replace("X", other))
    with pytest.raises(InputError, match="no splits"):
        _validate.load_pairs("adjectives", split="test")


def test_keep_columns_flag_passes_columns_through_and_changes_the_run_id(tmp_path):
    from jobs.attribute import parse_args
    from jobs.attribution.prepare import run_config
    from jobs.config import JobSettings
    from jobs.store import RunStore, run_id

    path = tmp_path / "p.tsv"
    path.write_text("id\tsentence1\tsentence2\ttopic\tsource\tTarget\nx\tA b.\tC d.\tsport\tweb\t1\n"
                    "y\tE f.\tG h.\t\tnews\t2\n")
    pairs = _validate.load_pairs(str(path), keep="topic,source")
    good, _ = _validate.validate(pairs.rows, pairs.label_kind, pairs.label_range)
    assert good["keep:topic"].tolist() == ["sport", ""] and good["keep:source"].tolist() == ["web", "news"]

    class FakeExplainer:
        settings = {"model": "m", "layer": 3, "n_layers": 6, "mode": "approx", "similarity": "cos",
                    "rule": "gauss-legendre", "steps": 16, "tolerance": None, "max_steps": None}  # fmt: skip

    args = parse_args(["--dataset", str(path), "--keep-columns", "topic,source"])
    with_keep = run_config(JobSettings.from_args(args).attribution, FakeExplainer(), "w", pairs)
    without = run_config(JobSettings.from_args(args).attribution, FakeExplainer(), "w", _validate.load_pairs(str(path)))
    assert with_keep["dataset"]["columns"]["keep"] == ["topic", "source"]
    assert "keep" not in without["dataset"]["columns"]
    assert run_id(with_keep) != run_id(without)
    for bad, message in (("target", "already has a column"), ("nope", "no such column")):
        with pytest.raises(InputError, match=message):
            _validate.load_pairs(str(path), keep=bad)
    with RunStore(tmp_path, "r", ("topic",)) as store:  # the run's pairs schema has the column, as a string
        table = pa.Table.from_pylist([{"pair_id": "x", "topic": "sport"}], store.schema("pairs"))
        store.commit(0, {"pairs": table})
        store.commit_missing_tables()
    assert pq.read_schema(tmp_path / "r" / "pairs" / "part-000000.parquet").field("topic").type == pa.string()


@pytest.mark.slow
def test_the_job_stores_the_ranks_agreement_reads(real_runs, tmp_path):
    """The real job's store (all-MiniLM-L6-v2, 8 STS-B pairs): its ranks and top-10 lists are what scipy's rankdata
    and sorted() give on its stored values (stored_ranks_copy), every cell and pair; agreement.sql takes them."""
    from jobs.attribution.actors import TOP_CELLS
    from jobs.store import STORE_VERSION

    stsb = real_runs["stsb"]
    config = json.loads((stsb / "manifest.json").read_text())["config"]
    assert config["store_version"] == STORE_VERSION >= 3 and config["min_abs"] == 0
    con = sqlrun.connect(stsb, stored_ranks_copy(tmp_path, "recomputed", stsb))
    for table, ranks, cell in (("cells", ("value_rank", "content_rank"), "i, j"), ("word_cells", ("value_rank",),
                                                                                      "u, v")):  # fmt: skip
        differ = " or ".join(f"a.{r} is distinct from b.{r}" for r in ranks)
        n, n_differ, n_null = con.execute(f"""select count(*), count(*) filter (where {differ}),
            count(*) filter (where a.{ranks[-1]} is null) from {table} as a inner join {table}_2 as b
            using (pair_id, {cell})""").fetchall()[0]  # fmt: skip
        assert n == con.execute(f"select count(*) from {table}").fetchall()[0][0] > 100 and n_differ == 0
        assert (n_null > 0) == (table == "cells")  # special tokens' cells have no content rank
    differ = " or ".join(f"a.{name} is distinct from b.{name}" for name in TOP_CELLS)
    assert con.execute(f"select count(*) filter (where {differ}), count(*) from pairs as a inner join pairs_2 as b "
                       "using (pair_id)").fetchall()[0] == (0, 8)  # fmt: skip
    assert agreement_path(stsb, stsb)[1]


# --------------------------------------------------------------------------- small real runs
REAL_RUNS: dict[str, Path] = {}  # made once per session, by the first module that asks


def make_real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """all-MiniLM-L6-v2 through the real job (FAST settings): 8 STS-B test pairs (parsed by the real jobs.parse,
    spaCy), the first 3 negation pairs and the first 4 adjective pairs, in one store. Made once per session for the
    modules that read them (never write to them). In this process, without Ray (--executor local: the store a Ray
    run writes, tests/test_local_executor.py): these modules read stores, and the work is tiny, so actors that
    start and load the model would be most of their time."""
    from jobtools import run_job

    from jobs import parse

    if not REAL_RUNS:
        out = tmp_path_factory.mktemp("sql-runs") / "runs"
        runs = {name: Path(run_job(out, "--dataset", name, "--executor", "local", *flags)["run_dir"])
                for name, flags in (("stsb", ("--split", "test", "--limit", "8")), ("negation", ("--limit", "3")),
                                    ("adjectives", ("--limit", "4")))}  # fmt: skip
        parse.main(parse.parse_args(["--run", str(runs["stsb"]), "--parser", "spacy", "--executor", "local",
                                     "--quiet"]))  # fmt: skip
        REAL_RUNS.update(runs)
    return dict(REAL_RUNS)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> dict[str, Path]:
    return make_real_runs(tmp_path_factory)


@pytest.mark.slow
def test_real_runs_answer_every_analysis(real_runs, capsys):
    stsb = real_runs["stsb"]
    con = sqlrun.connect(stsb)
    pairs = con.sql("select * from pairs").pl()
    sentences = con.sql("select sentence_id, n_words, words from sentences").pl()
    assert pairs.height == 8

    table1 = run_sql(stsb, "table1.sql").row(0, named=True)
    assert table1["n_pairs"] == 8 and table1["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    expected = stats.spearmanr(pairs["score"].to_list(), pairs["label"].to_list()).statistic
    assert table1["spearman_x100"] == pytest.approx(100 * expected, rel=1e-12)

    lexical = run_sql(stsb, "lexical_ranks.sql", min_count=1)
    assert lexical.height > 5 and lexical["rank"].min() == 1 and lexical["mean"].is_finite().all()
    assert {"[CLS]", "[SEP]"} <= set(lexical["token"].to_list())  # ranked, as in the paper's Fig 10
    words_only = run_sql(stsb, "lexical_ranks.sql", min_count=1, include_special=False)
    assert set(words_only["token"].to_list()) == set(lexical["token"].to_list()) - {"[CLS]", "[SEP]"}
    same = run_sql(stsb, "lexical_ranks_compare.sql", stsb, min_count=1)  # a run against itself
    assert same.height == lexical.height and same["spearman"].to_list() == [pytest.approx(1.0)] * same.height

    reference = run_sql(stsb, "reference_terms.sql")
    assert reference["n"].to_list() == [8, 8, 16, 8] and reference["share_near_zero"].is_between(0, 1).all()
    sums = run_sql(stsb, "pos_neg_sums.sql")
    assert sums.row(-1, named=True)["n_pairs"] == 8 and sums["max_score"][0] == 2.0  # approx: 2
    agreement = run_sql(stsb, "agreement.sql", stsb).row(-1, named=True)  # a run against itself agrees fully
    assert agreement["n_pairs"] == 8
    for col in ("spearman_mean", "pearson_mean", "jaccard_top3_mean", "jaccard_top10_mean"):
        assert agreement[col] == pytest.approx(1.0), col

    relations = run_sql(stsb, "syntactic_relations.sql")  # real spaCy parses from jobs.parse
    n_words = dict(zip(sentences["sentence_id"], sentences["n_words"]))
    top_cells = sum(max(1, math.ceil(0.1 * n_words[a] * n_words[b]))
                    for a, b in zip(pairs["sentence_id_a"], pairs["sentence_id_b"]))  # fmt: skip
    assert relations["n"].sum() == top_cells and relations["share"].sum() == pytest.approx(1.0)
    row = relations.row(0, named=True)
    assert row["same_function_share"] + row["mixed_share"] + row["unaligned_share"] == pytest.approx(1.0)
    labels = set(relations["relation_a"]) | set(relations["relation_b"])
    assert all(re.fullmatch(r"[a-z]+(:[a-z]+)?", x) for x in labels) and {"nsubj", "det"} & labels  # UD labels

    negation = run_sql(real_runs["negation"], "negation.sql")
    neg = sqlrun.connect(real_runs["negation"])
    assert negation.height == 3 and (negation["not_side"] == "a").all()
    for r in negation.iter_rows(named=True):
        (word, total, word_sum) = neg.sql(f"""
            select s.words[{r['not_index']} + 1], (select sum(value) from word_cells
                   where pair_id = '{r['pair_id']}' and u = {r['not_index']}),
                   (select sum(value) from word_cells where pair_id = '{r['pair_id']}')
            from pairs p join sentences s on s.sentence_id = p.sentence_id_a
            where p.pair_id = '{r['pair_id']}'""").fetchall()[0]  # fmt: skip
        token_total = neg.sql(f"""
            select sum(c.value) from cells c join pairs p using (pair_id)
            join sentences s on s.sentence_id = p.sentence_id_a
            where c.pair_id = '{r['pair_id']}' and s.word_ids[c.i + 1] = {r['not_index']}""").fetchall()[0][0]
        assert word.lower() == "not" and r["not_word_attribution"] == pytest.approx(total)
        assert r["not_attribution"] == pytest.approx(token_total) and r["definition"] == "paper"
        assert r["relative"] == pytest.approx(token_total / r["score"])

    adjectives_run = real_runs["adjectives"]
    adj = sqlrun.connect(adjectives_run)
    schema = dict(adj.sql("select column_name, column_type from (describe pairs)").fetchall())
    assert {k: schema[k] for k in ("triplet", "kind", "template")} == dict.fromkeys(("triplet", "kind", "template"),
                                                                                    "VARCHAR")  # fmt: skip
    manifest = json.loads((adjectives_run / "manifest.json").read_text())
    assert manifest["config"]["dataset"]["columns"]["keep"] == ["triplet", "kind", "template"]
    adjectives = run_sql(adjectives_run, "adjectives.sql")
    assert adjectives.height == 4 and set(adjectives["kind"]) == {"synonym", "opposite"}
    for r in adjectives.iter_rows(named=True):
        anchor = r["triplet"].split("/")[0]
        cell = adj.sql(f"select value from word_cells where pair_id = '{r['pair_id']}' and u = {r['u']} "
                       f"and v = {r['u']}").fetchall()  # fmt: skip
        assert r["word_a"] == anchor and r["attribution"] == cell[0][0] and r["u"] == 3  # "This house is X."

    code, out, _ = xsbert_sql(capsys, "--run", str(stsb), "--file", "table1")
    assert code == 0 and "spearman_x100" in out


def test_what_xsbert_sql_prints_cannot_fail_it(tmp_path):
    """Its own process, its real stdout (xsbert_core/console.py): a terminal without the table's characters
    (PYTHONIOENCODING=ascii) gets an ASCII table with escapes, not a UnicodeEncodeError; a reader that goes away after
    a line (`| head -1`) ends nothing in a traceback; a stdout on a full disk is one line, status 2."""
    run, _ = random_run(tmp_path, "r", np.random.default_rng(12), n_pairs=20)
    xsbert = str(Path(sys.executable).with_name("xsbert"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONIOENCODING"}

    ascii_ = subprocess.run([xsbert, "sql", "--run", str(run), "select 'caf\u00e9 \u00d7' as x"], capture_output=True,
                            text=True, env={**env, "PYTHONIOENCODING": "ascii"}, timeout=120)  # fmt: skip
    assert ascii_.returncode == 0 and not ascii_.stderr, ascii_.stderr
    assert ascii_.stdout.splitlines()[:4] == ["+--------+", "| x      |", "+========+", "| caf\\xe9 \\xd7 |"]

    reader = subprocess.Popen([xsbert, "sql", "--run", str(run), "select * from cells, range(50)", "--max-rows",
                               "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert reader.stdout.readline().startswith("\u250c")
    reader.stdout.close()  # as `head -1` does: the rest of the table has no reader
    assert reader.wait(timeout=120) == 0 and reader.stderr.read() == ""

    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            proc = subprocess.run([xsbert, "sql", "--run", str(run), "select * from cells"], stdout=full,
                                  stderr=subprocess.PIPE, text=True, env=env, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            "xsbert sql: error: cannot write to stdout (No space left on device): what the command printed is lost"]
