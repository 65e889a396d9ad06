"""The `orig` variant's training loss (xsbert_core.training): the dot-product twin of sentence-transformers'
CosineSimilarityLoss. A module of its own, so that reading a study's training settings (training.py) needs no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class DotProductMSELoss(nn.Module):
    """MSE between the dot product of the two embeddings and the label: ||label - e(a) . e(b)||^2.

    The dot-product twin of sentence-transformers' CosineSimilarityLoss (the `orig` variant).
    """

    def __init__(self, model: SentenceTransformer) -> None:
        super().__init__()
        self.model = model
        self.loss_fct = nn.MSELoss()

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor) -> Tensor:
        u, v = (self.model(features)["sentence_embedding"] for features in sentence_features)
        return self.loss_fct((u * v).sum(-1), labels.float().view(-1))

    def get_config_dict(self) -> dict[str, Any]:
        return {"loss_fct": "torch.nn.MSELoss", "similarity": "dot"}
