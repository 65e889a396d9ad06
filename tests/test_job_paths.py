"""Job paths end to end on a local 2-CPU Ray, read back with DuckDB: the options and inputs no other test runs.

Three real-model runs, each with its claims kept apart in separate tests:

- `bad`: all-MiniLM-L6-v2 (approx, cos) over a JSONL file that holds every kind of bad row (too_long_b,
  NUL, lone surrogate, NaN/Inf labels, rows matching two reasons) and a pair whose factor raises a
  NumericalError (test hook): the quarantine, the `sentences` columns, the manifest, then the rerun
  that retries the failed pair.
- `exact`: the same weights with max_seq_length 24 (so that truncating costs little), --mode exact
  --similarity dot --tolerance --max-steps --truncation warn.
- `pruned`: `exact` again with --min-abs: fewer cells, the same sums.

--truncation error (stops before computing) and the run id's inputs need no Ray.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import independent as ind
import numpy as np
import pandas as pd
import pytest
from jobtools import FAST, q, run_job, stsb_rows, write_tsv

from jobs import store as jstore
from jobs.attribution.hooks import Hooks
from xsbert_core import Explainer, weights_fingerprint

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
FAIL = "zqxv"  # a pair whose text holds this fails in its factor actor (Hooks.fail_text)
LONG = " ".join(["word"] * 300)  # 302 tokens > 256


def _good(k: int) -> dict:
    r = stsb_rows(1, start=k).iloc[0]
    return {"id": f"g{k}", "sentence1": r.sentence1, "sentence2": r.sentence2, "score": float(r.score)}


# (row, expected reason or None); the first reason that applies wins
BAD_ROWS = [
    (_good(0), None),
    (_good(1), None),
    ({"id": "f1", "sentence1": f"The {FAIL} man is playing a guitar.", "sentence2": "A man plays.", "score": 3.0},
     "attribution_error"),
    ({**_good(2), "score": None}, None),  # no label: allowed, stored as null
    ({"id": "tb", "sentence1": "Short.", "sentence2": LONG, "score": 1.0}, "too_long_b"),
    ({"id": "nu", "sentence1": "A NUL\x00byte.", "sentence2": "Fine.", "score": 1.0}, "undecodable_text_a"),
    ({"id": "su", "sentence1": "Fine.", "sentence2": "A lone \ud800 surrogate.", "score": 1.0}, "undecodable_text_b"),
    ({"id": "nan", "sentence1": "Fine.", "sentence2": "Good.", "score": "nan"}, "bad_label"),
    ({"id": "inf", "sentence1": "Fine.", "sentence2": "Good.", "score": math.inf}, "bad_label"),  # JSON Infinity
    ({"id": "ninf", "sentence1": "Fine.", "sentence2": "Good.", "score": "-inf"}, "bad_label"),
    ({"id": "g0", "sentence1": "", "sentence2": "Good.", "score": 1.0}, "duplicate_pair_id"),  # + empty text
    ({"id": "e2", "sentence1": "Fine.", "sentence2": " ", "score": "x"}, "empty_text_b"),  # + bad label
    ({"id": "nl", "sentence1": "NUL\x00 here.", "sentence2": LONG, "score": 1.0}, "undecodable_text_a"),  # + long
    (_good(3), None),
]
GOOD = ["g0", "g1", "g2", "g3"]


def sha16(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------- run `bad`
@pytest.fixture(scope="module")
def bad(ray_cluster, tmp_path_factory):
    """(summary, run dir, dataset path) of the first run, with the NumericalError hook on."""
    root = tmp_path_factory.mktemp("bad")
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r, _ in BAD_ROWS), encoding="utf-8")  # \ud800, NaN as escapes
    # two factor actors (a 2-CPU Ray's default pool): the rows of a pool of several, in order
    s = run_job(root / "runs", "--dataset", str(data), "--num-actors", "2", hooks=Hooks(fail_text=FAIL))
    return s, Path(s["run_dir"]), data


@pytest.mark.slow
def test_every_bad_row_gets_the_first_reason_that_applies(bad):
    s, run_dir, _ = bad
    expected = {k: reason for k, (_, reason) in enumerate(BAD_ROWS) if reason}
    assert dict(q(run_dir, "select row, reason from {quarantine}")) == expected
    assert all(d for (d,) in q(run_dir, "select detail from {quarantine}"))
    ((detail,),) = q(run_dir, "select detail from {quarantine} where reason = 'attribution_error'")
    assert detail.startswith("NumericalError") and FAIL in detail
    # NUL and the lone surrogate are stored Parquet-safe
    assert q(run_dir, "select text_a from {quarantine} where pair_id = 'nu'") == [("A NUL\x00byte.",)]
    assert q(run_dir, "select text_b from {quarantine} where pair_id = 'su'") == [("A lone \\ud800 surrogate.",)]
    assert sorted(r for (r,) in q(run_dir, "select pair_id from {pairs}")) == GOOD
    assert q(run_dir, "select label is null from {pairs} where pair_id = 'g2'") == [(True,)]
    n_bad = len(expected)
    assert (s["n_in"], s["n_done"], s["n_quarantined"]) == (len(BAD_ROWS), len(GOOD), n_bad)
    reasons = pd.Series([r for r in expected.values()]).value_counts().to_dict()
    assert s["quarantine_reasons"] == reasons
    # every other pair was attributed: the failure took only its own pair down
    assert q(run_dir, "select count(distinct pair_id) from {cells}") == [(len(GOOD),)]


@pytest.mark.slow
def test_sentences_table_columns(bad, minilm):
    _, run_dir, _ = bad
    stored = q(run_dir, """select sentence_id, text, n_tokens, n_words, tokens, word_ids, token_start, token_end,
                                  words, factor_error, n_steps, truncated, embedding_norm, embedding,
                                  reference_embedding from {sentences} order by sentence_id""")  # fmt: skip
    texts = {t for r, reason in BAD_ROWS if reason is None for t in (r["sentence1"], r["sentence2"])}
    texts.add(BAD_ROWS[2][0]["sentence2"])  # f1's good side is stored; its failed side is not
    assert {r[1] for r in stored} == texts
    tok = minilm[0].tokenizer
    with_pipeline = [ind.tokenize(minilm, r[1]) for r in stored]
    for row, feats in zip(stored, with_pipeline):
        sid, text, n_tokens, n_words, tokens, word_ids, start, end, words, err, n_steps, cut, norm, emb, ref = row
        assert sid == sha16(text)
        enc = tok(text, return_offsets_mapping=True)
        assert tokens == tok.convert_ids_to_tokens(enc["input_ids"]) and n_tokens == len(tokens)
        assert word_ids == enc.word_ids() and [tuple(o) for o in zip(start, end)] == enc["offset_mapping"]
        spans = {}
        for w, a, b in zip(word_ids, start, end):
            if w is not None:
                spans[w] = (spans.get(w, (a, b))[0], b)
        assert words == [text[a:b] for a, b in spans.values()] and n_words == len(words)
        assert n_steps == 2 and cut is False and 0 < err < 1
        e = np.asarray(emb, dtype=np.float64)
        assert len(e) == len(ref) == 384 and norm == pytest.approx(np.linalg.norm(e), rel=1e-6)
        # e(x): the model's own embedding without Normalize; e(r): its embedding of [CLS] PAD .. PAD [SEP]
        own = ind.pipeline_embedding(minilm, feats)[0].double().numpy()
        own_ref = ind.pipeline_embedding(minilm, ind.reference_features(minilm, feats, text))[0].double().numpy()
        assert np.linalg.norm(e - own) <= 1e-5 * np.linalg.norm(own)
        assert np.linalg.norm(np.asarray(ref) - own_ref) <= 1e-5 * np.linalg.norm(own_ref)
    # pairs point at their sentences; factor errors and steps agree; score = cos of the stored embeddings
    worst = q(run_dir, """
        select max(abs(p.score - list_cosine_similarity(a.embedding::double[], b.embedding::double[]))),
               bool_and(p.factor_error_a = a.factor_error and p.steps_b = b.n_steps and p.n_tokens_a = a.n_tokens)
        from {pairs} p join {sentences} a on a.sentence_id = p.sentence_id_a
                       join {sentences} b on b.sentence_id = p.sentence_id_b""")  # fmt: skip
    assert worst[0][0] < 1e-9 and worst[0][1]


@pytest.mark.slow
def test_manifest_contents(bad, ray_cluster, minilm):
    s, run_dir, data = bad
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["run_id"] == run_dir.name == s["run_id"] == jstore.run_id(m["config"])
    assert (m["store_version"], m["schema"]) == (jstore.STORE_VERSION, "docs/STORE.md")
    config = dict(m["config"])
    dataset = config.pop("dataset")
    assert config == {
        "store_version": jstore.STORE_VERSION, "code_version": m["config"]["code_version"], "model": MINILM,
        "weights_sha256": weights_fingerprint(minilm), "mode": "approx", "similarity": "cos", "layer": 5,
        "n_layers": 6, "rule": "gauss-legendre", "steps": 2, "tolerance": None, "max_steps": None,
        "truncation": "quarantine", "min_abs": 0.0,
    }  # fmt: skip
    assert (dataset["name"], dataset["config"], dataset["split"]) == (os.path.normpath(str(data)), None, None)
    assert {k: dataset["columns"][k] for k in ("text_a", "text_b", "label", "id")} == {
        "text_a": "sentence1", "text_b": "sentence2", "label": "score", "id": ["id"]}  # fmt: skip
    assert {k: m["settings"][k] for k in ("model", "layer", "mode", "similarity", "steps")} == {
        "model": MINILM, "layer": 5, "mode": "approx", "similarity": "cos", "steps": 2}  # fmt: skip
    for table, info in m["tables"].items():  # what the manifest says is what is there
        assert info["path"] == f"{table}/*.parquet"
        assert info["parts"] == len(list((run_dir / table).glob("part-*.parquet")))
        assert [(info["rows"],)] == q(run_dir, f"select count(*) from {{{table}}}"), table
    (run,) = m["runs"]
    assert run["selection"] == {"dataset": str(data), "split": None, "limit": None, "sample": None, "seed": 0,
                                "n_source_rows": len(BAD_ROWS)}  # fmt: skip
    assert run["counts"] == {k: s[k] for k in ("n_in", "n_done", "n_quarantined", "computed_pairs",
                                               "computed_sentences")}  # fmt: skip
    assert run["quarantine_reasons"] == s["quarantine_reasons"]
    res = run["resources"]
    assert (res["device"], res["num_actors"], res["gpus_per_actor"], res["batch_size"], res["wave_size"]) == (
        "cpu", 2, 0.0, 16, 2048)  # fmt: skip
    assert res["max_retries"] == 3
    ctx = ray_cluster.get_runtime_context()
    assert run["ray"] == s["ray"] == {"gcs_address": ctx.gcs_address, "node_id": ctx.get_node_id(),
                                      "job_id": ctx.get_job_id()}  # fmt: skip
    (wave,) = run["waves"]
    assert (wave["pairs"], wave["sentences"], wave["duplicates_dropped"]) == (len(GOOD), s["computed_sentences"], 0)
    assert wave["factor_bytes"] > 0 and run["max_abs_completeness_error"] == s["max_abs_completeness_error"]
    # the driver's memory once the wave's was released: all of it, its private part and what of that glibc's malloc
    # has live (Linux; torch and numpy alone hold more than 10 MB of it)
    assert 50 < wave["driver_private_mb"] <= wave["driver_rss_mb"] < 64 * 1024
    assert 10 < wave["driver_malloc_mb"] < wave["driver_rss_mb"]


@pytest.mark.slow
def test_attribution_error_is_retried_on_rerun(bad, tmp_path, minilm):
    s, first, data = bad
    run_dir = tmp_path / first.name  # a copy: the other tests read the first run as it was
    shutil.copytree(first, run_dir)
    # the hook is off now: the engine succeeds (which pairs a rerun computes is the driver's: --executor local)
    again = run_job(tmp_path, "--dataset", str(data), "--executor", "local")
    assert again["run_id"] == s["run_id"]
    assert (again["computed_pairs"], again["n_done"]) == (1, len(GOOD) + 1)
    assert "attribution_error" not in again["quarantine_reasons"]
    f1 = BAD_ROWS[2][0]
    got = q(run_dir, "select i, j, value from {cells} where pair_id = 'f1'")
    ex = Explainer(minilm, layer=-1, mode="approx", similarity="cos", steps=2)
    ref = ex.explain(f1["sentence1"], f1["sentence2"])
    matrix = np.full(ref.matrix.shape, np.nan)
    for i, j, v in got:
        matrix[i, j] = v
    np.testing.assert_allclose(matrix, ref.matrix, rtol=1e-4, atol=1e-6)
    assert q(run_dir, f"select count(*) from {{sentences}} where sentence_id = '{sha16(f1['sentence1'])}'") == [(1,)]
    # The failure's quarantine row stays (parts are never rewritten); rows in = pairs + quarantined rows
    # that are not (or no longer) in pairs.
    assert q(run_dir, "select row from {quarantine} where reason = 'attribution_error'") == [(2,)]
    assert q(run_dir, """select (select count(*) from {pairs})
                              + (select count(*) from {quarantine} where row not in (select row from {pairs}))
                      """) == [(len(BAD_ROWS),)]  # fmt: skip
    assert len(json.loads((run_dir / "manifest.json").read_text())["runs"]) == 2


# --------------------------------------------------------------------------- runs `exact` and `pruned`
TOLERANCE = 1.2e-2  # exact mode, last layer: factor errors ~0.15 at N=2, ~1e-2 at 4, ~2e-4 at 8
EXACT = ["--mode", "exact", "--similarity", "dot", "--tolerance", str(TOLERANCE), "--max-steps", "8",
         "--truncation", "warn"]  # fmt: skip


@pytest.fixture(scope="module")
def short_minilm(tmp_path_factory, minilm_folder) -> Path:
    """all-MiniLM-L6-v2's files with max_seq_length 24 (truncation is cheap to exercise at 24 tokens)."""
    folder = tmp_path_factory.mktemp("minilm-24") / "model"
    folder.mkdir()
    for item in minilm_folder.iterdir():
        if item.name != "sentence_bert_config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((minilm_folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(json.dumps({**config, "max_seq_length": 24}))
    return folder


@pytest.fixture(scope="module")
def exact(tmp_path_factory, short_minilm):
    """A run in exact mode with dot similarity, a tolerance and a text past the model's 24 tokens. What it stores is
    the executor's to neither choose nor change (tests/test_local_executor.py): --executor local, no actor to start."""
    root = tmp_path_factory.mktemp("exact")
    long = pd.DataFrame({"id": ["long"], "sentence1": [" ".join(["word"] * 40)], "sentence2": ["A short one."],
                         "score": ["1.0"]})  # fmt: skip
    rows = pd.concat([stsb_rows(4, start=60), long])
    data = write_tsv(root / "pairs.tsv", rows)
    s = run_job(root / "runs", "--dataset", str(data), "--model", str(short_minilm), *EXACT, "--executor", "local")
    return s, Path(s["run_dir"]), data


@pytest.mark.slow
def test_truncation_warn_stores_flags(exact):
    s, run_dir, _ = exact
    assert (s["n_done"], s["n_quarantined"]) == (5, 0)
    assert q(run_dir, "select pair_id, n_tokens_a from {pairs} where truncated_a or truncated_b") == [("long", 24)]
    assert q(run_dir, "select n_tokens, truncated from {sentences} where text like 'word word%'") == [(24, True)]
    assert q(run_dir, "select count(*) from {sentences} where truncated") == [(1,)]
    assert q(run_dir, "select max(i) from {cells} where pair_id = 'long'") == [(23,)]


@pytest.mark.slow
def test_exact_mode_and_dot_similarity(exact, short_minilm):
    s, run_dir, _ = exact
    m = json.loads((run_dir / "manifest.json").read_text())
    assert (m["config"]["mode"], m["config"]["similarity"], m["config"]["truncation"]) == ("exact", "dot", "warn")
    # e(r) = 0: stored as zeros; the reference terms vanish and the target is the score
    assert q(run_dir, "select bool_and(list_aggregate(reference_embedding, 'max') = 0 and "
                      "list_aggregate(reference_embedding, 'min') = 0) from {sentences}") == [(True,)]  # fmt: skip
    assert q(run_dir, "select bool_and(ref_sim_a = 0 and ref_sim_b = 0 and ref_term = 0 and target = score) "
                      "from {pairs}") == [(True,)]  # fmt: skip
    # dot: the score is e(a).e(b) of the stored embeddings (not a cosine), and sum A approaches it
    worst = q(run_dir, """select max(abs(p.score - list_dot_product(a.embedding, b.embedding)) / abs(p.score)),
                                 min(abs(p.score)), max(abs(p.completeness_error / p.score))
                          from {pairs} p join {sentences} a on a.sentence_id = p.sentence_id_a
                                         join {sentences} b on b.sentence_id = p.sentence_id_b""")  # fmt: skip
    assert worst[0][0] < 1e-5 and worst[0][1] > 1.0 and worst[0][2] < 0.05
    # the stored e(x) is pool(T(x) - T(r)) of the model itself
    from xsbert_core import load_model

    model = load_model(str(short_minilm))
    for text, emb in q(run_dir, "select text, embedding from {sentences} order by sentence_id limit 2"):
        own = ind.exact_embedding(model, ind.tokenize(model, text), text)[0].double().numpy()
        assert np.linalg.norm(np.asarray(emb) - own) <= 1e-5 * np.linalg.norm(own)


@pytest.mark.slow
def test_tolerance_stores_steps_per_sentence(exact):
    s, run_dir, _ = exact
    steps = dict(q(run_dir, "select n_steps, count(*) from {sentences} group by all"))
    assert set(steps) <= {2, 4, 6, 8} and len(steps) >= 2, steps  # panels of 2 nodes per sentence, not per batch
    assert q(run_dir, f"select count(*) from {{sentences}} where factor_error > {TOLERANCE} and n_steps < 8") == [(0,)]
    assert q(run_dir, """select count(*) from {pairs} p join {sentences} a on a.sentence_id = p.sentence_id_a
                         join {sentences} b on b.sentence_id = p.sentence_id_b
                         where p.steps_a != a.n_steps or p.steps_b != b.n_steps""") == [(0,)]  # fmt: skip
    m = json.loads((run_dir / "manifest.json").read_text())
    assert (m["config"]["tolerance"], m["config"]["max_steps"], m["config"]["steps"]) == (TOLERANCE, 8, 2)


@pytest.mark.slow
def test_min_abs_stores_fewer_cells_and_the_same_sums(exact, short_minilm):
    s, full, data = exact
    ((threshold,),) = q(full, "select quantile_cont(abs(value), 0.75) from {cells}")
    pruned = run_job(full.parent, "--dataset", str(data), "--model", str(short_minilm), *EXACT,
                     "--min-abs", repr(threshold), "--executor", "local")  # fmt: skip
    run_dir = Path(pruned["run_dir"])
    assert run_dir != full  # min_abs is in the run id
    sums = "select pair_id, score, attribution_sum, positive_sum, negative_sum, completeness_error from {pairs} " \
           "order by 1"  # fmt: skip
    assert q(run_dir, sums) == q(full, sums)  # the same factors, the sums over all cells
    kept = q(full, f"select pair_id, i, j, value from {{cells}} where abs(value) >= {threshold!r} order by 1, 2, 3")
    assert q(run_dir, "select pair_id, i, j, value from {cells} order by 1, 2, 3") == kept
    assert 0 < len(kept) < q(full, "select count(*) from {cells}")[0][0]
    assert q(run_dir, "select bool_and(p.n_cells = c.n) from {pairs} p join (select pair_id, count(*) as n "
                      "from {cells} group by all) c using (pair_id)") == [(True,)]  # fmt: skip
    words = f"select pair_id, u, v, value from {{word_cells}} where abs(value) >= {threshold!r} order by 1, 2, 3"
    assert q(run_dir, "select pair_id, u, v, value from {word_cells} order by 1, 2, 3") == q(full, words)


# --------------------------------------------------------------------------- no Ray
def test_truncation_error_stops_before_computing(tmp_path, capsys):
    from jobs.attribute import cli

    rows = pd.DataFrame({"id": ["ok", "x"], "sentence1": ["Fine.", "Short."], "sentence2": ["Good.", LONG],
                         "score": ["1", "2"]})  # fmt: skip
    data = write_tsv(tmp_path / "long.tsv", rows)
    out = tmp_path / "runs"
    assert cli(["--dataset", str(data), *FAST, "--truncation", "error", "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar
    assert err.startswith("jobs.attribute: error: 1 pairs have a text over max_seq_length=256 (first: pair x)")
    assert err.endswith("use --truncation quarantine or warn")
    assert not out.exists()  # nothing computed, nothing written


def test_run_id_changes_with_everything_that_changes_the_numbers(tmp_path):
    from jobs.attribute import settings
    from jobs.attribution.prepare import run_config
    from jobs.attribution.validate import load_pairs

    class Settings:  # what run_config reads of an Explainer
        def __init__(self, **change):
            self.settings = {"model": MINILM, "layer": 5, "n_layers": 6, "mode": "approx", "similarity": "cos",
                             "rule": "gauss-legendre", "steps": 2, "tolerance": None, "max_steps": None}  # fmt: skip
            self.settings.update(change)

    one = write_tsv(tmp_path / "one.tsv", stsb_rows(3))
    two = write_tsv(tmp_path / "two.tsv", stsb_rows(3))  # the same rows under another name: another dataset
    pairs = load_pairs(str(one))
    stsb_test, stsb_dev = load_pairs("stsb", split="test", limit=3), load_pairs("stsb", split="dev", limit=3)

    def rid(argv=(), engine=None, fingerprint="w" * 64, data=pairs) -> str:
        attribution = settings(["--dataset", "x", *argv]).attribution
        return jstore.run_id(run_config(attribution, engine or Settings(), fingerprint, data))

    base = rid()
    assert rid(["--limit", "2", "--sample", "2", "--seed", "3", "--batch-size", "4", "--max-retries", "1"]) == base
    changed = {
        "truncation warn": rid(["--truncation", "warn"]),
        "truncation error": rid(["--truncation", "error"]),
        "min_abs": rid(["--min-abs", "0.01"]),
        "tolerance": rid(engine=Settings(tolerance=1e-3, max_steps=256)),
        "max_steps": rid(engine=Settings(tolerance=1e-3, max_steps=64)),
        "model": rid(engine=Settings(model="sentence-transformers/all-mpnet-base-v2")),
        "weights": rid(fingerprint="v" * 64),
        "dataset": rid(data=load_pairs(str(two))),
        "stsb test": rid(data=stsb_test),
        "stsb dev": rid(data=stsb_dev),  # the same dataset, another split
    }
    assert base not in changed.values() and len(set(changed.values())) == len(changed), changed
