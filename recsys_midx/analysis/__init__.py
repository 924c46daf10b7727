"""Diagnostics of trained models: softmax-bottleneck spectra of log-probabilities and Jacobians."""

from .bottleneck import jacobian_spectrum, log_prob_matrix, numerical_rank, singular_values
from .runs import BottleneckSpectra, bottleneck_spectra

__all__ = [
    "BottleneckSpectra",
    "bottleneck_spectra",
    "jacobian_spectrum",
    "log_prob_matrix",
    "numerical_rank",
    "singular_values",
]
