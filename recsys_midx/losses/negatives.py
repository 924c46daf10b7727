"""Negatives for the sampled objectives: drawn from a sampler with their normalised ``log q``.

Per query (:func:`draw_negatives`), pooled over a head's component queries
(:func:`draw_mixture_negatives`), or one set shared by the whole batch from the mixture of its
queries' proposals (:func:`draw_shared_negatives`); :func:`exact_positive_log_q` is the ``log q``
that makes a sampled loss count its positives exactly.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..samplers import Sampler


class Negatives(NamedTuple):
    """Negatives drawn for a batch of queries, with the proposal's ``log q``.

    Attributes:
        ids: ``[Q, M]`` negative ids in ``1..N``, or ``[M]`` shared by all queries
            (:func:`draw_shared_negatives`).
        log_q: normalised ``log q`` of ``ids``, shaped like them.
        positive_log_q: ``log q`` of the positives, shaped like the positives given to
            :func:`draw_negatives` (``-inf`` at padding id ``0``), or
            :func:`exact_positive_log_q` when the positives are counted exactly.
    """

    ids: Tensor
    log_q: Tensor
    positive_log_q: Tensor


def exact_positive_log_q(positives: Tensor, num_drawn: int) -> Tensor:
    """The ``log q`` that makes a sampled loss count its positives exactly: ``-log M``.

    With it the positive's corrected logit ``s_p - log q_p`` is ``s_p + log M``; shifting all
    corrected logits by ``-log M`` (the loss does not change) gives ``o_p = s_p`` and
    ``o_j = s_j - log(M q_j)``: the normaliser is ``exp(s_p)`` plus the importance-sampling
    estimate of the sum over the other items, whose draws of the positive (accidental hits) are
    masked because it is already counted.

    Args:
        positives: ``[Q]`` target ids, or ``[Q, P]`` positive ids padded with ``0``.
        num_drawn: negatives drawn per query, ``M``.

    Returns:
        float32 tensor shaped like ``positives``: ``-log M``, ``-inf`` at padding.
    """
    return torch.where(positives > 0, -math.log(num_drawn), -math.inf).float()


@torch.no_grad()
def draw_negatives(
    sampler: Sampler, query: Tensor, positives: Tensor, exact_positives: bool = False
) -> Negatives:
    """Draw the sampler's negatives per query and score the positives under ``q``.

    The sampler sees the scaled query detached and in float32, whatever the model's precision,
    so that its proposal approximates the very softmax being trained. It first observes the
    batch's positives (padding removed), as proposals built from the batch need.

    Args:
        sampler: a non-exhaustive sampler.
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
    # Only padded positives need filtering; a [Q] target vector is passed as is, without the
    # host synchronisation of a boolean mask.
    sampler.observe_targets(positives if positives.dim() == 1 else positives[positives > 0])
    ids, log_q = sampler.sample(proposal_query)
    if exact_positives:
        return Negatives(ids, log_q, exact_positive_log_q(positives, ids.shape[1]))
    as_rows = positives.reshape(positives.shape[0], -1)
    positive_log_q = sampler.log_prob(proposal_query, as_rows).view(positives.shape)
    return Negatives(ids, log_q, positive_log_q)


def _balance_log_q(sampler: Sampler, flat_queries: Tensor, ids: Tensor) -> Tensor:
    """``log((1/K) sum_k q(ids | z_k))`` ``[Q, n]`` for ``flat_queries`` ``[Q*K, D]`` (context
    major) and ``ids`` ``[Q, n]``."""
    num_contexts = ids.shape[0]
    num_components = flat_queries.shape[0] // num_contexts
    per_component = sampler.log_prob(flat_queries, ids.repeat_interleave(num_components, dim=0))
    per_component = per_component.view(num_contexts, num_components, -1)
    return torch.logsumexp(per_component, dim=1) - math.log(num_components)


@torch.no_grad()
def draw_mixture_negatives(
    sampler: Sampler, queries: Tensor, positives: Tensor, exact_positives: bool = False
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
        sampler: a non-exhaustive sampler.
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
    sampler.observe_targets(positives if positives.dim() == 1 else positives[positives > 0])
    share = -(-sampler.num_negatives // num_components)
    ids, _ = sampler.sample(flat, share)
    ids = ids.reshape(num_contexts, num_components * share)
    if exact_positives:
        positive_log_q = exact_positive_log_q(positives, ids.shape[1])
    else:
        as_rows = positives.reshape(num_contexts, -1)
        positive_log_q = _balance_log_q(sampler, flat, as_rows).view(positives.shape)
    return Negatives(ids, _balance_log_q(sampler, flat, ids), positive_log_q)


#: Most (query, id) pairs one call of the sampler scores for the batch mixture's ``log q``: the
#: queries go in blocks so that a block's ``[rows, ids]`` temporaries stay bounded.
_MIXTURE_BLOCK_PAIRS = 1 << 22


def _batch_mixture_log_q(sampler: Sampler, queries: Tensor, ids: Tensor) -> Tensor:
    """``log((1/Q) sum_q q(ids | z_q))`` ``[n]`` for ``queries`` ``[Q, D]`` and ``ids`` ``[n]``.

    For a query-independent sampler the mixture is the proposal: one query scores the ids.
    Otherwise every query scores every id, a block of queries per call of the sampler.
    """
    if sampler.query_independent:
        return sampler.log_prob(queries[:1], ids[None])[0]
    rows_per_call = max(1, _MIXTURE_BLOCK_PAIRS // len(ids))
    block_sums = [
        torch.logsumexp(sampler.log_prob(block, ids.expand(len(block), -1)), dim=0)
        for block in queries.split(rows_per_call)
    ]
    return torch.logsumexp(torch.stack(block_sums), dim=0) - math.log(len(queries))


@torch.no_grad()
def draw_shared_negatives(
    sampler: Sampler,
    queries: Tensor,
    positives: Tensor,
    exact_positives: bool = False,
    *,
    generator: torch.Generator | None = None,
) -> Negatives:
    """``sampler.num_negatives`` negatives shared by every query of the batch, with their ``log q``.

    The ``M`` ids are drawn from the batch mixture ``q_B(i) = (1/Q) sum_q q(i | z_q)`` of the
    proposals of all ``Q`` queries (all ``Q * K`` component queries for ``[Q, K, D]``): each draw
    picks a query uniformly and then one id from that query's proposal. For a query-independent
    sampler (``sampler.query_independent``) the mixture is the proposal itself, so the ``M`` ids
    are one query's draws. The negatives and the positives get the exact
    ``log q_B(i) = logsumexp_q log q(i | z_q) - log Q`` (for a query-dependent sampler it costs
    ``Q`` proposal evaluations per distinct id, the positives' share of which
    ``exact_positives`` saves), the same for every query, so the logQ-corrected sum over the
    shared negatives estimates every query's normaliser without bias wherever ``q_B > 0``. The
    loss then scores the negatives for all queries with one matrix product. As in
    :func:`draw_negatives`, the sampler sees the queries detached in float32 and first observes
    the batch's positives.

    Args:
        sampler: a non-exhaustive sampler.
        queries: ``[Q, D]`` scaled queries, or ``[Q, K, D]`` scaled component queries.
        positives: ``[Q]`` target ids in ``1..N``, or ``[Q, P]`` positive ids padded with ``0``.
        exact_positives: give the positives :func:`exact_positive_log_q` (for ``M`` draws)
            instead of their mixture ``log q``.
        generator: random generator on the device of ``queries`` for every random choice of
            the draw, the queries picked and the sampler's own draws (``None``: the global
            one), as :meth:`~recsys_midx.samplers.Sampler.sample` takes it.

    Returns:
        ``ids`` ``[M]``, their ``log q`` ``[M]`` and the positives' ``log q`` (shaped like
        ``positives``, ``-inf`` at padding).

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> drawn = draw_shared_negatives(UniformSampler(100, 8), torch.randn(4, 16),
        ...                               torch.tensor([4, 7, 9, 9]))
        >>> drawn.ids.shape, round(drawn.positive_log_q[0].exp().item() * 100, 4)
        (torch.Size([8]), 1.0)
    """
    flat = queries.detach().float().reshape(-1, queries.shape[-1])
    sampler.observe_targets(positives if positives.dim() == 1 else positives[positives > 0])
    if sampler.query_independent:
        ids = sampler.sample(flat[:1], generator=generator)[0][0]
    else:
        chosen = torch.randint(
            len(flat), (sampler.num_negatives,), device=flat.device, generator=generator
        )
        ids = sampler.sample(flat[chosen], 1, generator=generator)[0][:, 0]
    num_drawn = len(ids)
    if exact_positives:
        log_q = _batch_mixture_log_q(sampler, flat, ids)
        return Negatives(ids, log_q, exact_positive_log_q(positives, num_drawn))
    # Each distinct id (padding included: log q = -inf) is scored once.
    distinct, where = torch.cat([ids, positives.reshape(-1)]).unique(return_inverse=True)
    log_q = _batch_mixture_log_q(sampler, flat, distinct)[where]
    return Negatives(ids, log_q[:num_drawn], log_q[num_drawn:].view(positives.shape))
