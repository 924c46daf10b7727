"""Perplexity: the exponential of the mean negative log-likelihood of every target token."""

from __future__ import annotations

import torch
import torchmetrics
from torch import Tensor

#: The names :class:`Perplexity` reports (logged as ``val/NAME`` and ``test/NAME``).
PERPLEXITY_METRICS = ("nll", "ppl")


class Perplexity(torchmetrics.Metric):
    """Accumulates the negative log-likelihoods of a split's target tokens.

    The sums are kept in float64 (a corpus holds millions of tokens) and summed across
    processes. :meth:`compute` gives ``nll`` (the mean, in nats) and ``ppl`` (its exponential).

    Example:
        >>> metric = Perplexity()
        >>> metric.update(torch.tensor([1.0, 3.0]))
        >>> {name: round(float(value), 3) for name, value in metric.compute().items()}
        {'nll': 2.0, 'ppl': 7.389}
    """

    full_state_update = False
    higher_is_better = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("nll_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll: Tensor) -> None:
        """Add the negative log-likelihoods ``[Q]`` of ``Q`` target tokens."""
        self.nll_sum += nll.detach().double().sum()
        self.tokens += nll.numel()

    def compute(self) -> dict[str, Tensor]:
        mean = self.nll_sum / self.tokens.clamp(min=1)
        return {"nll": mean.float(), "ppl": mean.exp().float()}
