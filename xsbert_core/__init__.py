"""xsbert_core: token-pair attributions for Siamese sentence encoders, fast (forward-mode AD).

The errors are imported with the package; everything else on first use (PEP 562), so that what needs only the
errors (the read side: `xsbert sql`, `xsbert serve`, a Ray task that writes cells) does not import torch and
sentence-transformers, a few seconds per process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    InputError,
    ModelNotFoundError,
    NumericalError,
    TruncationError,
    UnsupportedModelError,
    XsbertError,
)

__version__ = "0.1.0"

# Each public name other than the errors, and the module that defines it. The block for type checkers below and
# __all__ name them again, as literals (what linters and type checkers read); tests/test_layering.py checks that the
# three agree.
_LAZY = {
    "Explainer": "explainer",
    "PairAttribution": "results",
    "SentenceFactors": "results",
    "EngineSettings": "settings",
    "DEFAULT_MODEL": "settings",
    "load_model": "models",
    "resolve_model": "models",
    "weights_fingerprint": "models",
    "completeness_target": "pairs",
    "compute_completeness_error": "pairs",
    "pair_matrix": "pairs",
    "similarity_score": "pairs",
    "nodes_and_weights": "quadrature",
    "ShiftedTransformer": "shift",
    "is_shifted": "shift",
    "register_with_sentence_transformers": "shift",
    "shifted": "shift",
}

if TYPE_CHECKING:  # what type checkers and editors see
    from .explainer import Explainer
    from .models import load_model, resolve_model, weights_fingerprint
    from .pairs import completeness_target, compute_completeness_error, pair_matrix, similarity_score
    from .quadrature import nodes_and_weights
    from .results import PairAttribution, SentenceFactors
    from .settings import DEFAULT_MODEL, EngineSettings
    from .shift import ShiftedTransformer, is_shifted, register_with_sentence_transformers, shifted


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'xsbert_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _register_shift(_module: Any = None) -> None:
    importlib.import_module(".shift", __name__).register_with_sentence_transformers()


# Plain SentenceTransformer(path) loads saved exact models in any process that imported xsbert_core: the shift's
# class is registered with sentence-transformers once that is imported (now, if it is already), by wrapt's
# post-import hook; without wrapt (an environment that has only the packages the engine itself uses), now.
try:
    from wrapt import register_post_import_hook
except ImportError:  # pragma: no cover - wrapt is a dependency; a bare checkout on a GPU image may lack it
    _register_shift()
else:
    register_post_import_hook(_register_shift, "sentence_transformers")

__all__ = [
    "DEFAULT_MODEL",
    "EngineSettings",
    "Explainer",
    "InputError",
    "ModelNotFoundError",
    "NumericalError",
    "PairAttribution",
    "SentenceFactors",
    "ShiftedTransformer",
    "TruncationError",
    "UnsupportedModelError",
    "XsbertError",
    "completeness_target",
    "compute_completeness_error",
    "is_shifted",
    "load_model",
    "nodes_and_weights",
    "pair_matrix",
    "register_with_sentence_transformers",
    "resolve_model",
    "shifted",
    "similarity_score",
    "weights_fingerprint",
]
