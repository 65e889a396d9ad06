"""jobs.pipeline's train stage: a study declares models to fine-tune (base, variant, recipe); each is trained once per
model id into the study's models_dir and reused; the study's runs attribute the trained model.

A tiny random MPNet (tests/conftest.py) is the base; trainings of 2 steps on 8 STS-B train pairs (one evaluated epoch
where the best-dev epoch is needed). Config errors are one line naming the dotted key, before anything is trained."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobs import pipeline
from jobs.training import study as trained
from xsbert_core import InputError, load_model, weights_fingerprint
from xsbert_core.models import transformers_bars

SMOKE = {"epochs": 1, "batch_size": 4}  # 8 pairs: 2 steps, one evaluated epoch (so best-dev is saved too)


def study_tree(tmp_path: Path, base: str, executor: str = "local") -> dict:
    return {
        "study": "train",
        "out": str(tmp_path / "runs"),
        "models_dir": str(tmp_path / "models"),
        "datasets": {"pairs": {"source": "stsb", "split": "test", "limit": 2}},
        "models": {
            "shelf": base,
            "exact": {"train": {"base": "shelf", "variant": "exact", "recipe": dict(SMOKE), "train_limit": 8,
                                "dev_limit": 6}},
        },
        "defaults": {"layer": 1, "steps": 2},
        "runs": {"exact": {"dataset": "pairs", "model": "exact"}},
        "parse": {"enabled": False},
        "report": {"enabled": False},
        "ray": {"executor": executor},
        "quiet": True,
    }


def write(path: Path, tree: dict) -> Path:
    path.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return path


def files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def manifest(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- config errors
BAD = [
    # (--set, what the one line must say)
    ("models.exact.train.variant=shifted", "models.exact.train.variant: Input should be 'tuned', 'exact' or 'orig'"),
    ("models.exact.train.recipe.epochs=0", "models.exact.train.recipe.epochs: Input should be greater than 0"),
    ("models.exact.train.recipe.name=papers", "models.exact.train.recipe.name: unknown recipe 'papers' (known: paper)"),
    ("models.exact.train.recipe.stepz=3", "models.exact.train.recipe.stepz: unknown key"),
    ("models.exact.train.recipe.warmup_ratio=1", "models.exact.train.recipe.warmup_ratio: Input should be less than 1"),
    ("models.exact.train.checkpoint=best", "models.exact.train.checkpoint: Input should be 'last-epoch' or 'best-dev'"),
    ("models.exact.train.base=shelff", "models.exact.train.base: unknown model 'shelff'"),
    ("models.exact.train.base=./no/such/folder", "models.exact.train.base: no such model folder"),
    ("models.exact.train.train_limit=0", "models.exact.train.train_limit: Input should be greater than or equal to 1"),
    ("models.exact.train.epochs=1", "models.exact.train.epochs: unknown key"),
    ("models.exact.trian=1", "models.exact.trian: unknown key"),
    ("models.exact=[1]", "models.exact: a model is a folder, a PyPI-packaged model or a hub id, or {train:"),
    ("models_dir=s3://bucket/models", "models_dir: trained models are written to a folder, not to object storage"),
    ("ray.executor=locally", "ray.executor: Input should be 'ray' or 'local'"),
    ("trainings_per_gpu=0", "trainings_per_gpu: Input should be greater than or equal to 1"),
]


@pytest.mark.parametrize("assignment,message", BAD, ids=[b[0][:40] for b in BAD])
def test_train_config_errors_are_one_line_naming_the_key(tmp_path, capsys, assignment, message):
    path = write(tmp_path / "s.yaml", study_tree(tmp_path, "sentence-transformers/all-MiniLM-L6-v2"))
    assert pipeline.cli(["--config", str(path), "--set", assignment]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobs.pipeline: error: "), lines
    assert message in lines[0], lines[0]
    assert not (tmp_path / "models").exists() and not (tmp_path / "runs").exists()  # nothing trained, nothing run


def test_a_models_dir_that_cannot_be_written_is_one_line_before_any_training(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    tree = {**study_tree(tmp_path, "sentence-transformers/all-MiniLM-L6-v2"), "models_dir": str(tmp_path / "a-file")}
    assert pipeline.cli(["--config", str(write(tmp_path / "s.yaml", tree))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"jobs.pipeline: error: models_dir {tmp_path}/a-file: cannot write there (Not a directory)"
    assert not (tmp_path / "runs").exists()


def test_a_trained_base_and_a_recipe_by_name(tmp_path, capsys):
    tree = study_tree(tmp_path, "sentence-transformers/all-MiniLM-L6-v2")
    tree["models"]["tuned"] = {"train": {"base": "exact", "variant": "tuned"}}
    assert pipeline.cli(["--config", str(write(tmp_path / "s.yaml", tree)), "--check"]) == 2
    assert "models.tuned.train.base: 'exact' is itself trained" in capsys.readouterr().err
    tree["models"]["tuned"] = {"train": {"base": "shelf", "variant": "tuned", "recipe": "paper"}}
    study = pipeline.load_config(write(tmp_path / "s.yaml", tree))
    spec = study.trained()["tuned"]
    assert spec.recipe == trained.TrainConfig() and spec.recipe_name == "paper"  # the paper's, App. A
    assert (spec.recipe.batch_size, spec.recipe.epochs, spec.recipe.learning_rate, spec.recipe.weight_decay,
            spec.recipe.warmup_ratio) == (16, 5, 2e-5, 0.1, 0.1)  # fmt: skip
    assert spec.base == "sentence-transformers/all-MiniLM-L6-v2" and spec.checkpoint == "last-epoch"
    assert study.trained()["exact"].recipe_name == "paper with epochs=1.0, batch_size=4"
    tree["models"]["tuned"] = {"train": {"base": "shelf", "variant": "tuned", "recipe": "papers"}}
    with pytest.raises(InputError, match="models.tuned.train.recipe: unknown recipe 'papers'"):
        pipeline.load_config(write(tmp_path / "s.yaml", tree))


def test_the_model_id_hashes_what_changes_the_weights():
    spec = trained.TrainSpec(base="b", variant="exact", recipe=trained.TrainConfig())
    same = trained.model_id(trained.model_config(spec, "w"))
    assert same == trained.model_id(trained.model_config(trained.TrainSpec(base="elsewhere/b", variant="exact",
                                                                           recipe=trained.TrainConfig()), "w"))
    from dataclasses import replace

    others = [trained.model_config(spec, "w2"), trained.model_config(replace(spec, variant="tuned"), "w"),
              trained.model_config(replace(spec, recipe=replace(spec.recipe, seed=1)), "w"),
              trained.model_config(replace(spec, recipe=replace(spec.recipe, epochs=4)), "w"),
              trained.model_config(replace(spec, train_limit=8), "w")]  # fmt: skip
    assert len({same, *(trained.model_id(c) for c in others)}) == 6
    # which epoch the runs use is not the training's: the same id, the other folder
    best = replace(spec, checkpoint="best-dev")
    assert trained.model_id(trained.model_config(best, "w")) == same
    assert trained.model_folder("m", best, same).name == "b-exact-best-dev"
    assert trained.model_folder("m", spec, same) == Path("m") / same / "b-exact"


def test_a_training_whose_id_another_study_finished_meanwhile_keeps_theirs(tiny, tmp_path):
    """train_into's model folder appears while it trains (another study, same model id): its rename fails, the
    other model stands and is returned as reused, and nothing of this training is left."""
    spec = trained.TrainSpec(base=str(tiny.folder("mpnet", 2)), variant="exact", train_limit=8, dev_limit=6,
                             recipe=trained.TrainConfig(**SMOKE))  # fmt: skip
    mid, root = "0123456789abcdef", tmp_path / "models"
    theirs = trained.model_folder(root, spec, mid, "last-epoch")
    theirs.mkdir(parents=True)
    (theirs / "modules.json").write_text("[]", encoding="utf-8")
    (theirs / "xsbert_training.json").write_text(json.dumps({"model_id": mid, "by": "them"}), encoding="utf-8")
    got = trained.train_into(spec, mid, {"what": "changes the weights"}, str(root))
    assert got == {"model_id": mid, "by": "them", "reused": True}
    assert sorted(p.name for p in root.iterdir()) == [mid] and [p.name for p in (root / mid).iterdir()] == [theirs.name]


# --------------------------------------------------------------------------- the stage, end to end
@pytest.mark.slow
def test_train_stage_trains_once_per_recipe_and_the_runs_use_the_trained_model(tiny, tmp_path, capsys):
    base = str(tiny.folder("mpnet", 2))
    path = write(tmp_path / "s.yaml", study_tree(tmp_path, base))
    models = tmp_path / "models"

    first = pipeline.main(pipeline.parse_args(["--config", str(path)]))
    out = capsys.readouterr().out
    exact = first["models"]["exact"]
    assert exact["trained"] and "train exact: trained in" in out
    folder = Path(exact["path"])
    assert folder == models / exact["model_id"] / f"{Path(base).name}-exact" and (folder / "modules.json").is_file()
    assert (folder.parent / f"{folder.name}-best-dev" / "modules.json").is_file()  # ours, kept beside it
    record = json.loads((folder / "xsbert_training.json").read_text())
    assert record["model_id"] == exact["model_id"] and record["checkpoint"] == "last-epoch"
    assert record["hyperparameters"]["deterministic"] and record["recipe"] == "paper with epochs=1.0, batch_size=4"
    assert record["weights_sha256"] == trained.hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert "App. A states no checkpoint rule" in (folder / "README.md").read_text()
    assert not [p for p in models.iterdir() if p.name.startswith(".")]  # no partial folder left
    # the run attributes the trained model: its path, its weights, exact mode (the shift)
    run = first["runs"]["exact"]
    config = manifest(run["run_dir"])["config"]
    assert config["model"] == str(folder) and config["mode"] == "exact"
    assert config["weights_sha256"] == weights_fingerprint(load_model(str(folder)))
    assert config["weights_sha256"] != weights_fingerprint(load_model(base))
    assert run["n_done"] == 2

    # An unchanged recipe trains nothing and changes no file; the run is up to date.
    before = files(models)
    again = pipeline.main(pipeline.parse_args(["--config", str(path)]))
    out = capsys.readouterr().out
    assert not again["models"]["exact"]["trained"] and "train exact: up to date" in out and "training " not in out
    assert files(models) == before
    assert again["runs"]["exact"]["run_id"] == run["run_id"] and again["runs"]["exact"]["computed_pairs"] == 0

    # The best-dev epoch (ours) is the other folder of the same training: nothing trained, a new run on it.
    best = pipeline.main(pipeline.parse_args(["--config", str(path), "--set",
                                              "models.exact.train.checkpoint=best-dev"]))  # fmt: skip
    assert not best["models"]["exact"]["trained"] and files(models) == before
    assert manifest(best["runs"]["exact"]["run_dir"])["config"]["model"] == f"{folder}-best-dev"

    # A changed recipe trains a new model beside the old one; the run on it is a new run.
    changed = pipeline.main(pipeline.parse_args(["--config", str(path), "--set", "models.exact.train.recipe.seed=1"]))
    new = changed["models"]["exact"]
    assert new["trained"] and new["model_id"] != exact["model_id"] and folder.is_dir()
    assert changed["runs"]["exact"]["run_id"] != run["run_id"]
    assert sorted(p.name for p in models.iterdir()) == sorted([exact["model_id"], new["model_id"]])


@pytest.mark.slow
def test_train_stage_on_ray_trains_in_a_task(tiny, tmp_path, ray_cluster, capsys):
    """With the Ray executor each training is a Ray task (a fresh worker), writing into models_dir, and its progress
    beside it, which the stage reads as it does a local process's."""
    base = str(tiny.folder("mpnet", 1))
    tree = study_tree(tmp_path, base, executor="ray")
    tree["models"]["tuned"] = {"train": {"base": "shelf", "variant": "tuned", "recipe": {"max_steps": 1, **SMOKE},
                                         "train_limit": 4, "dev_limit": 4}}  # fmt: skip
    study = pipeline.load_config(write(tmp_path / "s.yaml", tree))
    done = pipeline.stage_train(study, poll_s=0.02)
    said = capsys.readouterr().out
    assert "train exact: step " in said and "train tuned: step " in said, said
    assert all(m["trained"] for m in done.values()) and set(done) == {"exact", "tuned"}
    for m in done.values():
        assert (Path(m["path"]) / "modules.json").is_file() and m["record"]["variant"] in ("exact", "tuned")
    assert done["tuned"]["record"]["steps"] == 1
    assert not any(m["trained"] for m in pipeline.stage_train(study).values())


def test_train_stage_says_each_trainings_progress_while_it_runs(tiny, tmp_path, capfd):
    """While a training runs, the stage reads the progress file it keeps (every poll_s) and says a line per change;
    the file is gone when the training ends. A caller's on_progress gets the model names and the TrainProgress.

    Before it trains, a training removes what killed trainings of its model id on this host left: their hidden work
    folders and progress temp files, named for a process that is gone (a SIGKILL runs no cleanup; a real kill:
    tests/test_training.py). A running process's, or another host's, stay."""
    tree = study_tree(tmp_path, str(tiny.folder("mpnet", 1)))
    tree["models"]["exact"]["train"]["recipe"] = {"epochs": 3, "batch_size": 4}
    study = pipeline.load_config(write(tmp_path / "s.yaml", tree))
    spec = study.trained()["exact"]
    mid = trained.model_id(trained.model_config(spec, trained.fingerprint(spec.base)))
    models, host = Path(study.models_dir), socket.gethostname()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # a process of this host that has ended
    left = [models / f".{mid}.partial-{host}-{dead}", models / f".{mid}.progress.json.{host}-{dead}.tmp"]
    kept = [models / f".{mid}.partial-{host}-{os.getpid()}", models / f".{mid}.partial-{host}x-{dead}"]
    for folder in (left[0], *kept):
        (folder / "xsbert-train-x" / "checkpoint-2").mkdir(parents=True)
    left[1].write_text("{")
    capfd.readouterr()  # what building the tiny model printed
    with transformers_bars(False):  # this process's own (the base's fingerprint); the training's process is fresh
        done = pipeline.stage_train(study, poll_s=0.02)
    assert done["exact"]["model_id"] == mid and not any(p.exists() for p in left)
    assert all(p.is_dir() for p in kept)
    said = capfd.readouterr()  # the stage's lines only: not the training process's own, nor its bars
    assert all(ln.startswith("train exact: ") for ln in said.out.splitlines()), said.out
    assert "Loading weights" not in said.err and "Writing model shards" not in said.err, said.err[-500:]
    lines = [ln for ln in said.out.splitlines() if ln.startswith("train exact: step ")]
    assert lines and all("/6 (epoch " in ln for ln in lines) and len(set(lines)) == len(lines), lines  # none twice
    assert done["exact"]["record"]["steps"] == 6
    assert not trained.progress_file(study.models_dir, done["exact"]["model_id"]).exists()

    seen = []
    tree["models"]["exact"]["train"]["recipe"]["seed"] = 1  # another model: trained again
    study = pipeline.load_config(write(tmp_path / "s.yaml", tree))
    pipeline.stage_train(study, on_progress=lambda names, p: seen.append((names, p)), poll_s=0.02)
    assert seen and {names for names, _ in seen} == {"exact"} and all(p.max_steps == 6 for _, p in seen)
    assert [p.step for _, p in seen] == sorted(p.step for _, p in seen)


def test_a_training_that_cannot_start_is_one_line(tiny, tmp_path, capsys):
    """A base the shift cannot wrap fails in the training process; the pipeline says so in one line, exit 2."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny.folder("bert", 1) / "tokenizer.json"))
    SentenceTransformer(modules=[StaticEmbedding(tok, embedding_dim=8)]).save(str(tmp_path / "static"))
    capsys.readouterr()  # what saving it printed (transformers' bar)
    path = write(tmp_path / "s.yaml", study_tree(tmp_path, str(tmp_path / "static")))
    assert pipeline.cli(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jobs.pipeline: error: models.exact: training failed:"), err
    assert "StaticEmbedding" in err[0]
    assert not [p for p in (tmp_path / "models").iterdir()]  # nothing left behind


def test_a_recipe_with_one_dev_pair_is_one_line_before_anything_runs(tiny, tmp_path, capsys):
    """dev_limit 1: the dev Spearman would fail after the first epoch. The study's schema refuses it (as jobs.train
    --dev-limit 1 is refused), in one line, exit 2, before anything runs."""
    folder = str(tiny.folder("bert", 1))
    capsys.readouterr()  # the tiny model's saving bar
    tree = study_tree(tmp_path, folder)
    tree["models"]["exact"]["train"]["dev_limit"] = 1
    config = write(tmp_path / "s.yaml", tree)
    assert pipeline.cli(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"jobs.pipeline: error: {config}: models.exact.train.dev_limit: Input should be greater than or "
                   "equal to 2"], err
    assert not (tmp_path / "models").exists() or not [p for p in (tmp_path / "models").iterdir()]
