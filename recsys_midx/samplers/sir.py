"""Sampling-importance-resampling (SIR) sampler: resample a uniform pool towards the softmax.

Each query draws a pool of ``L`` candidates uniformly from ``1..N`` and resamples ``M`` of them,
with replacement, with weights ``exp(z.v_j) / q0(j)`` (``q0 = 1/N``, so ``∝ exp(z.v_j)``). As
``L`` grows the resampled items follow ``softmax(z.v)``; for finite ``L`` their marginal
distribution has no closed form (it is an expectation over pools).

**The reported log q is an approximation.** The sampler reports the target it approximates, the
softmax, with a sampled normaliser:

    log q(i | z) ≈ z.v_i - log Ẑ(z),    Ẑ(z) = N / L * sum_{j in R} exp(z.v_j),

where ``R`` is a reference set of ``L`` ids drawn uniformly (from ``seed``) at each
:meth:`~SIRSampler.update`, so that ``Ẑ`` is an unbiased estimate of the softmax normaliser and
a deterministic function of the query: :meth:`~SIRSampler.sample` and
:meth:`~SIRSampler.log_prob` give a positive and its negatives the same normaliser. The loss is
invariant to a per-query shift of ``log q``; the normaliser only matters where queries are
compared (the mixture heads' pooled ``log q``, the refresh diagnostics). The values are neither
the draw probabilities nor exactly normalised, so goodness-of-fit tests against ``log q`` do not
apply to this sampler.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from recsys_midx.samplers.candidate_pool import CandidatePoolSampler
from recsys_midx.samplers.draws import inverse_cdf


class SIRSampler(CandidatePoolSampler):
    """Sampling-importance-resampling: ``M`` draws from a uniform pool of ``L``, ``∝ exp(z.v)``.

    The reported ``log q`` is an approximation (the softmax with a sampled normaliser, see the
    module docstring); constructing the sampler warns about it once. Call :meth:`update` with
    the item table before sampling.

    Args:
        num_items: ``N``; ids are ``1..N``.
        num_negatives: ``M`` drawn per query by the objective.
        pool_size: ``L``, uniform candidates per query, and the size of the reference set of the
            normaliser; larger pools follow the softmax more closely at ``O(L * D)`` per query.
        seed: seed of the normaliser's reference set (the draws use the ``generator`` of
            :meth:`sample`).

    Raises:
        ValueError: if ``pool_size < 1``, or on the conditions of :class:`Sampler`.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     sampler = SIRSampler(num_items=1000, num_negatives=10, pool_size=50)
        >>> sampler.update(torch.randn(1001, 16))
        >>> ids, log_q = sampler.sample(torch.randn(4, 16), 10)
        >>> ids.shape, log_q.dtype
        (torch.Size([4, 10]), torch.float32)
    """

    def __init__(
        self, num_items: int, num_negatives: int = 100, pool_size: int = 200, seed: int = 0
    ) -> None:
        super().__init__(num_items, num_negatives, pool_size)
        self.seed = int(seed)
        #: ``[L]`` ids of the normaliser's reference set.
        self.register_buffer("reference_ids", torch.empty(0, dtype=torch.long))
        warnings.warn(
            "SIRSampler reports an approximate log q (the softmax with a sampled normaliser), "
            "not the probability of its draws, which has no closed form",
            stacklevel=2,
        )

    @torch.no_grad()
    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """Snapshot the item table and draw the normaliser's reference set from ``seed``.

        Args:
            item_emb: ``[N+1, D]`` item table (row 0, padding, is not kept).
            item_counts: ignored.

        Raises:
            ValueError: if the table is not ``[N+1, D]`` or has NaN or infinite entries.
        """
        super().update(item_emb, item_counts)
        generator = torch.Generator().manual_seed(self.seed)
        reference = torch.randint(1, self.num_items + 1, (self.pool_size,), generator=generator)
        self.reference_ids = reference.to(self.items.device)

    def pick(
        self,
        query: Tensor,
        candidates: Tensor,
        scores: Tensor,
        num_samples: int,
        generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        """Resample ``num_samples`` candidates per query with weights ``∝ exp(score)``.

        Args:
            query: ``[Qc, D]`` float32 queries.
            candidates: ``[Qc, L]`` candidate ids.
            scores: ``[Qc, L]`` their scores.
            num_samples: ``M``.
            generator: random generator, or ``None`` for the global one.

        Returns:
            ``ids`` ``[Qc, M]`` and their approximate ``log_q`` ``[Qc, M]``.
        """
        weights = (scores - scores.amax(1, keepdim=True)).exp_()
        chosen, _ = inverse_cdf(weights, num_samples, generator)
        chosen.clamp_(max=candidates.shape[1] - 1)
        log_q = scores.gather(1, chosen) - self._log_normaliser(query)
        return candidates.gather(1, chosen), log_q

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """Approximate ``log q(ids | query)``: ``z.v_i - log Ẑ(z)``; ``-inf`` for padding id 0."""
        flat = ids.reshape(ids.shape[0], -1).long()
        out = torch.empty(flat.shape, device=query.device)
        for rows, z in self.chunks(query, flat.shape[1]):
            scores = self.scores(z, flat[rows].clamp_min(1))
            out[rows] = scores - self._log_normaliser(z)
        return out.masked_fill_(flat == 0, -math.inf).view(ids.shape)

    def _catalog_log_prob(self, query: Tensor) -> Tensor:
        """Approximate ``log q`` of every item: one matrix product instead of
        :meth:`_log_prob`'s per-query gather."""
        return query @ self.items.T - self._log_normaliser(query)

    def _log_normaliser(self, query: Tensor) -> Tensor:
        """``[Qc, 1]`` ``log Ẑ = log(N / L) + logsumexp`` of the reference set's scores."""
        scores = query @ self.items[self.reference_ids - 1].T
        return scores.logsumexp(1, keepdim=True) + math.log(self.num_items / self.pool_size)
