"""Softmax objectives: exact (chunked) and sampled with the logQ correction."""

from .full_softmax import full_softmax_loss
from .sampled_softmax import sampled_softmax_loss
from .softmax import SoftmaxLoss

__all__ = ["SoftmaxLoss", "full_softmax_loss", "sampled_softmax_loss"]
