"""``negatives=shared``: ``M`` negatives shared by every query of the batch, drawn from the
mixture of its queries' proposals and scored for all of them with one matrix product
(:func:`draw_shared_negatives`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from ..protocols import NegativeSampler
from .base import Negatives, Scope, exact_positive_log_q, real_positives
from .corrected import LogQCorrected

#: Most (query, id) pairs one call of the sampler scores for the batch mixture's ``log q``: the
#: queries go in blocks so that a block's ``[rows, ids]`` temporaries stay bounded.
_MIXTURE_BLOCK_PAIRS = 1 << 22


def _batch_mixture_log_q(sampler: NegativeSampler, queries: Tensor, ids: Tensor) -> Tensor:
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
    sampler: NegativeSampler,
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
        sampler: the proposal, built.
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
    sampler.observe_targets(real_positives(positives))
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
        return Negatives("batch", ids, log_q, exact_positive_log_q(positives, num_drawn))
    # Each distinct id (padding included: log q = -inf) is scored once.
    distinct, where = torch.cat([ids, positives.reshape(-1)]).unique(return_inverse=True)
    log_q = _batch_mixture_log_q(sampler, flat, distinct)[where]
    return Negatives("batch", ids, log_q[:num_drawn], log_q[num_drawn:].view(positives.shape))


class SharedByBatch(LogQCorrected):
    """``M = sampler.num_negatives`` negatives shared by every query of the batch, from the
    batch mixture of the queries' proposals (:func:`draw_shared_negatives`), each corrected by
    its ``log q`` under that mixture.

    Its settings are those of :class:`~recsys_midx.negatives.corrected.LogQCorrected`: with
    ``exclude_window`` each query still leaves the shared ids in its own window out.

    Example:
        >>> from recsys_midx.negatives import QueryBatch
        >>> from recsys_midx.samplers import UniformSampler
        >>> queries = torch.randn(4, 8)
        >>> drawn = SharedByBatch()(QueryBatch(queries, torch.tensor([1, 2, 3, 4])),
        ...                         UniformSampler(100, 10))
        >>> drawn.scope, drawn.ids.shape
        ('batch', torch.Size([10]))
    """

    name: ClassVar[str] = "shared"
    scope: ClassVar[Scope] = "batch"

    def draw(
        self, sampler: NegativeSampler, queries: Tensor, positives: Tensor, exact_positives: bool
    ) -> Negatives:
        return draw_shared_negatives(sampler, queries, positives, exact_positives)
