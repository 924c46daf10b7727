"""Output heads: logit transforms and multi-query heads between the query and the softmax."""

from .base import Head, HeadOutput, optimizer_param_groups
from .dot import DotHead
from .moe import MoEHead
from .mos import MoSHead
from .mos_plif import MoSPLIFHead
from .plif import PLIFFunction, PLIFHead
from .sigsoftmax import SigSoftmaxHead

__all__ = [
    "DotHead",
    "Head",
    "HeadOutput",
    "MoEHead",
    "MoSHead",
    "MoSPLIFHead",
    "PLIFFunction",
    "PLIFHead",
    "SigSoftmaxHead",
    "optimizer_param_groups",
]
