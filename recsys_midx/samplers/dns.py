"""Dynamic negative sampling (DNS, Zhang et al. 2013): the best-scored of a uniform pool.

Each query draws a pool of ``L`` candidates uniformly from ``1..N`` (with replacement) and keeps
the ``M`` with the highest scores ``z.v`` as its negatives (``M = 1``: the single hardest
candidate, the original method). The distribution of the kept items has no closed form in
general: it depends on the rank of every item's score among all ``N``.

**The reported log q is an approximation**: the uniform ``-log N`` of the pool, for drawn ids and
any other id. That is how DNS is used in practice, without a correction: a ``log q`` equal for
every candidate of a query cancels from the sampled softmax, which is then the plain softmax over
the positive and its hard negatives. Goodness-of-fit tests against ``log q`` do not apply to this
sampler.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from recsys_midx.samplers.candidate_pool import CandidatePoolSampler
from recsys_midx.samplers.uniform import uniform_log_prob


class DNSSampler(CandidatePoolSampler):
    """Dynamic negative sampling: the ``M`` best-scored of ``L`` uniform candidates per query.

    The reported ``log q`` is the uniform ``-log N``, an approximation (see the module
    docstring); constructing the sampler warns about it once. Call :meth:`update` with the item
    table before sampling.

    Args:
        num_items: ``N``; ids are ``1..N``.
        num_negatives: ``M`` drawn per query by the objective.
        pool_size: ``L >= M`` uniform candidates per query; larger pools give harder negatives
            at ``O(L * D)`` per query.

    Raises:
        ValueError: if ``pool_size < num_negatives``, or on the conditions of :class:`Sampler`.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     sampler = DNSSampler(num_items=1000, num_negatives=10, pool_size=50)
        >>> sampler.update(torch.randn(1001, 16))
        >>> ids, log_q = sampler.sample(torch.randn(4, 16), 10)
        >>> ids.shape, log_q.dtype
        (torch.Size([4, 10]), torch.float32)
    """

    def __init__(self, num_items: int, num_negatives: int = 100, pool_size: int = 200) -> None:
        super().__init__(num_items, num_negatives, pool_size)
        if pool_size < num_negatives:
            raise ValueError(
                f"pool_size ({pool_size}) must be >= num_negatives ({num_negatives}): "
                "the negatives are the best-scored of the pool"
            )
        warnings.warn(
            "DNSSampler reports the uniform log q of its pool, an approximation: the "
            "probability of its top-scored draws has no closed form",
            stacklevel=2,
        )

    def _check_num_samples(self, num_samples: int) -> None:
        """Raise ``ValueError`` if ``num_samples`` exceeds the pool size ``L``."""
        if num_samples > self.pool_size:
            raise ValueError(
                f"num_samples ({num_samples}) exceeds pool_size ({self.pool_size}): "
                "the negatives are the best-scored of the pool"
            )

    def pick(
        self,
        query: Tensor,
        candidates: Tensor,
        scores: Tensor,
        num_samples: int,
        generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        """Keep the ``num_samples`` best-scored candidates per query.

        Args:
            query: ``[Qc, D]`` float32 queries.
            candidates: ``[Qc, L]`` candidate ids.
            scores: ``[Qc, L]`` their scores.
            num_samples: ``M <= L``.
            generator: unused: the choice is deterministic given the pool.

        Returns:
            ``ids`` ``[Qc, M]`` (best first) and their ``log_q`` ``[Qc, M]`` (``-log N``).
        """
        best = scores.topk(num_samples, dim=1).indices
        ids = candidates.gather(1, best)
        return ids, uniform_log_prob(ids, self.num_items)

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """The approximate ``log q(ids)``: ``-log N``, ``-inf`` for padding id 0 (the query is
        checked as for :meth:`sample`, though its values are not used)."""
        return uniform_log_prob(ids, self.num_items)
