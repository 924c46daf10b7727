"""Diagnostics of trained models: softmax-bottleneck spectra of log-probabilities and Jacobians,
and where a synthetic catalog's topics put a model's negatives and rankings."""

from .bottleneck import jacobian_spectrum, log_prob_matrix, numerical_rank, singular_values
from .runs import BottleneckSpectra, bottleneck_spectra
from .topics import TopicShares, topic_shares

__all__ = [
    "BottleneckSpectra",
    "TopicShares",
    "bottleneck_spectra",
    "jacobian_spectrum",
    "log_prob_matrix",
    "numerical_rank",
    "singular_values",
    "topic_shares",
]
