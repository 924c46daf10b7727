"""In-batch negatives: the other queries' positives serve as negatives."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Sampler


class InBatchSampler(Sampler):
    """Draws each query's negatives among the positives of the current batch.

    The batch's targets (given by :meth:`observe_targets`) form the proposal: every draw picks
    one of the ``Q`` targets uniformly, so ``q(i) = count_i / Q`` where ``count_i`` is how often
    ``i`` is a target in the batch. This is the item-frequency proposal behind in-batch negatives,
    with ``log q`` exact for the batch rather than estimated from global counts; items that are
    nobody's target in the batch have ``q = 0`` and are never drawn. Until a batch is observed,
    the proposal is the training-set item frequency given to :meth:`update` (the distribution
    in-batch negatives follow on average), or uniform without counts.

    Args:
        num_items: ``N``, the number of real items.
        num_negatives: ``M``, negatives drawn per query.

    Raises:
        ValueError: see :class:`Sampler`.

    Example:
        >>> sampler = InBatchSampler(num_items=100, num_negatives=4)
        >>> sampler.observe_targets(torch.tensor([3, 3, 7, 9]))
        >>> ids, log_q = sampler.sample(torch.randn(4, 8), 4)
        >>> bool(torch.isin(ids, torch.tensor([3, 7, 9])).all())
        True
    """

    query_independent = True

    def __init__(self, num_items: int, num_negatives: int = 100) -> None:
        super().__init__(num_items, num_negatives)
        # The support is rebuilt for every batch on the targets' device, so it is plain state:
        # not in checkpoints, and out of reach of precision casts of the module.
        self._ids = torch.empty(0, dtype=torch.long)
        self._cdf = torch.empty(0, dtype=torch.float64)
        self._log_q = torch.empty(0)

    @torch.no_grad()
    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """Use the item frequencies ``item_counts`` ``[N+1]`` until a batch is observed."""
        if item_counts is None:
            item_counts = torch.ones(self.num_items + 1, device=item_emb.device)
        if item_counts.shape != (self.num_items + 1,):
            raise ValueError(
                f"item_counts must have shape [{self.num_items + 1}], "
                f"got {tuple(item_counts.shape)}"
            )
        counts = item_counts.detach().float().clone()
        counts[0] = 0
        if not counts.sum() > 0:
            raise ValueError("item_counts must have a positive total over ids 1..N")
        self._set_support(torch.arange(self.num_items + 1, device=counts.device), counts)

    @torch.no_grad()
    def observe_targets(self, targets: Tensor) -> None:
        """Make ``targets`` (``[Q]`` ids in ``1..N``) the proposal's support.

        Raises:
            ValueError: if ``targets`` is empty or holds ids outside ``1..N``.
        """
        targets = targets.reshape(-1)
        if targets.numel() == 0 or bool(((targets < 1) | (targets > self.num_items)).any()):
            raise ValueError(f"targets must be a non-empty tensor of ids in 1..{self.num_items}")
        self._set_support(targets.long(), torch.ones_like(targets, dtype=torch.float))

    def _set_support(self, ids: Tensor, weights: Tensor) -> None:
        """Draws pick ``ids[j]`` with probability ``weights[j] / weights.sum()``."""
        self._ids = ids
        self._cdf = weights.double().cumsum(0)
        self._log_q = (
            torch.zeros(self.num_items + 1, device=ids.device)
            .index_add_(0, ids, weights.float())
            .div_(weights.sum())
            .log_()
        )

    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        """Draw ``num_samples`` of the batch's targets per query, uniformly, with replacement."""
        total = self._cdf[-1]
        uniform = torch.rand(
            (query.shape[0], num_samples),
            dtype=torch.float64,
            device=self._cdf.device,
            generator=generator,
        )
        # (1 - u) * total lies in (0, total]: the search never lands on a zero-weight entry.
        picks = torch.searchsorted(self._cdf, (1 - uniform) * total).clamp_(max=len(self._ids) - 1)
        ids = self._ids[picks]
        return ids, self._log_q[ids]

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """``log(count_i / Q)`` of the observed batch; ``-inf`` for ids no query targets."""
        return self._log_q[ids]

    def _check_ready(self) -> None:
        if self._ids.numel() == 0:
            raise RuntimeError(
                "InBatchSampler needs update(item_emb, item_counts) or observe_targets(targets) "
                "before sampling"
            )
