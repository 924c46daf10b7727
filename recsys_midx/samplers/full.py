"""The exhaustive "sampler" that stands for the exact full softmax."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Sampler
from .uniform import uniform_log_prob


class FullSampler(Sampler):
    """Stands for the exact full softmax: every item ``1..N`` is a negative of every query.

    The objective recognises it by ``exhaustive = True`` and computes the exact cross-entropy
    instead of sampling. It still honours the protocol: :meth:`sample` enumerates the catalog once
    per query with ``log q = -log N`` (a sampled softmax over exactly these negatives, with the
    accidental hit masked, equals the full cross-entropy), and :meth:`log_prob` is ``-log N``.
    The ids and ``log q`` of :meth:`sample` are broadcast views (``expand``) of one ``[N]`` row,
    ``O(N)`` memory whatever ``Q`` is: call ``.contiguous()`` before writing into them. Its
    ``num_samples`` can only be ``None`` or ``N``.

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

    family = "full"
    colour = "C0"
    exhaustive = True
    query_independent = True

    def __init__(self, num_items: int, num_negatives: int | None = None) -> None:
        super().__init__(num_items, num_items)

    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        # Deterministic: the generator is not used.
        row = torch.arange(1, self.num_items + 1, device=query.device)
        shape = (query.shape[0], self.num_items)
        return row.expand(shape), uniform_log_prob(row, self.num_items).expand(shape)

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        return uniform_log_prob(ids, self.num_items)

    def _check_num_samples(self, num_samples: int) -> None:
        """The set of negatives is the whole catalog: ``num_samples`` must be ``N``."""
        if num_samples != self.num_items:
            raise ValueError(
                f"FullSampler returns all {self.num_items} items: num_samples must be None or "
                f"{self.num_items}, got {num_samples}"
            )
