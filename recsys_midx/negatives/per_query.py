"""``negatives=per_query``: ``M`` negatives of each query's own, drawn from the sampler's
proposal at that query, with their normalised ``log q`` (:func:`draw_negatives`); a mixture
head's component queries pool theirs (:func:`draw_mixture_negatives`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from ..protocols import NegativeSampler
from .base import Negatives, Scope, exact_positive_log_q, real_positives
from .corrected import LogQCorrected


@torch.no_grad()
def draw_negatives(
    sampler: NegativeSampler, query: Tensor, positives: Tensor, exact_positives: bool = False
) -> Negatives:
    """Draw the sampler's negatives per query and score the positives under ``q``.

    The sampler sees the scaled query detached and in float32, whatever the model's precision,
    so that its proposal approximates the very softmax being trained. It first observes the
    batch's positives (padding removed), as proposals built from the batch need.

    Args:
        sampler: the proposal, built.
        query: ``[Q, D]`` scaled queries ``z``.
        positives: ``[Q]`` target ids in ``1..N``, or ``[Q, P]`` positive ids padded with ``0``.
        exact_positives: give the positives :func:`exact_positive_log_q` instead of their
            ``log q`` under the proposal (which is then not computed).

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
    sampler.observe_targets(real_positives(positives))
    ids, log_q = sampler.sample(proposal_query)
    if exact_positives:
        return Negatives("query", ids, log_q, exact_positive_log_q(positives, ids.shape[1]))
    as_rows = positives.reshape(positives.shape[0], -1)
    positive_log_q = sampler.log_prob(proposal_query, as_rows).view(positives.shape)
    return Negatives("query", ids, log_q, positive_log_q)


def _balance_log_q(sampler: NegativeSampler, flat_queries: Tensor, ids: Tensor) -> Tensor:
    """``log((1/K) sum_k q(ids | z_k))`` ``[Q, n]`` for ``flat_queries`` ``[Q*K, D]`` (context
    major) and ``ids`` ``[Q, n]``."""
    num_contexts = ids.shape[0]
    num_components = flat_queries.shape[0] // num_contexts
    per_component = sampler.log_prob(flat_queries, ids.repeat_interleave(num_components, dim=0))
    per_component = per_component.view(num_contexts, num_components, -1)
    return torch.logsumexp(per_component, dim=1) - math.log(num_components)


@torch.no_grad()
def draw_mixture_negatives(
    sampler: NegativeSampler, queries: Tensor, positives: Tensor, exact_positives: bool = False
) -> Negatives:
    """Negatives shared by the ``K`` component queries of each context, with their ``log q``.

    Each component query ``z_k`` draws ``ceil(M / K)`` ids from ``q(. | z_k)`` (one call of the
    sampler on the ``[Q*K, D]`` queries), so every component contributes negatives near its own
    mode; the ``K * ceil(M / K)`` ids of a context are pooled. A pool drawn in fixed shares from
    several proposals is, for importance weighting, a draw from their equal-weight mixture (the
    balance heuristic of multiple importance sampling, Veach & Guibas 1995): with
    ``log q(i) = log((1/K) sum_k q(i | z_k))`` the logQ-corrected sum over the pool estimates
    every component's normaliser without bias. That ``log q`` is what the negatives and the
    positives get, the same for all components. The prior is not used: fixed shares keep the
    draw cheap and deterministic in size, and a component with a small prior weight still gets
    a fair estimate of its own normaliser.

    Args:
        sampler: the proposal, built.
        queries: ``[Q, K, D]`` scaled component queries.
        positives: ``[Q]`` target ids in ``1..N``, or ``[Q, P]`` positive ids padded with ``0``.
        exact_positives: give the positives :func:`exact_positive_log_q` (for the pool size)
            instead of their mixture ``log q``.

    Returns:
        ``ids`` ``[Q, K * ceil(M / K)]``, their ``log q`` and the positives' ``log q``
        (``-inf`` at padding).

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> drawn = draw_mixture_negatives(UniformSampler(100, 8), torch.randn(2, 3, 16),
        ...                                torch.tensor([4, 7]))
        >>> drawn.ids.shape, round(drawn.log_q[0, 0].exp().item() * 100, 4)
        (torch.Size([2, 9]), 1.0)
    """
    num_contexts, num_components, dim = queries.shape
    flat = queries.detach().float().reshape(num_contexts * num_components, dim)
    sampler.observe_targets(real_positives(positives))
    share = -(-sampler.num_negatives // num_components)
    ids, _ = sampler.sample(flat, share)
    ids = ids.reshape(num_contexts, num_components * share)
    if exact_positives:
        positive_log_q = exact_positive_log_q(positives, ids.shape[1])
    else:
        as_rows = positives.reshape(num_contexts, -1)
        positive_log_q = _balance_log_q(sampler, flat, as_rows).view(positives.shape)
    return Negatives("query", ids, _balance_log_q(sampler, flat, ids), positive_log_q)


class PerQuery(LogQCorrected):
    """``M = sampler.num_negatives`` negatives of each query's own, from the proposal at that
    query (:func:`draw_negatives`), or pooled over a mixture head's ``K`` component queries
    (:func:`draw_mixture_negatives`). The default strategy.

    Its settings, ``correct_positive`` and ``exclude_window``, are those of
    :class:`~recsys_midx.negatives.corrected.LogQCorrected`.

    Example:
        >>> from recsys_midx.negatives import QueryBatch
        >>> from recsys_midx.samplers import UniformSampler
        >>> batch = QueryBatch(torch.randn(4, 8), torch.tensor([1, 2, 3, 4]))
        >>> PerQuery()(batch, UniformSampler(100, 10)).ids.shape
        torch.Size([4, 10])
    """

    name: ClassVar[str] = "per_query"
    scope: ClassVar[Scope] = "query"

    def draw(
        self, sampler: NegativeSampler, queries: Tensor, positives: Tensor, exact_positives: bool
    ) -> Negatives:
        draw = draw_negatives if queries.dim() == 2 else draw_mixture_negatives
        return draw(sampler, queries, positives, exact_positives)
