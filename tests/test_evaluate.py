"""jobs.evaluate end to end on tiny model variants: Table 1 + ASO, agreement through real jobs.attribute runs
(--executor local) with N chosen per layer, the Fig 2/5 runs and their SQL, and the figures; plus its bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from xsbert_core.metrics import spearman
from xsbert_core.training import build_variant

VARIANTS = ("tuned", "exact", "orig")


@pytest.fixture(scope="module")
def tiny_variants(tiny, tmp_path_factory):
    """A tiny BERT as the shelf model, and its three (untrained) variants saved as model folders as jobs.train
    saves them: the last epoch as <name>, the best dev epoch as <name>-best-dev (other weights: another seed);
    and the second seed of tuned and exact (the noise floor), each with its two folders."""
    root = tmp_path_factory.mktemp("variants")
    base = root / "tinybert"
    tiny.build("bert", n_layers=2).save(str(base))
    models = root / "models"
    names = [(v, f"tinybert-{v}") for v in VARIANTS] + [(v, f"tinybert-{v}-seed1") for v in ("tuned", "exact")]
    for k, (v, name) in enumerate(names):
        for j, suffix in enumerate(("", "-best-dev")):
            build_variant(tiny.build("bert", n_layers=2, seed=2 * k + j), v).save(str(models / f"{name}{suffix}"))
    return base, models


@pytest.mark.slow
def test_evaluate_all_stages_on_tiny_variants(tiny_variants, tmp_path):
    from jobs.evaluate import cli
    from jobs.evaluation.inputs import stsb

    base, models = tiny_variants
    out = tmp_path / "results"
    # the attribution runs in this process (jobs.attribute's --executor local: the same store as on Ray,
    # tests/test_local_executor.py), a dozen of them, each of which would start its actors on Ray
    argv = ["--base", str(base), "--models", str(models), "--layers", "1", "--fig-layer", "1", "--sample", "6",
            "--pilot-pairs", "2", "--steps-grid", "2,4", "--max-error", "10", "--runs", str(tmp_path / "runs"),
            "--out", str(out), "--aso-iterations", "20", "--executor", "local", "-q"]  # fmt: skip
    assert cli(argv) == 0
    summary = json.loads((out / "summary.json").read_text())

    # Table 1: per model and checkpoint, Spearman of cosine (the paper's protocol, orig included) and of orig's own
    # dot product beside it; the paper's number only on the rows of cosine at the last epoch (App. A states no
    # checkpoint rule; best-dev is ours); ASO per checkpoint
    t1 = pl.read_parquet(out / "table1.parquet")
    rows = list(zip(t1["model"], t1["checkpoint"], t1["similarity"]))
    assert rows == [("shelf", "-", "cos")] + [
        (v, c, sim) for v in VARIANTS for c in ("last-epoch", "best-dev") for sim in (("cos", "dot") if v == "orig"
                                                                                     else ("cos",))
    ] + [(v, c, "cos") for v in ("tuned2", "exact2") for c in ("last-epoch", "best-dev")]  # the seed spread  # fmt: skip
    assert (t1["n_pairs"] == 1379).all()
    paper_rows = t1.filter(pl.col("paper_spearman_x100").is_not_null())
    assert list(zip(paper_rows["model"], paper_rows["checkpoint"])) == [("shelf", "-"),
                                                                         *((v, "last-epoch") for v in VARIANTS)]
    assert (paper_rows["similarity"] == "cos").all()
    from xsbert_core import load_model

    a, b, gold, _ = stsb("test")

    def row(model: str, checkpoint: str, sim: str) -> float:
        return t1.filter(pl.col("model") == model, pl.col("checkpoint") == checkpoint,
                         pl.col("similarity") == sim)["spearman_x100"][0]  # fmt: skip

    for folder, checkpoint, variant in (("tinybert-exact", "last-epoch", "exact"),
                                        ("tinybert-orig-best-dev", "best-dev", "orig"),
                                        ("tinybert-tuned-seed1-best-dev", "best-dev", "tuned2")):  # fmt: skip
        model = load_model(str(models / folder), attn_implementation=None)
        ea, eb = model.encode(a, convert_to_tensor=True), model.encode(b, convert_to_tensor=True)
        cos = 100 * spearman(torch.nn.functional.cosine_similarity(ea, eb).numpy(), gold)
        assert row(variant, checkpoint, "cos") == pytest.approx(cos, abs=1e-2)  # batches differ: float noise only
        if variant == "orig":
            dot = 100 * spearman((ea * eb).sum(-1).numpy(), gold)
            assert row("orig", checkpoint, "dot") == pytest.approx(dot, abs=1e-2) and abs(dot - cos) > 1e-3
    aso = summary["table1"]["aso"]
    assert set(aso) == {"best-dev", "last-epoch"}
    assert all(0 <= t["eps_min_tuned_better"] <= 1 and 0 <= t["eps_min_exact_better"] <= 1 for t in aso.values())

    # Agreement: N from the grid, both runs within the error bound, the SQL's rows per bin + 'all'; the second
    # seed's runs (the noise floor) at the same layer and N
    rec = summary["layers"]["1"]
    assert rec["steps"] in (2, 4) and set(rec["runs"]) == {"tuned", "exact", "tuned2", "exact2"}
    assert all(r["n_done"] == 6 for r in rec["runs"].values())
    ag = pl.read_parquet(out / "agreement.parquet")
    overall = ag.filter(pl.col("score_bin") == "all")
    # per comparison, content tokens (our default cells) and every cell beside them, one 'all' row each
    comparisons = ["exact vs tuned", "tuned vs tuned'", "exact vs exact'"]
    assert overall["comparison"].to_list() == [c for c in comparisons for _ in (0, 1)]
    assert overall["include_special"].to_list() == [False, True] * 3 and (overall["layer"] == 1).all()
    assert (overall["n_pairs"] == 6).all() and (overall["steps"] == rec["steps"]).all()
    assert all(-1 <= v <= 1 for v in overall["spearman_mean"].to_list())
    # each run is its model's last epoch (the default --checkpoint) in its own mode, at the layer's N
    for name, folder, mode in (("exact", "tinybert-exact", "exact"), ("tuned", "tinybert-tuned", "approx"),
                               ("tuned2", "tinybert-tuned-seed1", "approx"), ("exact2", "tinybert-exact-seed1", "exact")):
        manifest = json.loads((Path(rec["runs"][name]["run_dir"]) / "manifest.json").read_text())
        config = manifest["config"]
        assert (config["mode"], config["layer"], config["steps"]) == (mode, 1, rec["steps"])
        assert config["model"] == str(models / folder) == rec["models"][name]
    # the noise floor's rows are sql/agreement.sql of the two seeds' runs
    from jobs.evaluation.agreement import sql_file

    direct = sql_file("agreement", rec["runs"]["tuned"]["run_dir"], rec["runs"]["tuned2"]["run_dir"])
    noise = ag.filter(pl.col("comparison") == "tuned vs tuned'", ~pl.col("include_special"))
    # DuckDB aggregates in parallel threads: the same rows can differ in the last bits of a mean
    assert noise["spearman_mean"].to_list() == pytest.approx(direct["spearman_mean"].to_list(), rel=1e-9, abs=1e-12)

    # Fig 2/5 inputs and the figures
    terms = pl.read_parquet(out / "reference_terms.parquet")
    assert set(terms["model"]) == {"shelf", "exact"}
    exact_terms = terms.filter((pl.col("model") == "exact") & (pl.col("quantity") == "ref_term"))
    assert exact_terms["max"][0] == 0.0  # e(r) = 0 in exact mode
    assert set(pl.read_parquet(out / "pos_neg_sums.parquet")["model"]) == {"shelf", "exact"}
    for name in ("fig2_reference_terms", "fig3_agreement_correlation", "fig4_agreement_jaccard", "fig5_pos_neg_sums"):
        png = out / f"{name}.png"
        assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG", name
    assert "| model |" in (out / "table1.md").read_text()

    # More pairs attributed later with the exact run's settings land in the same store (a run is found by its
    # settings, not its sample); Fig 2/5 stay on the pairs both runs hold
    import shlex

    from jobs import attribute as job

    fig_runs = json.loads((out / "summary.json").read_text())["figures"]["runs"]
    command = shlex.split(summary["layers"]["1"]["runs"]["exact"]["command"])[3:]
    more = job.main(job.parse_args(["9" if prev == "--sample" else x for prev, x in zip(["", *command], command)]))
    held = pl.read_parquet(Path(fig_runs["exact"]) / "pairs" / "*.parquet").height
    assert more["run_dir"] == fig_runs["exact"] and held > 6
    assert cli([*argv, "--stages", "figures"]) == 0
    sums = pl.read_parquet(out / "pos_neg_sums.parquet").filter(pl.col("score_bin") == "all")
    assert sums["n_pairs"].to_list() == [6, 6] and sums["model"].to_list() == ["shelf", "exact"]
    terms = pl.read_parquet(out / "reference_terms.parquet").filter(pl.col("quantity") == "ref_term")
    assert terms["n"].to_list() == [6, 6]
    from jobs.evaluation.figures import pairs_columns  # what the Fig 2/5 histograms draw

    drawn = pairs_columns(fig_runs["exact"], ["positive_sum", "negative_sum"], fig_runs["shelf"])
    assert [len(v) for v in drawn.values()] == [6, 6]

    # A second call reuses the recorded runs (no new attribution) and only redoes what is asked
    before = json.loads((out / "summary.json").read_text())["layers"]
    assert cli([*argv, "--stages", "agreement"]) == 0
    assert json.loads((out / "summary.json").read_text())["layers"] == before

    # Two invocations on one --out keep each other's results: what another one saved after this one read
    # summary.json (here a layer) survives this one's save (here Table 1's), and the next invocation's
    from jobs.evaluation.run import Summary

    mine, other = Summary(out / "summary.json"), Summary(out / "summary.json")
    other.data["layers"]["0"] = {"layer": 0, "by": "another process"}
    other.save("layers")
    mine.data["table1"]["by"] = "this process"
    mine.save("table1")
    after = json.loads((out / "summary.json").read_text())
    assert after["layers"]["0"]["by"] == "another process" and after["table1"]["by"] == "this process"
    assert cli([*argv, "--stages", "table1"]) == 0
    after = json.loads((out / "summary.json").read_text())
    assert after["layers"]["0"]["by"] == "another process" and after["layers"]["1"] == before["1"]
    assert "by" not in after["table1"]
    assert set(after["commands"]) == {"table1", "agreement", "figures"} and len(after["table1"]["rows"]) == 13

    # Another checkpoint: the layer recorded with the last epochs' folders is attributed again with the best-dev ones
    assert cli([*argv, "--stages", "agreement", "--layers", "1", "--checkpoint", "best-dev"]) == 0
    redone = json.loads((out / "summary.json").read_text())["layers"]["1"]
    assert redone["models"] == {n: str(models / f) + "-best-dev" for n, f in (
        ("tuned", "tinybert-tuned"), ("exact", "tinybert-exact"), ("tuned2", "tinybert-tuned-seed1"),
        ("exact2", "tinybert-exact-seed1"))}  # fmt: skip
    assert {r["run_id"] for r in redone["runs"].values()}.isdisjoint(r["run_id"] for r in rec["runs"].values())


def test_evaluate_bad_inputs(tmp_path, capsys):
    from jobs.evaluate import cli

    assert cli(["--models", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--stages", "table1"]) == 2
    err = capsys.readouterr().err
    assert "jobs.evaluate: error: model folder(s) not found" in err and "python -m jobs.train --variant tuned" in err
    with pytest.raises(SystemExit):
        cli(["--stages", "tables"])
    assert "unknown stage" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")  # a results folder that cannot be made: said before the models are looked for
    assert cli(["--models", str(tmp_path / "none"), "--out", str(tmp_path / "a-file" / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"jobs.evaluate: error: --out {tmp_path}/a-file/o: cannot write there (Not a directory)")
    assert not np.any([p.name.endswith(".parquet") for p in tmp_path.rglob("*")])


def test_the_train_them_first_hint_trains_what_this_evaluation_looks_for(tmp_path, capsys):
    """The hint had named the default commands whatever --base and --models said (following it trained MiniLM into
    ./models, and the same command failed again), and --out had been made before the models were looked for: now the
    jobs.train commands that save the missing folders, and no --out."""
    from jobs.evaluate import cli

    models, out = tmp_path / "trained", tmp_path / "results"
    (tmp_path / "mine" / "exact").mkdir(parents=True)
    (tmp_path / "mine" / "exact" / "modules.json").write_text("[]")  # --exact is there: not to train
    argv = ["--stages", "table1", "--base", "sentence-transformers/all-mpnet-base-v2", "--models", str(models),
            "--tuned", str(tmp_path / "mine" / "t1"), "--exact", str(tmp_path / "mine" / "exact"), "--out", str(out)]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"; train them first: python -m jobs.train --variant tuned --model sentence-transformers/all-mpnet-base-v2 "
        f"--out {tmp_path / 'mine'} --name t1 && python -m jobs.train --variant orig --model "
        f"sentence-transformers/all-mpnet-base-v2 --out {models}"), err
    assert "exact (" not in err and not out.exists()


BAD_FLAGS = [
    # (flags, the one line after "jobs.evaluate: error: ")
    (["--layers", "abc"], "--layers must be 'all' or comma-separated integers, got 'abc'"),
    (["--layers", "3,,4"], "--layers must be 'all' or comma-separated integers, got '3,,4'"),
    (["--steps-grid", "8,4"], "--steps-grid must be positive integers in ascending order, got '8,4'"),
    (["--steps-grid", "0,4"], "--steps-grid must be positive integers in ascending order, got '0,4'"),
    (["--steps-grid", "4,x"], "--steps-grid must be comma-separated integers, got '4,x'"),
    (["--max-error", "-1"], "--max-error must be a positive number, got -1.0"),
    (["--max-error", "nan"], "--max-error must be a positive number, got nan"),
    (["--pilot-pairs", "0"], "--pilot-pairs must be >= 1, got 0"),
    (["--aso-iterations", "0"], "--aso-iterations must be >= 1, got 0"),
    (["--sample", "0"], "--sample must be >= 1, got 0"),
]


@pytest.mark.parametrize("flags,message", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_evaluate_bad_flags_are_one_line_before_anything(tmp_path, capsys, flags, message):
    """Said as the command's usage error, before --out is made or a model looked for (none is there: a check that came
    later would say that instead)."""
    from jobs.evaluate import cli

    with pytest.raises(SystemExit) as exc:
        cli(["--models", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--stages", "agreement", *flags])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1, lines
    assert lines[0] == f"jobs.evaluate: error: {message} (see python -m jobs.evaluate --help)", lines
    assert not (tmp_path / "o").exists()


LAYER_FLAGS = [
    # (stages, flags, the one line after "jobs.evaluate: error: "): the tiny models have 2 layers
    ("figures", ["--fig-layer", "99"], "--fig-layer 99 is out of range for a model with 2 layers (valid: 0..1, or "
                                       "-2..-1 from the top)"),
    ("figures", ["--fig-layer", "-3"], "--fig-layer -3 is out of range for a model with 2 layers"),
    ("agreement", ["--layers", "1,99"], "--layers: layer 99 is out of range for a model with 2 layers"),
    ("table1,agreement,figures", ["--layers", "1", "--fig-layer", "2"], "--fig-layer 2 is out of range"),
]


@pytest.mark.parametrize("stages,flags,message", LAYER_FLAGS, ids=[" ".join(f) for _, f, _ in LAYER_FLAGS])
def test_evaluate_layers_the_model_has_not_are_one_line_before_table1_and_the_runs(tiny_variants, tmp_path, capsys,
                                                                                   stages, flags, message):  # fmt: skip
    from jobs.evaluate import cli

    base, models = tiny_variants
    out = tmp_path / "results"
    assert cli(["--base", str(base), "--models", str(models), "--stages", stages, "--sample", "2", "--pilot-pairs",
                "1", "--steps-grid", "2", "--max-error", "10", "--aso-iterations", "2", "--runs",
                str(tmp_path / "runs"), "--out", str(out), "--executor", "local", "-q", *flags]) == 2  # fmt: skip
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if "jobs.evaluate" in line]
    assert lines[-1].startswith(f"jobs.evaluate: error: {message}"), lines
    assert not (tmp_path / "runs").exists() and not list(out.iterdir())  # no run, no Table 1


def test_evaluate_negative_layers_count_from_the_top(tiny_variants):
    """--layers -1 and 1 are the same layer of a 2-layer model: run once, recorded under 1 (as --layers all does)."""
    from jobs.evaluate import parse_args
    from jobs.evaluation.run import layer_plan

    base, models = tiny_variants
    args = parse_args(["--base", str(base), "--layers=-1,1,0", "--fig-layer", "-2"])
    plan = layer_plan(args, str(models / "tinybert-exact"))
    assert (plan.n_layers, plan.layers, plan.fig_layer) == (2, [1, 0], 0)


def test_models_kept_only_at_their_best_dev_epoch_are_found(tmp_path):
    """A models folder that holds only the best-dev epochs (what bench/gpu_train.py carries back from a GPU machine):
    the attribution stages at --checkpoint best-dev find every model, the second seed's too; last-epoch names them
    as missing; Table 1 takes whichever epoch is there."""
    from jobs.evaluate import parse_args
    from jobs.evaluation.inputs import model_paths, require_models
    from xsbert_core import InputError

    for name in ("m-tuned", "m-exact", "m-orig", "m-tuned-seed1", "m-exact-seed1"):
        (tmp_path / f"{name}-best-dev").mkdir()
        (tmp_path / f"{name}-best-dev" / "modules.json").write_text("[]")
    paths = model_paths(parse_args(["--base", "m", "--models", str(tmp_path)]))
    assert paths["tuned2"] == str(tmp_path / "m-tuned-seed1") and paths["exact2"] == str(tmp_path / "m-exact-seed1")
    require_models(paths, ("exact", "orig", "tuned"))  # Table 1: either epoch
    require_models(paths, ("exact", "tuned"), ("best-dev",))
    with pytest.raises(InputError, match=r"tuned \(.*m-tuned\)"):
        require_models(paths, ("tuned",), ("last-epoch",))
    (tmp_path / "m-exact-seed1-best-dev" / "modules.json").unlink()
    assert "exact2" not in model_paths(parse_args(["--base", "m", "--models", str(tmp_path)]))


def test_plot_by_layer_clips_bands_to_the_metric_range(tmp_path):
    """mean ± std bands stay inside `bounds` (a Jaccard index cannot exceed 1); without bounds they are as given.
    The bands are read back from the drawn figure: each is a polygon whose points at a layer are its low and high."""
    import matplotlib.pyplot as plt

    from xsbert_core.plots import plot_by_layer

    series = {"top-3 Jaccard": (np.array([0.2, 0.7, 0.9]), np.array([0.3, 0.2, 0.3])), "Pearson": ([0.5] * 3, None)}
    reference = {"paper: 0.8": (2, 0.8)}
    png = plot_by_layer([0, 1, 2], series, tmp_path / "bounded.png", "t", "y", reference, (0.0, 1.0))
    assert png.read_bytes()[:4] == b"\x89PNG"

    def drawn_bands(bounds):
        fig = plot_by_layer([0, 1, 2], series, None, "t", "y", reference, bounds)
        (ax,) = fig.axes
        bands = []
        for band in ax.collections:  # fill_between's polygons: one per series with a std
            xy = band.get_paths()[0].vertices
            bands.append([(xy[xy[:, 0] == x, 1].min(), xy[xy[:, 0] == x, 1].max()) for x in (0, 1, 2)])
        plt.close(fig)
        return bands

    (clipped,) = drawn_bands((0.0, 1.0))
    np.testing.assert_allclose(clipped, [(0.0, 0.5), (0.5, 0.9), (0.6, 1.0)])
    (raw,) = drawn_bands(None)
    np.testing.assert_allclose(raw, [(-0.1, 0.5), (0.5, 0.9), (0.6, 1.2)])


# --------------------------------------------------------------------------- the figures' subsets
ROOT = Path(__file__).resolve().parents[1]
NOISE_FLOOR = ROOT / "docs" / "results" / "all-MiniLM-L6-v2" / "noise-floor"


def test_fig4_is_drawn_on_the_papers_subset_from_the_committed_bins(tmp_path):
    """Fig 4's paper markers are s > 0.5: ours are pooled exactly from the bins above 0.5 (the committed noise-floor
    agreement.parquet: layer 5, exact vs tuned, 0.81 / 0.53 for 195 pairs as docs/RESULTS.md states), and the figures
    are drawn from that file alone."""
    from jobs import paper
    from jobs.evaluation import figures

    ag = pl.read_parquet(NOISE_FLOOR / "agreement.parquet")
    ag = ag.filter(pl.col("comparison") == "exact vs tuned", ~pl.col("include_special"))
    pooled = figures.pooled_above(ag, paper.FIG4_SCORE_ABOVE, [5])
    assert pooled["n_pairs"] == [195]
    assert round(float(pooled["jaccard_top3_mean"][0]), 2) == 0.81
    assert round(float(pooled["jaccard_top10_mean"][0]), 2) == 0.53
    # the pooled mean is the pair-weighted mean of the bins above 0.5
    rows = ag.filter(pl.col("layer") == 5, pl.col("bin_low") >= 0.5, pl.col("score_bin") != "all")
    expected = float((rows["n_pairs"] * rows["jaccard_top3_mean"]).sum() / rows["n_pairs"].sum())
    assert pooled["jaccard_top3_mean"][0] == pytest.approx(expected)
    (tmp_path / "agreement.parquet").write_bytes((NOISE_FLOOR / "agreement.parquet").read_bytes())
    summary = {k: v for k, v in json.loads((NOISE_FLOOR / "summary.json").read_text()).items() if k != "figures"}
    written = figures.plot_all(tmp_path, summary)
    assert [p.name for p in written] == ["fig3_agreement_correlation.png", "fig4_agreement_jaccard.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)


def test_fig5_draws_no_line_at_2_where_the_run_shows_it_is_no_bound():
    from jobs.evaluation.figures import approx_bound_holds

    assert approx_bound_holds(np.array([1.5, 1.2]), np.array([-0.2, -0.1]))
    assert not approx_bound_holds(np.array([3.2, 3.1]), np.array([-0.01, -0.02]))  # MiniLM: mean ΣA 3.1


def test_fig2_and_fig5_are_drawn_from_two_runs(tmp_path):
    """plot_all's Fig 2/5 path on hand-built shelf and exact stores (tests/test_sql.py), without Ray."""
    from test_sql import make_run, random_run

    from jobs.evaluation.figures import plot_all

    shelf, data = random_run(tmp_path, "shelf", np.random.default_rng(3), n_pairs=8)
    exact = make_run(tmp_path, "exact", data["pairs"], data["cells"], [], data["sentences"], mode="exact")
    summary = {"base": "sentence-transformers/all-MiniLM-L6-v2",
               "figures": {"layer": 3, "runs": {"shelf": str(shelf), "exact": str(exact)}}}  # fmt: skip
    written = plot_all(tmp_path, summary)
    assert [p.name for p in written] == ["fig2_reference_terms.png", "fig5_pos_neg_sums.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)


def test_two_evaluations_saving_into_one_summary_keep_each_others_results(tmp_path):
    """Summary.save merges its keys into summary.json as it is on disk; two invocations on one --out (table1 beside
    an agreement run) lost each other's keys when a save fell between the other's read and write: saves are under a
    lock now. Two processes, 150 saves each, every key kept."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from jobs.evaluation.run import Summary; "
            "s = Summary(Path(sys.argv[1])); who = sys.argv[2]\n"
            "for i in range(150):\n    s.data[f'{who}{i}'] = i; s.save(f'{who}{i}')")  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "summary.json"), who], cwd=root)
             for who in ("a", "b")]  # fmt: skip
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    saved = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert {k for k in saved if k[0] in "ab" and k[1:].isdigit()} == {f"{w}{i}" for w in "ab" for i in range(150)}
