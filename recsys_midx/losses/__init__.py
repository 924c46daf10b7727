"""Softmax objectives: exact (chunked) and sampled with the logQ correction, for one target or
several positives per query."""

from .edrep import EDRepLoss
from .full_softmax import full_softmax_loss, head_full_softmax_loss
from .multilabel import (
    MultiLabelSoftmaxLoss,
    multilabel_full_softmax_loss,
    multilabel_head_full_softmax_loss,
    multilabel_head_sampled_softmax_loss,
    multilabel_sampled_softmax_loss,
)
from .sampled_softmax import head_sampled_softmax_loss, sampled_softmax_loss
from .softmax import (
    CatalogSoftmax,
    LossFunctions,
    Negatives,
    SoftmaxLoss,
    draw_mixture_negatives,
    draw_negatives,
    draw_shared_negatives,
)

__all__ = [
    "CatalogSoftmax",
    "EDRepLoss",
    "LossFunctions",
    "MultiLabelSoftmaxLoss",
    "Negatives",
    "SoftmaxLoss",
    "draw_mixture_negatives",
    "draw_negatives",
    "draw_shared_negatives",
    "full_softmax_loss",
    "head_full_softmax_loss",
    "head_sampled_softmax_loss",
    "multilabel_full_softmax_loss",
    "multilabel_head_full_softmax_loss",
    "multilabel_head_sampled_softmax_loss",
    "multilabel_sampled_softmax_loss",
    "sampled_softmax_loss",
]
