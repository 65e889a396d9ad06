"""Exact models: the embedding shift, fine-tuning (jobs.train), and the evaluation metrics.

The shift's promise is e(r) = 0 exactly, so that sum A -> f(a, b): checked on tiny models after real
training steps (any length, batched or not), and on a saved all-MiniLM-L6-v2 exact model reloaded with
plain `SentenceTransformer(path)`, whose attributions sum to its score (gauss-legendre, N = 32).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import CORPUS  # pytest puts tests/ on sys.path (rootdir conftest)

from xsbert_core import Explainer, InputError, UnsupportedModelError, is_shifted, load_model
from xsbert_core.metrics import (
    aso,
    aso_both_ways,
    average_ranks,
    grouped_average_ranks,
    grouped_top_k,
    jaccard_top_k,
    pearson,
    spearman,
    top_k,
)
from xsbert_core.training import TrainConfig, build_variant, fine_tune, pairs_dataset

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Dogs run.", "The quick brown fox jumps over the lazy dog.", "A man is playing a guitar on stage.", "Hi"]


def reference_embeddings(model, texts: list[str]) -> torch.Tensor:
    """The model's own embeddings of the references r = [CLS] PAD ... PAD [SEP] of each text (batched)."""
    tok = model[0].tokenizer
    enc = tok(texts, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    keep = enc["special_tokens_mask"].bool() & enc["attention_mask"].bool()
    ids = torch.where(keep, enc["input_ids"], torch.full_like(enc["input_ids"], tok.pad_token_id))
    features = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
    features["input_ids"] = ids
    with torch.no_grad():
        return model(features)["sentence_embedding"]


def trainable(model):
    for p in model.parameters():
        p.requires_grad_(True)
    model.train()
    return model


def tiny_data(n: int):
    a = [CORPUS[k % len(CORPUS)] for k in range(n)]
    b = [CORPUS[(3 * k + 1) % len(CORPUS)] for k in range(n)]
    return pairs_dataset(a, b, [((k * 7) % 10) / 10 for k in range(n)])


# --------------------------------------------------------------------------- the shift on tiny models
@pytest.mark.parametrize("variant", ["exact", "orig"])
@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_training_changes_weights_and_keeps_e_r_zero(tiny, tmp_path, arch, variant):
    model = trainable(tiny.build(arch, n_layers=2))
    build_variant(model, variant)
    assert is_shifted(model) and model.similarity_fn_name == ("dot" if variant == "orig" else "cosine")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = fine_tune(model, variant, tiny_data(12), tiny_data(6), TrainConfig(batch_size=4, max_steps=3,
                       learning_rate=1e-3), str(tmp_path), progress=False)  # fmt: skip
    assert result["steps"] == 3 and np.isfinite(result["dev_spearman"])
    after = model.state_dict()
    assert before.keys() == after.keys()  # the shift adds no weights and renames none
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("encoder.layer" in k or "layer." in k for k in changed), changed  # the encoder really trained
    model.eval()
    batched = reference_embeddings(model, TEXTS)
    assert torch.count_nonzero(batched) == 0  # exactly zero, in a padded batch of mixed lengths
    for text in TEXTS:
        assert torch.count_nonzero(reference_embeddings(model, [text])) == 0  # and one at a time
    e = model.encode(TEXTS, convert_to_tensor=True)
    assert (e.norm(dim=-1) > 0).all()  # real texts are not shifted to zero


def test_tuned_is_unchanged_and_exact_equals_pooled_difference(tiny):
    model = tiny.build("bert", n_layers=2)
    build_variant(model, "tuned")
    assert not is_shifted(model)
    exact = build_variant(tiny.build("bert", n_layers=2), "exact")
    # e(x) of the shifted model == mean-pool(T(x) - T(r)), computed here from the plain HF model
    hf = exact[0].auto_model
    tok = exact[0].tokenizer
    enc = tok(TEXTS, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    keep = enc["special_tokens_mask"].bool()
    ref = torch.where(keep, enc["input_ids"], torch.full_like(enc["input_ids"], tok.pad_token_id))
    mask = enc["attention_mask"]
    with torch.no_grad():
        t_x = hf(input_ids=enc["input_ids"], attention_mask=mask).last_hidden_state
        t_r = hf(input_ids=ref, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).float()
    expected = ((t_x - t_r) * m).sum(1) / m.sum(1)
    got = exact.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_engine_recognises_a_shifted_model(tiny):
    model = build_variant(tiny.build("bert", n_layers=2), "orig")
    ex = Explainer(model, layer=0, steps=4)
    assert (ex.mode, ex.similarity) == ("exact", "dot")  # auto: the model's own mode and similarity
    res = ex.explain("The quick brown fox.", "A lazy dog sleeps.")
    assert res.ref_term == 0.0 and res.target == pytest.approx(res.score, abs=1e-12)
    with pytest.raises(InputError, match="reference-shifted"):
        Explainer(model, layer=0, mode="approx")
    plain = tiny.get("bert", n_layers=2)
    assert (Explainer(plain, layer=0).mode, Explainer(plain, layer=0).similarity) == ("approx", "cos")


def test_build_variant_rejects_what_it_cannot_wrap(tiny):
    with pytest.raises(InputError, match="Unknown variant"):
        build_variant(tiny.build("bert", n_layers=1), "shifted")
    model = build_variant(tiny.build("bert", n_layers=1), "exact")
    with pytest.raises(UnsupportedModelError, match="already"):
        build_variant(model, "exact")


# --------------------------------------------------------------------------- the real model, through jobs.train
@pytest.fixture(scope="module")
def saved_exact(tmp_path_factory):
    from jobs.train import cli

    out = tmp_path_factory.mktemp("models")
    argv = ["--variant", "exact", "--out", str(out), "--train-limit", "8", "--dev-limit", "8", "--max-steps", "2",
            "--batch-size", "4", "-q"]  # fmt: skip
    assert cli(argv) == 0
    return out / "all-MiniLM-L6-v2-exact"


@pytest.mark.slow
def test_saved_exact_model_reloads_plainly_and_is_complete(saved_exact):
    info = json.loads((saved_exact / "xsbert_training.json").read_text())
    assert info["variant"] == "exact" and info["steps"] == 2 and info["hyperparameters"]["weight_decay"] == 0.1
    import sentence_transformers

    assert info["device"] == "cpu" and info["versions"]["sentence-transformers"] == sentence_transformers.__version__
    card = (saved_exact / "README.md").read_text()
    for needle in ("STS-B", "exact", "Dev Spearman", "python -m jobs.train --variant exact", "weight decay 0.1",
                   "s on cpu with xsbert-scale", f"sentence-transformers {sentence_transformers.__version__}"):
        assert needle in card, needle
    modules = json.loads((saved_exact / "modules.json").read_text())
    assert modules[0]["type"] == "xsbert_core.shift.ShiftedTransformer"
    # plain SentenceTransformer(path): after `import xsbert_core`, or with trust_remote_code=True
    for code in (
        "import xsbert_core; from sentence_transformers import SentenceTransformer as S; m = S(P)",
        "from sentence_transformers import SentenceTransformer as S; m = S(P, trust_remote_code=True)",
    ):
        probe = f"P = {str(saved_exact)!r}; {code}; print(type(m[0]).__name__, m.similarity_fn_name)"
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                             env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["ShiftedTransformer", "cosine"], out.stdout

    model = load_model(str(saved_exact))
    ex = Explainer(model, layer=-2, rule="gauss-legendre", steps=32)
    assert ex.mode == "exact"
    a, b = "A man is playing a guitar on stage.", "Someone performs music with an instrument."
    res = ex.explain(a, b)
    assert abs(res.attribution_sum - res.score) <= 1e-3
    own = model.encode([a, b], convert_to_tensor=True)  # the model's own forward: shift, pooling, Normalize
    fa, fb = ex.factors([a, b])
    engine = torch.nn.functional.normalize(torch.stack([fa.embedding, fb.embedding]), dim=-1)  # e(x) has no Normalize
    torch.testing.assert_close(engine, own, rtol=1e-5, atol=1e-6)
    assert res.score == pytest.approx(float(torch.cosine_similarity(own[0], own[1], dim=0)), abs=1e-6)


def test_train_job_keeps_the_last_epoch_and_the_best_dev_epoch(tmp_path, tiny):
    """Two epochs, evaluated on dev after each: <name> holds the last epoch, <name>-best-dev the epoch with the
    highest dev Spearman (the first of ties), each a model folder whose own dev score is the one recorded."""
    from jobs.train import cli
    from xsbert_core.training import dev_evaluator

    out = tmp_path / "models"
    argv = ["--variant", "exact", "--model", str(tiny.folder("bert", 1)), "--out", str(out), "--name", "m",
            "--train-limit", "16", "--dev-limit", "24", "--epochs", "3", "--batch-size", "4", "--lr", "1e-3", "-q"]
    assert cli(argv) == 0
    last = json.loads((out / "m" / "xsbert_training.json").read_text())
    best = json.loads((out / "m-best-dev" / "xsbert_training.json").read_text())
    evals = [h for h in last["history"] if f"eval_{last['metric']}" in h]
    scores = [h[f"eval_{last['metric']}"] for h in evals]
    assert [h["epoch"] for h in evals] == [1.0, 2.0, 3.0]
    first_max = scores.index(max(scores))
    assert last["checkpoint"] == "last-epoch" and last["dev_spearman"] == pytest.approx(scores[-1], abs=1e-6)
    assert best["checkpoint"] == "best-dev" and best["best"]["epoch"] == evals[first_max]["epoch"]
    assert best["dev_spearman"] == pytest.approx(max(scores), abs=1e-12)
    assert last["best_dev_path"] == str(out / "m-best-dev") and best["last_epoch_path"] == str(out / "m")
    assert "best dev score (epoch" in (out / "m-best-dev" / "README.md").read_text()
    # the last epoch is the model (App. A states no rule); the best-dev epoch is ours, never called the paper's
    assert "the last epoch (App. A states no checkpoint rule)" in (out / "m" / "README.md").read_text()
    assert "our option, not the paper's" in (out / "m-best-dev" / "README.md").read_text()
    for folder in ("m", "m-best-dev"):
        card = (out / folder / "README.md").read_text()
        assert "the paper's choice" not in card
        info = json.loads((out / folder / "xsbert_training.json").read_text())
        import hashlib

        assert info["weights_sha256"] == hashlib.sha256((out / folder / "model.safetensors").read_bytes()).hexdigest()
        assert info["weights_sha256"] in card
    # each folder's own dev score, recomputed from its weights, is the one recorded for its epoch
    from jobs.training.model import training_pairs

    dev = pairs_dataset(*training_pairs("stsb", "dev", 24))
    for folder, want in ((out / "m", scores[-1]), (out / "m-best-dev", max(scores))):
        model = load_model(str(folder), attn_implementation=None)
        got = dev_evaluator(dev, "exact")(model)[last["metric"]]
        assert got == pytest.approx(want, abs=1e-5), folder
    # the two folders hold different weights unless the last epoch was the best
    w_last = load_model(str(out / "m")).state_dict()
    w_best = load_model(str(out / "m-best-dev")).state_dict()
    same = all(torch.equal(w_last[k], w_best[k]) for k in w_last)
    assert same == (first_max == len(scores) - 1)
    # a second training into the same folders is refused without --overwrite, for either folder
    (out / "m").rename(tmp_path / "moved")
    assert cli(argv) == 2


def test_progress_is_reported_at_the_start_each_log_and_each_dev_evaluation(tiny, tmp_path, capsys):
    """fine_tune's on_progress: step 0 of all steps at the start, then the trainer's logs (a loss every 50 steps,
    the dev score after each epoch), in step order, the last at the last step with the last epoch's dev score."""
    from xsbert_core.training import TrainProgress

    model = trainable(tiny.build("bert", n_layers=1))
    build_variant(model, "tuned")
    seen: list[TrainProgress] = []
    capsys.readouterr()  # what building the tiny model printed
    bars = transformers.utils.logging.is_progress_bar_enabled()
    result = fine_tune(model, "tuned", tiny_data(12), tiny_data(6), TrainConfig(batch_size=4, epochs=2,
                       learning_rate=1e-3), str(tmp_path), progress=False, on_progress=seen.append)  # fmt: skip
    said = capsys.readouterr()  # progress=False: no bar (the trainer's, its model card's, a checkpoint's), no log dicts
    assert "{'" not in said.out and "Computing widget examples" not in said.err, said.err[-500:]
    assert "Writing model shards" not in said.err and "Loading weights" not in said.err, said.err[-500:]
    assert transformers.utils.logging.is_progress_bar_enabled() == bars  # as they were
    assert seen[0].step == 0 and seen[0].max_steps == 6 and seen[0].eta_s is None and seen[0].dev_spearman is None
    assert [p.step for p in seen] == sorted(p.step for p in seen) and seen[-1].step == result["steps"] == 6
    devs = [(p.epoch, p.dev_spearman) for p in seen if p.dev_spearman is not None]
    evals = [(h["epoch"], h[f"eval_{result['metric']}"]) for h in result["history"] if f"eval_{result['metric']}" in h]
    assert dict(devs) == pytest.approx(dict(evals)) and sorted(dict(devs)) == [1.0, 2.0]
    middle = next(p for p in seen if 0 < p.step < 6)
    assert middle.eta_s == pytest.approx(middle.seconds / middle.step * (6 - middle.step))
    line = str(TrainProgress(step=720, max_steps=1800, epoch=2.0, seconds=96.0, loss=0.02134, dev_spearman=0.85))
    assert line == "step 720/1800 (epoch 2.00), 96 s, ~144 s left, loss 0.02134, dev Spearman 0.8500"

    # on_step after every optimizer step: what it raises ends the training there, between two reports
    steps: list[int] = []

    def stop_at_3(p: TrainProgress) -> None:
        steps.append(p.step)
        if p.step == 3:
            raise KeyboardInterrupt("stop")

    model = trainable(tiny.build("bert", n_layers=1))
    build_variant(model, "tuned")
    with pytest.raises(KeyboardInterrupt, match="stop"):
        fine_tune(model, "tuned", tiny_data(40), tiny_data(6), TrainConfig(batch_size=4, epochs=1),
                  str(tmp_path / "stopped"), progress=False, on_step=stop_at_3)  # fmt: skip
    assert steps == [1, 2, 3]


def test_deterministic_training_sets_and_restores_torchs_settings():
    """TrainConfig.deterministic (the default): PyTorch's deterministic algorithms (warn-only), cuDNN's deterministic
    mode and cuBLAS's fixed workspace while the trainer runs, as they were after."""
    import os

    from xsbert_core.training import CUBLAS_DETERMINISTIC, deterministic_algorithms

    assert TrainConfig().deterministic
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              os.environ.get("CUBLAS_WORKSPACE_CONFIG"))  # fmt: skip
    with deterministic_algorithms(True):
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_DETERMINISTIC
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            os.environ.get("CUBLAS_WORKSPACE_CONFIG")) == before  # fmt: skip
    with deterministic_algorithms(False):
        assert torch.are_deterministic_algorithms_enabled() == before[0]


def test_one_recipe_trained_twice_gives_the_same_weights(tmp_path, tiny):
    """The same command on the same machine and software: the same weights, bit for bit (the checksum the training
    record keeps)."""
    from jobs.train import cli

    argv = ["--variant", "exact", "--model", str(tiny.folder("bert", 1)), "--train-limit", "8", "--dev-limit", "4",
            "--max-steps", "2", "--batch-size", "4", "--lr", "1e-3", "-q"]  # fmt: skip
    shas = []
    for name in ("a", "b"):
        assert cli([*argv, "--out", str(tmp_path), "--name", name]) == 0
        shas.append(json.loads((tmp_path / name / "xsbert_training.json").read_text())["weights_sha256"])
    assert shas[0] == shas[1]
    assert cli([*argv, "--out", str(tmp_path), "--name", "c", "--seed", "1"]) == 0  # another seed: other weights
    assert json.loads((tmp_path / "c" / "xsbert_training.json").read_text())["weights_sha256"] != shas[0]


@pytest.mark.slow
def test_a_killed_training_keeps_the_old_model_and_the_next_one_clears_what_it_left(tmp_path, tiny, capsys):
    """jobs.train writes beside the target and replaces it at the end. A training interrupted (Ctrl-C) after its
    first epoch's checkpoint says so in one line and leaves nothing; one SIGKILLed there leaves the model it was to
    replace as it was (its weights' sha256), and a hidden folder; the next training into that target removes the
    folder. A training without a best-dev epoch removes an earlier one's."""
    import os
    import signal
    import socket
    import threading
    import time

    from jobs.train import cli

    out = tmp_path / "models"
    argv = ["--variant", "exact", "--model", str(tiny.folder("bert", 1)), "--out", str(out), "--name", "m",
            "--train-limit", "8", "--dev-limit", "6", "--batch-size", "4", "-q", "--overwrite"]
    assert cli([*argv, "--epochs", "1"]) == 0
    old = json.loads((out / "m" / "xsbert_training.json").read_text())["weights_sha256"]

    def first_epoch_saved(timeout: float = 120) -> bool:
        deadline = time.monotonic() + timeout
        while not list(out.glob(".m.partial-*/xsbert-train-*/checkpoint-*")):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    # Ctrl-C (a real SIGINT to this process, in-process) after the first epoch's checkpoint: one line and exit 130;
    # the hidden folder removed on the way out, the model as it was. SIGINT raises KeyboardInterrupt as in a fresh
    # `python -m jobs.train`: an earlier test's in-process Ray can leave its deferring handler (DeferSigint) in this
    # process, and the training then ran on. 400 epochs (not unbounded): a SIGINT that does not stop it fails here.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = threading.Thread(target=lambda: first_epoch_saved() and os.kill(os.getpid(), signal.SIGINT))
    watcher.start()
    try:
        assert cli([*argv, "--epochs", "400"]) == 130
    finally:
        watcher.join()
        signal.signal(signal.SIGINT, handler)
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "jobs.train: interrupted: nothing of this training was kept; the model folders are as they were")
    assert sorted(p.name for p in out.iterdir()) == ["m", "m-best-dev"]
    assert json.loads((out / "m" / "xsbert_training.json").read_text())["weights_sha256"] == old

    proc = subprocess.Popen([sys.executable, "-m", "jobs.train", *argv, "--epochs", "10000"], cwd=ROOT,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert first_epoch_saved(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "no epoch"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert [p.name for p in out.glob(".m.partial-*")] == [f".m.partial-{socket.gethostname()}-{proc.pid}"]
    assert json.loads((out / "m" / "xsbert_training.json").read_text())["weights_sha256"] == old
    assert load_model(str(out / "m")) is not None

    assert cli([*argv, "--epochs", "1", "--seed", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["m", "m-best-dev"]  # the killed one's folder went
    assert json.loads((out / "m" / "xsbert_training.json").read_text())["weights_sha256"] != old
    # a training that evaluates no epoch (--max-steps) has no best-dev epoch: an earlier training's goes
    assert cli([*argv, "--max-steps", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["m"]
    assert json.loads((out / "m" / "xsbert_training.json").read_text())["best_dev_path"] is None


def test_two_trainings_into_one_folder_the_second_is_one_line_at_once(tmp_path, tiny, capsys):
    """Both trained and printed `saved:`, and the later one replaced the other's model without a word (an outside
    audit: 4 of 4 tries). The first holds the lock of the folder (.m.lock beside it) while it trains; the second stops
    before it trains (after its inputs are checked: a bad one writes nothing); a killed first's lock goes with its
    process, and the next training takes it; a finished training leaves no lock file."""
    import os
    import signal
    import socket
    import time

    from jobs.train import cli

    out = tmp_path / "models"
    argv = ["--variant", "tuned", "--model", str(tiny.folder("bert", 1)), "--out", str(out), "--name", "m",
            "--train-limit", "8", "--dev-limit", "6", "--batch-size", "4", "-q"]  # fmt: skip
    first = subprocess.Popen([sys.executable, "-m", "jobs.train", *argv, "--epochs", "10000"], cwd=ROOT,
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob(".m.partial-*")) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, first.stderr.read().decode()[-2000:]
        capsys.readouterr()
        assert cli([*argv, "--epochs", "1"]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"jobs.train: error: another training is writing {out / 'm'} (lock held by pid {first.pid} on "
            f"{socket.gethostname()}); wait for it to finish, or give this one another name"]  # fmt: skip
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert cli([*argv, "--epochs", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["m", "m-best-dev"]


def test_train_job_bad_inputs_fail_before_training(tmp_path, tiny, capsys):
    from jobs.train import cli

    out = tmp_path / "m"
    with pytest.raises(SystemExit) as exc:
        cli(["--variant", "shifted", "--out", str(out)])
    assert exc.value.code == 2 and "invalid choice: 'shifted'" in capsys.readouterr().err
    assert cli(["--variant", "tuned", "--dataset", str(tmp_path / "none.tsv"), "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    # a model the shift cannot wrap: its first module is not a Transformer
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny.folder("bert", 1) / "tokenizer.json"))
    static = SentenceTransformer(modules=[StaticEmbedding(tok, embedding_dim=8)])
    static.save(str(tmp_path / "static"))
    capsys.readouterr()
    assert cli(["--variant", "exact", "--model", str(tmp_path / "static"), "--out", str(out), "--train-limit", "4",
                "--dev-limit", "4"]) == 2  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("jobs.train: error:") and "StaticEmbedding" in err[-1]
    assert cli(["--variant", "tuned", "--max-steps", "0", "--out", str(out)]) == 2
    assert "--max-steps" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")  # an --out that cannot be made: said before the data and model load
    assert cli(["--variant", "tuned", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "a-file")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"jobs.train: error: --out {tmp_path}/a-file: cannot write there (Not a directory)")
    assert not out.exists()  # nothing written by any of them


BAD_FLAGS = [
    # (flags, the one line after "jobs.train: error: ")
    (["--name", "../../escape"], "--name must be a plain folder name (no path separator, not . or ..), got "
                                 "'../../escape'; the folder is <out>/<name>"),
    (["--name", "/abs/path"], "--name must be a plain folder name"),
    (["--name", ".."], "--name must be a plain folder name"),
    (["--name", ""], "--name must be a plain folder name"),
    (["--lr", "nan"], "--lr must be a positive number, got nan"),
    (["--lr", "0"], "--lr must be a positive number, got 0.0"),
    (["--epochs", "inf"], "--epochs must be a positive number, got inf"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--weight-decay", "-1"], "--weight-decay must be a number >= 0, got -1.0"),
    (["--weight-decay", "nan"], "--weight-decay must be a number >= 0, got nan"),
    (["--warmup-ratio", "1"], "--warmup-ratio must lie in [0, 1), got 1.0"),
    (["--train-limit", "0"], "--train-limit must be >= 1, got 0"),
    (["--dev-limit", "1"], "--dev-limit must be >= 2 (the dev Spearman needs 2 pairs), got 1"),
]


@pytest.mark.parametrize("flags,message", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_train_job_bad_flags_are_one_line_naming_the_flag_before_anything_loads(tmp_path, capsys, flags, message):
    """Each bad value is said in one line naming its flag, before --out is made and before the data or the model load
    (the model named here does not exist: a check that came after its load would say that instead)."""
    from jobs.train import cli

    out = tmp_path / "a" / "models"
    assert cli(["--variant", "tuned", "--model", str(tmp_path / "no-model"), "--out", str(out), "--train-limit", "4",
                "--dev-limit", "4", "--max-steps", "1", *flags]) == 2  # fmt: skip
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"jobs.train: error: {message}"), lines
    assert sorted(p.name for p in tmp_path.rglob("*")) == []  # nothing written, inside --out or beside it


def test_train_job_with_fewer_than_two_dev_pairs_is_one_line_before_the_model_loads(tmp_path, capsys):
    """A dataset whose dev split has one usable pair: the dev Spearman would fail after the first epoch."""
    from jobs.train import cli

    data = tmp_path / "pairs.tsv"
    rows = [("train", CORPUS[k], CORPUS[k + 1], k % 5) for k in range(4)] + [("dev", CORPUS[5], CORPUS[6], 3)]
    data.write_text("split\tsentence1\tsentence2\tscore\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))
    assert cli(["--variant", "tuned", "--model", str(tmp_path / "no-model"), "--dataset", str(data),
                "--out", str(tmp_path / "models")]) == 2  # fmt: skip
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == f"jobs.train: error: {data} dev: 1 dev pair(s); the dev Spearman needs at least 2", lines


# --------------------------------------------------------------------------- metrics
def test_a_trained_models_folder_is_named_after_its_base_and_its_best_dev_epoch_beside_it():
    from xsbert_core.training import base_name, checkpoint_folder

    assert base_name("sentence-transformers/all-MiniLM-L6-v2") == "all-MiniLM-L6-v2"
    assert base_name("models/m/") == base_name(Path("models/m")) == "m" and base_name("/") == "/"

    assert checkpoint_folder(Path("models/m"), "last-epoch") == Path("models/m")
    assert checkpoint_folder(Path("models/m"), "best-dev") == Path("models/m-best-dev")
    with pytest.raises(InputError, match="checkpoint 'best'"):
        checkpoint_folder(Path("models/m"), "best")


def test_spearman_is_pearson_over_average_ranks_like_scipy():
    from scipy import stats

    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=200).astype(float)  # many ties
    y = x + rng.integers(0, 3, size=200)
    assert average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    z = rng.normal(size=200)
    assert pearson(x, z) == pytest.approx(stats.pearsonr(x, z).statistic, abs=1e-12)
    assert spearman(z, -z) == pytest.approx(-1.0)
    with pytest.raises(InputError):
        spearman([1.0, 2.0], [1.0])


def test_jaccard_top_k():
    assert jaccard_top_k([5, -4, 1, 0], [4, 0, -5, 1], k=2) == pytest.approx(1 / 3)  # {0,1} vs {2,0}
    assert jaccard_top_k([1, 2, 3], [1, 2, 3], k=10) == 1.0


def test_grouped_ranks_and_top_k_are_scipys_and_sorteds_per_group():
    """The one-sort forms stage 2 uses for a batch of pairs: per group, scipy's average ranks, and the positions of
    the k largest |x| (or x), largest first, ties by the lower position; groups in any order, of any size, and of
    any numbers (a radix sort for group numbers in [0, 2**16), a lexsort for others: negative or larger)."""
    from scipy import stats

    rng = np.random.default_rng(3)
    for n, numbers in [(n, numbers) for n in (0, 1, 2, 7, 300) for numbers in ("small", "large", "negative")]:
        x = np.round(rng.normal(size=n), int(rng.integers(0, 2)))  # ties
        x[: n // 3] = np.abs(x[: n // 3])  # ties in |x| between +v and -v
        x[n // 3 : 2 * n // 3] *= -1
        g = rng.integers(0, 6, size=n) * {"small": 1, "large": 20_000, "negative": -1}[numbers]
        want = np.empty(n)
        for q in set(g.tolist()):
            want[g == q] = stats.rankdata(x[g == q])
        np.testing.assert_array_equal(grouped_average_ranks(x, g), want)
        np.testing.assert_array_equal(average_ranks(x), stats.rankdata(x) if n else [])
        for by, key in (("abs", lambda p: (-abs(x[p]), p)), ("value", lambda p: (-x[p], p))):
            want_top = [p for q in sorted(set(g.tolist())) for p in sorted(np.flatnonzero(g == q), key=key)[:4]]
            assert grouped_top_k(x, g, 4, by).tolist() == want_top
            assert top_k(x, 4, by).tolist() == sorted(range(n), key=key)[:4]
    with pytest.raises(InputError, match="by"):
        top_k([1.0], 1, "signed")


def test_aso_is_deepsig_with_our_seed():
    from deepsig import aso as deepsig_aso

    rng = np.random.default_rng(1)
    good, bad = rng.normal(1.0, 1.0, 150), rng.normal(0.0, 1.0, 150)
    got = aso(good, bad, seed=3, num_bootstrap_iterations=200)
    assert got == deepsig_aso(good, bad, seed=3, num_bootstrap_iterations=200, show_progress=False)
    assert got < 0.5  # the clearly better one is found better
    both = aso_both_ways(-good, -bad, seed=3, num_bootstrap_iterations=200)  # errors: lower is better
    assert both["eps_a_better"] == pytest.approx(got) and both["eps_b_better"] > 0.5
