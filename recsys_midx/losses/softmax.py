"""The softmax objective: exact or sampled, chosen by the sampler it is given."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..samplers.base import Sampler
from .full_softmax import full_softmax_loss
from .sampled_softmax import sampled_softmax_loss


class SoftmaxLoss(torch.nn.Module):
    """Softmax cross-entropy over the catalog with scores ``s(z, v) = z . v`` for
    ``z = query / temperature``.

    With an exhaustive sampler (:class:`~recsys_midx.samplers.FullSampler`) it computes the exact
    cross-entropy over items ``1..N``; with any other sampler it draws ``sampler.num_negatives``
    negatives per query and computes the logQ-corrected sampled softmax. The sampler gets the same
    scaled query ``z`` that defines the scores, so a query-dependent proposal approximates the very
    softmax being trained. Only the :class:`~recsys_midx.samplers.Sampler` protocol is used.

    Args:
        temperature: divides the query once; scores become ``query . v / temperature``.
        chunk_size: items scored at once by the exact loss (memory about ``Q * chunk_size``
            floats).

    Raises:
        ValueError: if ``temperature`` is not finite and positive or ``chunk_size < 1``.

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> loss_fn = SoftmaxLoss(temperature=0.5)
        >>> query = torch.randn(4, 8, requires_grad=True)
        >>> item_emb = torch.randn(101, 8, requires_grad=True)
        >>> loss = loss_fn(query, torch.tensor([1, 5, 9, 100]), item_emb, UniformSampler(100, 10))
        >>> loss.backward()
    """

    def __init__(self, temperature: float = 1.0, chunk_size: int = 32768) -> None:
        super().__init__()
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {temperature}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.temperature = float(temperature)
        self.chunk_size = int(chunk_size)

    def forward(self, query: Tensor, targets: Tensor, item_emb: Tensor, sampler: Sampler) -> Tensor:
        """Mean loss over the queries.

        Args:
            query: ``[Q, D]`` query vectors (before the temperature).
            targets: ``[Q]`` target ids in ``1..N``.
            item_emb: ``[N+1, D]`` item table, row 0 padding.
            sampler: the proposal; exhaustive samplers select the exact loss.

        Returns:
            Scalar mean loss.

        Raises:
            ValueError: on malformed inputs (see :func:`full_softmax_loss` and
                :func:`sampled_softmax_loss`).
        """
        z = query / self.temperature
        if sampler.exhaustive:
            return full_softmax_loss(z, item_emb, targets, self.chunk_size).mean()
        with torch.no_grad():
            proposal_query = z.detach().float()
            sampler.observe_targets(targets)
            neg_ids, neg_log_q = sampler.sample(proposal_query, sampler.num_negatives)
            pos_log_q = sampler.log_prob(proposal_query, targets[:, None])[:, 0]
        return sampled_softmax_loss(z, item_emb, targets, neg_ids, neg_log_q, pos_log_q).mean()

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, chunk_size={self.chunk_size}"
