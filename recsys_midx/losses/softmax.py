"""The softmax objectives: exact or sampled, chosen by the sampler they are given.

:class:`CatalogSoftmax` holds what every such objective shares: the temperature that scales the
query, the choice between the exact loss (exhaustive samplers) and the sampled one, and the draw
of negatives with their ``log q`` (:func:`draw_negatives`). :class:`SoftmaxLoss` (one target per
query) and :class:`~recsys_midx.losses.multilabel.MultiLabelSoftmaxLoss` (several positives per
query) only say how the exact and the sampled losses are computed.
"""

from __future__ import annotations

import abc
import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..samplers.base import Sampler
from .full_softmax import full_softmax_loss
from .sampled_softmax import sampled_softmax_loss


class Negatives(NamedTuple):
    """Negatives drawn for a batch of queries, with the proposal's ``log q``.

    Attributes:
        ids: ``[Q, M]`` negative ids in ``1..N``.
        log_q: ``[Q, M]`` normalised ``log q`` of ``ids``.
        positive_log_q: ``log q`` of the positives, shaped like the positives given to
            :func:`draw_negatives` (``-inf`` at padding id ``0``).
    """

    ids: Tensor
    log_q: Tensor
    positive_log_q: Tensor


@torch.no_grad()
def draw_negatives(sampler: Sampler, query: Tensor, positives: Tensor) -> Negatives:
    """Draw ``sampler.num_negatives`` negatives per query and score the positives under ``q``.

    The sampler sees the scaled query detached and in float32, whatever the model's precision,
    so that its proposal approximates the very softmax being trained. It first observes the
    batch's positives (padding removed), as proposals built from the batch need.

    Args:
        sampler: a non-exhaustive sampler.
        query: ``[Q, D]`` scaled queries ``z``.
        positives: ``[Q]`` target ids in ``1..N``, or ``[Q, P]`` positive ids padded with ``0``.

    Returns:
        The negatives, their ``log q`` and the positives' ``log q``.

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> positives = torch.tensor([[1, 2], [3, 0]])
        >>> drawn = draw_negatives(UniformSampler(100, 8), torch.randn(2, 16), positives)
        >>> drawn.ids.shape, drawn.positive_log_q[1, 1]
        (torch.Size([2, 8]), tensor(-inf))
    """
    proposal_query = query.detach().float()
    # Only padded positives need filtering; a [Q] target vector is passed as is, without the
    # host synchronisation of a boolean mask.
    sampler.observe_targets(positives if positives.dim() == 1 else positives[positives > 0])
    ids, log_q = sampler.sample(proposal_query, sampler.num_negatives)
    as_rows = positives.reshape(positives.shape[0], -1)
    positive_log_q = sampler.log_prob(proposal_query, as_rows).view(positives.shape)
    return Negatives(ids, log_q, positive_log_q)


class CatalogSoftmax(torch.nn.Module, abc.ABC):
    """Base of the softmax objectives over the catalog, scores ``s(z, v) = z . v`` for
    ``z = query / temperature``.

    :meth:`forward` divides the query by the temperature once, then computes the exact loss
    (:meth:`exact_loss`) when the sampler is exhaustive, and otherwise draws negatives for the
    scaled query (:func:`draw_negatives`) and computes the sampled loss (:meth:`sampled_loss`).
    Only the :class:`~recsys_midx.samplers.Sampler` protocol is used.

    Args:
        temperature: divides the query once; scores become ``query . v / temperature``.
        chunk_size: items scored at once by the exact loss (memory about ``Q * chunk_size``
            floats).

    Raises:
        ValueError: if ``temperature`` is not finite and positive or ``chunk_size < 1``.
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
        """Scalar loss of a batch.

        Args:
            query: ``[Q, D]`` query vectors (before the temperature).
            targets: the positive ids of each query, as the subclass expects them (``[Q]``
                target ids, or ``[Q, P]`` positives padded with ``0``).
            item_emb: ``[N+1, D]`` item table, row 0 padding.
            sampler: the proposal; exhaustive samplers select the exact loss.

        Returns:
            Scalar loss.
        """
        z = query / self.temperature
        if sampler.exhaustive:
            return self.exact_loss(z, targets, item_emb)
        return self.sampled_loss(z, targets, item_emb, draw_negatives(sampler, z, targets))

    @abc.abstractmethod
    def exact_loss(self, query: Tensor, targets: Tensor, item_emb: Tensor) -> Tensor:
        """Scalar loss of the exact softmax over items ``1..N`` for scaled queries."""

    @abc.abstractmethod
    def sampled_loss(
        self, query: Tensor, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Scalar logQ-corrected sampled-softmax loss for scaled queries and drawn negatives."""

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, chunk_size={self.chunk_size}"


class SoftmaxLoss(CatalogSoftmax):
    """Softmax cross-entropy over the catalog, one target per query, with scores
    ``s(z, v) = z . v`` for ``z = query / temperature``.

    With an exhaustive sampler (:class:`~recsys_midx.samplers.FullSampler`) it computes the exact
    cross-entropy over items ``1..N``; with any other sampler it draws ``sampler.num_negatives``
    negatives per query and computes the logQ-corrected sampled softmax. The sampler gets the same
    scaled query ``z`` that defines the scores, so a query-dependent proposal approximates the very
    softmax being trained.

    Args:
        temperature: divides the query once; scores become ``query . v / temperature``.
        chunk_size: items scored at once by the exact loss (memory about ``Q * chunk_size``
            floats).

    Raises:
        ValueError: if ``temperature`` is not finite and positive or ``chunk_size < 1``; on
            malformed inputs when called (see :func:`full_softmax_loss` and
            :func:`sampled_softmax_loss`).

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> loss_fn = SoftmaxLoss(temperature=0.5)
        >>> query = torch.randn(4, 8, requires_grad=True)
        >>> item_emb = torch.randn(101, 8, requires_grad=True)
        >>> loss = loss_fn(query, torch.tensor([1, 5, 9, 100]), item_emb, UniformSampler(100, 10))
        >>> loss.backward()
    """

    def exact_loss(self, query: Tensor, targets: Tensor, item_emb: Tensor) -> Tensor:
        """Mean exact cross-entropy; ``targets`` are ``[Q]`` ids in ``1..N``."""
        return full_softmax_loss(query, item_emb, targets, self.chunk_size).mean()

    def sampled_loss(
        self, query: Tensor, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Mean sampled-softmax cross-entropy; ``targets`` are ``[Q]`` target ids."""
        return sampled_softmax_loss(
            query, item_emb, targets, negatives.ids, negatives.log_q, negatives.positive_log_q
        ).mean()
