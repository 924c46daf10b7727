"""Objectives: pure functions of the head's output, the targets, the item table and the batch's
negatives (:class:`~recsys_midx.negatives.Negatives`). The softmax exact (chunked) and sampled
with the logQ correction, for one target or several positives per query; binary cross-entropy
(BCE, gBCE) on drawn negatives; Scalable Cross-Entropy and EDRep, which estimate the catalog's
softmax themselves."""

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
from .sampled_softmax import head_sampled_softmax_loss, sampled_softmax_loss
from .sce import ScalableCrossEntropyLoss, bucketed_cross_entropy_loss
from .softmax import CatalogSoftmax, LossFunctions, SoftmaxLoss
from .window_exclusion import full_softmax_loss_outside_windows
from .window_softmax import window_softmax_loss

__all__ = [
    "BCELoss",
    "CatalogSoftmax",
    "EDRepLoss",
    "GBCELoss",
    "LossFunctions",
    "MultiLabelSoftmaxLoss",
    "ScalableCrossEntropyLoss",
    "SoftmaxLoss",
    "binary_cross_entropy_loss",
    "bucketed_cross_entropy_loss",
    "full_softmax_loss",
    "full_softmax_loss_outside_windows",
    "gbce_beta",
    "head_full_softmax_loss",
    "head_sampled_softmax_loss",
    "multilabel_full_softmax_loss",
    "multilabel_head_full_softmax_loss",
    "multilabel_head_sampled_softmax_loss",
    "multilabel_sampled_softmax_loss",
    "prior_score",
    "sampled_softmax_loss",
    "window_softmax_loss",
]
