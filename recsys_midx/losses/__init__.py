"""Softmax objectives: exact (chunked) and sampled with the logQ correction, for one target or
several positives per query."""

from .full_softmax import full_softmax_loss
from .multilabel import (
    MultiLabelSoftmaxLoss,
    multilabel_full_softmax_loss,
    multilabel_sampled_softmax_loss,
)
from .sampled_softmax import sampled_softmax_loss
from .softmax import CatalogSoftmax, Negatives, SoftmaxLoss, draw_negatives

__all__ = [
    "CatalogSoftmax",
    "MultiLabelSoftmaxLoss",
    "Negatives",
    "SoftmaxLoss",
    "draw_negatives",
    "full_softmax_loss",
    "multilabel_full_softmax_loss",
    "multilabel_sampled_softmax_loss",
    "sampled_softmax_loss",
]
