"""Objectives: softmax exact (chunked) and sampled with the logQ correction, for one target or
several positives per query; binary cross-entropy (BCE, gBCE) on sampled negatives; Scalable
Cross-Entropy."""

from .bce import BCELoss, binary_cross_entropy_loss, prior_score
from .edrep import EDRepLoss
from .full_softmax import full_softmax_loss, head_full_softmax_loss
from .gbce import GBCELoss, gbce_beta
from .multilabel import (
    MultiLabelSoftmaxLoss,
    multilabel_full_softmax_loss,
    multilabel_head_full_softmax_loss,
    multilabel_head_sampled_softmax_loss,
    multilabel_sampled_softmax_loss,
)
from .negatives import Negatives, draw_mixture_negatives, draw_negatives, draw_shared_negatives
from .sampled_softmax import head_sampled_softmax_loss, sampled_softmax_loss
from .sce import ScalableCrossEntropyLoss, bucketed_cross_entropy_loss
from .softmax import CatalogSoftmax, LossFunctions, SoftmaxLoss
from .window_exclusion import (
    SequenceWindows,
    full_softmax_loss_outside_windows,
    sequence_hits,
    window_hits,
)
from .window_softmax import (
    WindowSoftmaxLoss,
    draw_from_proposal,
    draw_outside_windows,
    merge_repeated_draws,
    window_softmax_loss,
)

__all__ = [
    "BCELoss",
    "CatalogSoftmax",
    "EDRepLoss",
    "GBCELoss",
    "LossFunctions",
    "MultiLabelSoftmaxLoss",
    "Negatives",
    "ScalableCrossEntropyLoss",
    "SequenceWindows",
    "WindowSoftmaxLoss",
    "SoftmaxLoss",
    "binary_cross_entropy_loss",
    "bucketed_cross_entropy_loss",
    "draw_from_proposal",
    "draw_mixture_negatives",
    "draw_negatives",
    "draw_outside_windows",
    "draw_shared_negatives",
    "full_softmax_loss",
    "full_softmax_loss_outside_windows",
    "gbce_beta",
    "head_full_softmax_loss",
    "head_sampled_softmax_loss",
    "merge_repeated_draws",
    "multilabel_full_softmax_loss",
    "multilabel_head_full_softmax_loss",
    "multilabel_head_sampled_softmax_loss",
    "multilabel_sampled_softmax_loss",
    "prior_score",
    "sampled_softmax_loss",
    "sequence_hits",
    "window_hits",
    "window_softmax_loss",
]
