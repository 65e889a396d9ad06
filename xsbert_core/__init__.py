"""xsbert_core: token-pair attributions for Siamese sentence encoders, fast (forward-mode AD)."""

from __future__ import annotations

from .errors import (
    InputError,
    ModelNotFoundError,
    NumericalError,
    TruncationError,
    UnsupportedModelError,
    XsbertError,
)
from .explainer import Explainer, PairAttribution, SentenceFactors
from .settings import EngineSettings
from .models import DEFAULT_MODEL, load_model, resolve_model, weights_fingerprint
from .pairs import completeness_target, compute_completeness_error, pair_matrix, similarity_score
from .quadrature import nodes_and_weights
from .shift import ShiftedTransformer, is_shifted, register_with_sentence_transformers, shifted

__version__ = "0.1.0"

# Plain SentenceTransformer(path) loads saved exact models in any process that imported xsbert_core.
register_with_sentence_transformers()

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
    "load_model",
    "is_shifted",
    "nodes_and_weights",
    "pair_matrix",
    "resolve_model",
    "shifted",
    "similarity_score",
    "weights_fingerprint",
]
