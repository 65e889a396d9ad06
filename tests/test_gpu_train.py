"""bench/gpu_train.py: a model folder packed as float16 differences from its base comes back within the error the
pack measured, with every other file as it was; parts that do not add up, or another base, are refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_train  # noqa: E402


@pytest.fixture
def base_and_tuned(tmp_path, tiny):
    """A tiny BERT as the base, and a copy whose weights moved a little (as fine-tuning moves them), plus one tensor
    the base does not have (saved as is)."""
    base = tmp_path / "base"
    tiny.build("bert", n_layers=1).save(str(base))
    models = tmp_path / "models"
    tuned = models / "tuned"
    tiny.build("bert", n_layers=1).save(str(tuned))
    g = torch.Generator().manual_seed(0)
    w = load_file(tuned / gpu_train.WEIGHTS)
    w = {k: t + 1e-3 * torch.randn(t.shape, generator=g) if t.is_floating_point() else t for k, t in w.items()}
    w["extra.bias"] = torch.arange(3, dtype=torch.float32)
    save_file(w, tuned / gpu_train.WEIGHTS, metadata={"format": "pt"})
    (tuned / "xsbert_training.json").write_text(json.dumps({"name": "tuned"}))
    return base, models, w


def test_a_packed_model_comes_back_within_the_measured_error(tmp_path, base_and_tuned):
    base, models, trained = base_and_tuned
    packs, back = tmp_path / "packs", tmp_path / "back"
    info = gpu_train.pack(base, models, packs, "tuned")
    assert info["as_is"] == ["extra.bias"] and 0 < info["max_abs_rebuild_error"] < 1e-5
    gpu_train.unpack(base, packs, back, "tuned")
    rebuilt = load_file(back / "tuned" / gpu_train.WEIGHTS)
    assert set(rebuilt) == set(trained)
    error = max((rebuilt[k] - trained[k]).abs().max().item() for k in trained)
    assert error == info["max_abs_rebuild_error"]  # the same float32 additions on both sides
    assert torch.equal(rebuilt["extra.bias"], trained["extra.bias"])
    for f in (models / "tuned").rglob("*"):
        if f.is_file() and f.name != gpu_train.WEIGHTS:
            assert (back / "tuned" / f.relative_to(models / "tuned")).read_bytes() == f.read_bytes(), f


def test_parts_that_do_not_add_up_or_another_base_are_refused(tmp_path, base_and_tuned, tiny):
    base, models, _ = base_and_tuned
    packs = tmp_path / "packs"
    gpu_train.pack(base, models, packs, "tuned")
    other = tmp_path / "other-base"
    tiny.build("bert", n_layers=1, seed=1).save(str(other))
    with pytest.raises(SystemExit, match="not the base"):
        gpu_train.unpack(other, packs, tmp_path / "a", "tuned")
    part = packs / "tuned.delta.000"
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(SystemExit, match="do not add up"):
        gpu_train.unpack(base, packs, tmp_path / "b", "tuned")


def test_part_mib_bounds_every_part_and_the_parts_come_back_whole(tmp_path, base_and_tuned, capsys):
    base, models, trained = base_and_tuned
    packs, back = tmp_path / "packs", tmp_path / "back"
    part_mib = 0.01  # ~10 KiB: the tiny model's differences take several parts
    assert gpu_train.main(["pack", "--base", str(base), "--models", str(models), "--out", str(packs),
                           "--part-mib", str(part_mib), "tuned"]) == 0  # fmt: skip
    parts = sorted(packs.glob("tuned.delta.*"))
    assert len(parts) > 1 and all(f.stat().st_size <= int(part_mib * 2**20) for f in parts)
    assert json.loads(capsys.readouterr().out)["parts"] == len(parts)
    gpu_train.unpack(base, packs, back, "tuned")
    rebuilt = load_file(back / "tuned" / gpu_train.WEIGHTS)
    assert max((rebuilt[k] - trained[k]).abs().max().item() for k in trained) < 1e-5
    with pytest.raises(SystemExit):
        gpu_train.main(["pack", "--base", str(base), "--models", str(models), "--out", str(packs), "--part-mib", "0",
                        "tuned"])  # fmt: skip
    assert "--part-mib must be above 0" in capsys.readouterr().err
