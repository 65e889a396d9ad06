"""The offline bundle (jobs.bundle, jobs/bundling): float16 weights against torch's rounding, pip's resolution
narrowed to what the target lacks, and a bundle built, installed with `pip --no-index` into a fresh virtualenv
with no network, and the job run from it; a corrupt or missing part is one line naming the part.

The fresh virtualenv sees this venv's distributions through links (all but the project and two small ones, PyYAML
and tqdm), so that the bundle carries a few real wheels, downloaded by pip for this interpreter (pip's cache serves
repeats), instead of torch and ray: what `--target-python` is for (leave out what the target has).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from jobs.bundle import _requirements
from jobs.bundling import installer
from jobs.bundling.wheels import needed, only_requirements, platform_tags, read_freeze

LEFT_FOR_THE_BUNDLE = ("xsbert-scale", "pyyaml", "tqdm")  # what the test target lacks


# --------------------------------------------------------------------------- pieces, fast
def test_platform_tags_take_older_glibc_and_legacy_aliases():
    tags = platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and tags[-1] == "manylinux1_x86_64"
    assert "manylinux2014_x86_64" in tags and "manylinux_2_29_x86_64" not in tags
    assert "manylinux2014_x86_64" not in platform_tags("manylinux_2_12_x86_64")
    assert platform_tags("manylinux2014_x86_64") == platform_tags("manylinux_2_17_x86_64")
    assert platform_tags("macosx_11_0_arm64") == ["macosx_11_0_arm64"]


def _dist(name, requires=(), requested=False, extras=()):
    return {"metadata": {"name": name, "version": "1", "requires_dist": list(requires)}, "requested": requested,
            "requested_extras": list(extras)}  # fmt: skip


def test_needed_leaves_out_an_excluded_distribution_and_what_only_it_needs():
    report = {"install": [
        _dist("xsbert-scale", ["torch>=2", "Ray[data]>=2", "jinja2", "pywin32; sys_platform == 'win32'"], True),
        _dist("torch", ["sympy", "jinja2", "nvidia-cublas; platform_system == 'Linux'"]),
        _dist("sympy", ["mpmath"]), _dist("mpmath"), _dist("nvidia-cublas"), _dist("jinja2", ["markupsafe"]),
        _dist("markupsafe"), _dist("pywin32"),
        _dist("ray", ["click", "pandas; extra == 'data'", "aiohttp; extra == 'default'"]),
        _dist("click"), _dist("pandas"), _dist("aiohttp"),
    ]}  # fmt: skip
    linux = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.12"}
    everything = needed(report, ["xsbert-scale"], set(), linux)
    assert everything == {"xsbert-scale", "torch", "sympy", "mpmath", "nvidia-cublas", "jinja2", "markupsafe", "ray",
                          "click", "pandas"}  # fmt: skip
    # torch out: sympy, mpmath and nvidia go with it, jinja2 stays (the project needs it itself)
    assert needed(report, ["xsbert-scale"], {"torch"}, linux) == everything - {"torch", "sympy", "mpmath",
                                                                                "nvidia-cublas"}  # fmt: skip
    assert "pywin32" in needed(report, ["xsbert-scale"], set(), {**linux, "sys_platform": "win32"})


def test_read_freeze_pins_without_local_versions(tmp_path):
    f = tmp_path / "freeze.txt"
    f.write_text("torch==2.5.1+cu124\nPyYAML==6.0.2\n-e git+https://x/y#egg=z\nfoo @ file:///x\n# c\n")
    assert read_freeze(f) == {"torch": "2.5.1", "pyyaml": "6.0.2"}
    # a package list without versions (a machine's image as documented): there, in a version not known here
    f.write_text("# an image's packages\nnumpy==2.5.2\nsentence_transformers\nPyArrow  # pinned nowhere\n")
    assert read_freeze(f) == {"numpy": "2.5.2", "sentence-transformers": None, "pyarrow": None}


def test_only_takes_the_projects_own_requirement_with_the_extras_asked_for(tmp_path):
    import zipfile

    wheel = tmp_path / "xsbert_scale-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("xsbert_scale-0.1.0.dist-info/METADATA", "Metadata-Version: 2.4\nName: xsbert-scale\n"
                    "Requires-Dist: ray[data,default]<2.64,>=2.40\nRequires-Dist: tqdm>=4.60\n"
                    "Requires-Dist: pytest>=8; extra == \"test\"\n")  # fmt: skip
    assert _requirements("ray[data,default],tqdm") == ("ray[data,default]", "tqdm")
    assert only_requirements(wheel, ("ray[data]", "tqdm")) == ["ray[data]<2.64,>=2.40", "tqdm>=4.60"]
    assert only_requirements(wheel, ("ray",)) == ["ray[data,default]<2.64,>=2.40"]  # the project's extras
    for bad in ("duckdb", "pytest"):  # not a requirement; only an extra's
        with pytest.raises(installer.BundleError, match="not one of the project's requirements"):
            only_requirements(wheel, (bad,))


def test_parts_join_to_the_file_and_sizes_parse(tmp_path):
    data = os.urandom(10_000)
    (tmp_path / "f.bin").write_bytes(data)
    entry = installer.split_file(tmp_path / "f.bin", tmp_path / "parts", 4096)
    assert [p["size"] for p in entry["parts"]] == [4096, 4096, 1808]
    exact = installer.split_file(tmp_path / "f.bin", tmp_path / "parts2", 5000)
    assert [p["size"] for p in exact["parts"]] == [5000, 5000]  # no empty third part
    assert entry["parts"][0]["file"] == "parts/f.bin.000"  # relative to the bundle (parts' parent)
    for e in (entry, exact):
        assert installer.join_parts(tmp_path, e, tmp_path / "joined").read_bytes() == data
    assert installer.parse_size("60MiB") == 60 * 2**20 and installer.parse_size("15MB") == 15 * 10**6
    with pytest.raises(installer.BundleError, match="unit"):
        installer.parse_size("60 parsecs")


def test_a_damaged_manifest_or_an_into_that_is_a_file_is_one_line_from_the_installer(tmp_path, capsys):
    """install.py (the bundle's own, standard library only): a manifest.json cut short or of another shape, and an
    --into that names a file, are one line and status 2 (they were tracebacks); nothing is made."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    data = os.urandom(5000)
    (tmp_path / "f.bin").write_bytes(data)
    entry = installer.split_file(tmp_path / "f.bin", bundle / "parts", 4096)
    good = json.dumps({"format": installer.FORMAT, "items": [{**entry, "kind": "data"}]})
    for text, why in ((good[:40], "not readable JSON"), ("[1, 2]", "format 'list', this installer reads"),
                      (json.dumps({"format": installer.FORMAT}), "no list of items")):  # fmt: skip
        (bundle / "manifest.json").write_text(text)
        for argv in (["--check"], ["--into", str(tmp_path / "into")]):
            assert installer.main(["--bundle", str(bundle), *argv]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"install: error: {bundle / 'manifest.json'}: {why}") and err.count("\n") == 1, err
    (bundle / "manifest.json").write_text(good)
    assert installer.main(["--bundle", str(bundle), "--check"]) == 0
    (tmp_path / "a-file").write_text("")
    assert installer.main(["--bundle", str(bundle), "--into", str(tmp_path / "a-file"), "--models-only"]) == 2
    assert capsys.readouterr().err == f"install: error: --into {tmp_path / 'a-file'}: not a folder\n"
    assert not (tmp_path / "into").exists()


def test_an_out_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    """--out a file, or under one: one line and status 2 before anything is built (they were tracebacks)."""
    from jobs.bundle import cli

    (tmp_path / "a-file").write_text("")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for out, why in (("a-file", "--out {}: cannot write there (Not a directory)"),
                     ("a-file/sub", "--out {}: cannot write there (Not a directory)"),
                     ("full", "{} exists and is not empty; choose a new --out")):  # fmt: skip
        assert cli(["--out", str(tmp_path / out), "--no-wheels", "--datasets", "qqp"]) == 2
        assert capsys.readouterr().err == f"jobs.bundle: error: {why.format(tmp_path / out)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "full"]


def test_a_second_bundle_into_the_folder_being_written_is_one_line(tmp_path, capsys, monkeypatch):
    """Two jobs.bundle into one --out both wrote there (exit 0 each; the manifest kept one bundle and the other's parts
    lay orphaned), and one that failed or was interrupted removed the other's finished bundle. One bundle at a time
    now: while another process holds the folder's lock, a second stops in one line naming the holder and writes
    nothing; with the lock free it writes its bundle, and the lock file goes with it."""
    from jobs.bundle import cli

    monkeypatch.setenv("XSBERT_QQP", str(tmp_path / "qqp.tsv"))
    (tmp_path / "qqp.tsv").write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\tA?\tB?\t0\n")
    out, lock = tmp_path / "b", tmp_path / ".b.bundle.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from jobs.processes "
                               "import lock_file; fh = lock_file(Path(sys.argv[1])); print(fh is not None, flush=True); "
                               "time.sleep(120)", str(lock)], cwd=Path(__file__).resolve().parents[1],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "True"
        assert cli(["--out", str(out), "--no-wheels", "--datasets", "qqp"]) == 2
        err = capsys.readouterr().err
        assert err == (f"jobs.bundle: error: another jobs.bundle is writing {out} (lock held by pid {holder.pid} on "
                       f"{os.uname().nodename}); wait for it, or choose another --out\n")
        assert not any(out.iterdir())
    finally:
        holder.kill()
        holder.wait()
    assert cli(["--out", str(out), "--no-wheels", "--datasets", "qqp"]) == 0
    assert (out / "manifest.json").is_file() and not lock.exists()


def test_a_missing_have_file_model_or_dataset_is_one_line_before_anything_is_built(tmp_path, capsys):
    """--have naming no file was a traceback after the project wheel was built; an empty folder as a model was
    bundled as one (exit 0), to fail on the offline machine; a dataset that is no file is found out before the wheels
    are resolved (minutes), not after."""
    from jobs.bundle import cli

    (tmp_path / "empty-model").mkdir()
    for argv, why in ((["--have", str(tmp_path / "freeze.txt")], f"--have {tmp_path / 'freeze.txt'}: no such file"),
                      (["--no-wheels", "--models", str(tmp_path / "empty-model")],
                       f"model {str(tmp_path / 'empty-model')!r}: {tmp_path / 'empty-model'} holds no model"),
                      (["--datasets", str(tmp_path / "pairs.tsv")],
                       f"dataset {str(tmp_path / 'pairs.tsv')!r}: not `qqp` and not a file")):
        assert cli(["--out", str(tmp_path / "out"), *argv]) == 2
        said = capsys.readouterr()
        assert said.err.startswith(f"jobs.bundle: error: {why}") and "project wheel" not in said.out, said
    assert not (tmp_path / "out").exists()


def test_float16_weights_are_torch_rounding_and_the_recorded_error(tmp_path):
    """The installer's float32 is torch's float32(float16(w)) to the bit; the recorded error is max |that - w|; a
    tensor float16 cannot hold stays float32; other dtypes pass as they are."""
    g = torch.Generator().manual_seed(0)
    w = {"a.weight": torch.randn(64, 32, generator=g) * 0.05, "b.bias": torch.randn(7, generator=g) * 3,
         "huge": torch.tensor([1e5, -2.0]), "ids": torch.arange(5, dtype=torch.int64),
         "half": torch.randn(3, generator=g).half()}  # fmt: skip
    save_file(w, tmp_path / "model.safetensors", metadata={"format": "pt"})
    info = installer.weights_to_float16(tmp_path / "model.safetensors", tmp_path / "f16.safetensors")
    assert (info["float16_tensors"], info["float32_tensors_kept"]) == (2, ["huge"])
    assert (tmp_path / "f16.safetensors").stat().st_size < (tmp_path / "model.safetensors").stat().st_size
    installer.weights_to_float32(tmp_path / "f16.safetensors", tmp_path / "back.safetensors")
    back = load_file(tmp_path / "back.safetensors")
    for k in ("a.weight", "b.bias"):
        assert back[k].dtype == torch.float32 and torch.equal(back[k], w[k].half().float())
    for k in ("huge", "ids", "half"):
        assert back[k].dtype == w[k].dtype and torch.equal(back[k], w[k])
    err = max(float((w[k].half().float() - w[k]).abs().max()) for k in ("a.weight", "b.bias"))
    assert info["max_abs_rounding_error"] == pytest.approx(err, rel=0, abs=0) and 0 < err < 3 * 2**-11
    assert info["float32_sha256"] == installer.sha256_file(tmp_path / "back.safetensors")
    with open(tmp_path / "back.safetensors", "rb") as fh:  # the metadata as it was, no marker of ours left
        n = int.from_bytes(fh.read(8), "little")
        assert json.loads(fh.read(n))["__metadata__"] == {"format": "pt"}


# --------------------------------------------------------------------------- the whole bundle
def _overlay_venv(target: Path, leave_out: tuple[str, ...]) -> Path:
    """A fresh virtualenv whose site-packages links every top-level entry of this venv's, except the files of the
    `leave_out` distributions and the project's editable install."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    py = target / "bin" / "python"
    theirs = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    skip: set[str] = set()
    for name in leave_out:
        dist = md.distribution(name)
        skip |= {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        skip.add(Path(dist._path).name)  # type: ignore[attr-defined]  # its .dist-info
    for entry in ours.iterdir():
        if entry.name in skip or entry.name.startswith("__editable__") or entry.name.endswith(".dist-info") and any(
            entry.name.lower().startswith(n.replace("-", "_") + "-") for n in leave_out
        ):
            continue
        (theirs / entry.name).symlink_to(entry)
    return py


@pytest.mark.slow
def test_bundle_installs_offline_and_the_job_runs_from_it(tmp_path, tiny):
    target_env = tmp_path / "target"
    py = _overlay_venv(target_env, LEFT_FOR_THE_BUNDLE)
    assert subprocess.run([str(py), "-c", "import yaml"], capture_output=True).returncode != 0  # left out indeed
    model_dir = tmp_path / "tiny-st"
    tiny.build("bert").save(str(model_dir))
    (tmp_path / "pairs.tsv").write_text("id\tsentence1\tsentence2\tscore\n1\tA man plays a guitar.\tSomeone plays "
                                        "music.\t3.2\n2\tThe dog runs.\tA dog is running.\t4.5\n3\tIt rains.\t"
                                        "The cat sleeps.\t0.1\n")  # fmt: skip
    out = tmp_path / "bundle"
    built = subprocess.run([sys.executable, "-m", "jobs.bundle", "--out", str(out), "--target-python", str(py),
                            "--models", str(model_dir), "--float16", "--datasets", str(tmp_path / "pairs.tsv"),
                            "--part-size", "1MiB"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    wheels = sorted(i["file"].split("-")[0].lower() for i in manifest["items"] if i["kind"] == "wheel")
    assert wheels == ["pyyaml", "tqdm", "xsbert_scale"], wheels
    model = next(i for i in manifest["items"] if i["kind"] == "model")
    assert len(model["parts"]) >= 2 and all(p["size"] <= 2**20 for i in manifest["items"] for p in i["parts"])
    assert 0 < model["float16"]["max_abs_rounding_error"] < 1e-3
    assert manifest["target"]["target_python"] == str(py) and "torch" not in str(manifest["resolved"])

    # install: no index, no network (a proxy that refuses), the machine's pip configuration ignored
    env = {**os.environ, "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}  # fmt: skip
    into = tmp_path / "opt"
    inst = subprocess.run([sys.executable, str(out / "install.py"), "--into", str(into), "--python", str(py)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert inst.returncode == 0, inst.stdout[-2000:] + inst.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import jobs, yaml, tqdm; print(jobs.__file__)"], capture_output=True,
                           text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert where.returncode == 0 and str(target_env) in where.stdout, where.stdout + where.stderr
    rebuilt = load_file(into / "models" / "tiny-st" / "model.safetensors")
    original = load_file(model_dir / "model.safetensors")
    assert all(torch.equal(rebuilt[k], original[k].half().float()) for k in original)

    # the job, from the installed package, on the bundled pairs with the bundled model
    runs = tmp_path / "runs"
    # no proxy here: Ray's own gRPC connections on 127.0.0.1 would take it
    job_env = {**{k: v for k, v in env.items() if not k.endswith("_proxy")}, "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_AUTH_MODE": "disabled"}  # fmt: skip
    job = subprocess.run([str(py), "-m", "jobs.attribute", "--dataset", str(into / "data" / "pairs.tsv"),
                          "--model", str(into / "models" / "tiny-st"), "--layer", "1", "--steps", "2",
                          "--num-actors", "1", "--out", str(runs), "--quiet"],
                         capture_output=True, text=True, env=job_env, cwd=tmp_path)  # fmt: skip
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-3000:]
    assert "3 pairs in = 3 done + 0 quarantined" in job.stdout
    import pyarrow.parquet as pq

    pairs = pq.read_table(next(runs.iterdir()) / "pairs").to_pandas()
    assert len(pairs) == 3 and np.isfinite(pairs.attribution_sum).all()

    # a corrupt part, then a missing one: one line naming the part, nothing installed
    part = out / model["parts"][1]["file"]
    good = part.read_bytes()
    part.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    for broken, word in ((part, "corrupt"), (None, "missing")):
        if broken is None:
            part.unlink()
        bad = subprocess.run([sys.executable, str(out / "install.py"), "--into", str(tmp_path / "again"),
                              "--python", str(py)], capture_output=True, text=True, env=env)  # fmt: skip
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert model["parts"][1]["file"] in bad.stderr and word in bad.stderr and "Traceback" not in bad.stderr
        assert not (tmp_path / "again" / "models" / "tiny-st").exists()
    shutil.rmtree(out)


def test_a_bad_python_or_platform_is_one_line_before_anything_is_built(tmp_path, capsys):
    """--python 3.x went to pip after the project wheel was built and came back as 15 lines of pip's usage; a platform
    tag of no known shape resolved against nothing. Both are the command's usage error now."""
    from jobs.bundle import cli

    for argv, why in ((["--python", "3.x"], "--python 3.x: not a Python version (e.g. 3.12)"),
                      (["--python", "3.12.1.4"], "--python 3.12.1.4: not a Python version"),
                      (["--platform", "foo"], "--platform foo: not a platform tag (e.g. manylinux_2_28_x86_64, ")):
        with pytest.raises(SystemExit) as exc:
            cli(["--out", str(tmp_path / "out"), *argv])
        said = capsys.readouterr()
        assert exc.value.code == 2 and not said.out and said.err.startswith(f"jobs.bundle: error: {why}"), said
        assert len(said.err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
    from jobs.bundle import parse_args

    for platform in ("manylinux_2_28_x86_64", "manylinux2014_aarch64", "musllinux_1_2_x86_64", "linux_x86_64",
                     "macosx_11_0_arm64", "win_amd64", "win32"):  # fmt: skip
        assert parse_args(["--out", "b", "--python", "3.12", "--platform", platform]).platform == platform


def test_a_pip_failure_is_pips_last_error_in_one_line(tmp_path):
    """pip's usage error (its usage, then the error wrapped to the terminal) and its ERROR: lines: the error alone."""
    from jobs.bundling import BundleError
    from jobs.bundling.wheels import _run

    with pytest.raises(BundleError) as exc:
        _run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--python-version", "3.x",
              "--only-binary", ":all:", "nothing"], "resolving (pip install --dry-run)")  # fmt: skip
    assert str(exc.value) == ("resolving (pip install --dry-run) failed: --python-version error: invalid "
                              "--python-version value: '3.x': each version part must be an integer")
    with pytest.raises(BundleError) as exc:
        _run([sys.executable, "-m", "pip", "download", "--no-index", "--no-deps", "--dest", str(tmp_path),
              "no-such-distribution==1"], "downloading (pip download)")  # fmt: skip
    assert str(exc.value).startswith("downloading (pip download) failed: ERROR: ") and "\n" not in str(exc.value)
