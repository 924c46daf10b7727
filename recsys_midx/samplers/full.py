"""The exhaustive "sampler" that stands for the exact full softmax."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Sampler, check_ids, check_query
from .uniform import uniform_log_prob


class FullSampler(Sampler):
    """Stands for the exact full softmax: every item ``1..N`` is a negative of every query.

    The objective recognises it by ``exhaustive = True`` and computes the exact cross-entropy
    instead of sampling. It still honours the protocol: :meth:`sample` enumerates the catalog once
    per query with ``log q = -log N`` (a sampled softmax over exactly these negatives, with the
    accidental hit masked, equals the full cross-entropy), and :meth:`log_prob` is ``-log N``.

    Args:
        num_items: ``N``, the number of real items.
        num_negatives: ignored, so that one command line can set ``sampler.num_negatives`` for
            every sampler of a sweep; :attr:`num_negatives` is always ``N``.

    Raises:
        ValueError: if ``num_items < 1``.

    Example:
        >>> sampler = FullSampler(num_items=3)
        >>> ids, log_q = sampler.sample(torch.randn(2, 4))
        >>> ids
        tensor([[1, 2, 3],
                [1, 2, 3]])
    """

    exhaustive = True
    query_independent = True

    def __init__(self, num_items: int, num_negatives: int | None = None) -> None:
        super().__init__(num_items, num_items)

    @torch.no_grad()
    def sample(
        self,
        query: Tensor,
        num_samples: int | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Return every id ``1..N`` once per query.

        The results are broadcast views (``expand``) of one ``[N]`` row, so they cost ``O(N)``
        memory whatever ``Q`` is; call ``.contiguous()`` before writing into them.

        Args:
            query: ``[Q, D]`` scaled queries; only their number and device are used.
            num_samples: ``None`` or ``N``; anything else is an error, since the set of negatives
                is the whole catalog.
            generator: accepted for protocol uniformity; the result is deterministic.

        Returns:
            ``ids`` ``[Q, N]`` (int64, each row ``1..N``) and ``log_q`` ``[Q, N]`` (float32,
            ``-log N``).

        Raises:
            ValueError: if ``query`` is not ``[Q, D]`` or ``num_samples`` is neither ``None`` nor
                ``N``.
        """
        del generator  # nothing random to draw
        check_query(query)
        if num_samples is not None and num_samples != self.num_items:
            raise ValueError(
                f"FullSampler returns all {self.num_items} items: num_samples must be None or "
                f"{self.num_items}, got {num_samples}"
            )
        row = torch.arange(1, self.num_items + 1, device=query.device)
        shape = (query.shape[0], self.num_items)
        return row.expand(shape), uniform_log_prob(row, self.num_items).expand(shape)

    @torch.no_grad()
    def log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """``-log N`` for ids in ``1..N``, ``-inf`` for padding id ``0``.

        Args:
            query: ``[Q, D]`` scaled queries.
            ids: ``[Q, ...]`` integer ids in ``0..N``.

        Returns:
            float32 tensor shaped like ``ids``.

        Raises:
            ValueError: on malformed ``query`` or ``ids``.
        """
        check_query(query)
        check_ids(query, ids, self.num_items)
        return uniform_log_prob(ids, self.num_items)
