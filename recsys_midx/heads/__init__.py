"""Output heads: logit transforms and multi-query heads between the query and the softmax."""

from .base import Head, HeadOutput, optimizer_param_groups
from .dot import DotHead
from .moe import MoEHead
from .mos import MoSHead
from .plif import PLIFFunction, PLIFHead
from .sigsoftmax import SigSoftmaxHead

# Last: it imports the losses, which import the head classes above.
from .scoring import log_probs, ranking_queries  # noqa: E402

__all__ = [
    "DotHead",
    "Head",
    "HeadOutput",
    "MoEHead",
    "MoSHead",
    "PLIFFunction",
    "PLIFHead",
    "SigSoftmaxHead",
    "log_probs",
    "optimizer_param_groups",
    "ranking_queries",
]
