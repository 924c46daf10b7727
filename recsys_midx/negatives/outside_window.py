"""``negatives=outside_window``: ``M`` ids per training sequence, uniformly without replacement
among the items the sequence does not hold, shared by all its positions: how SASRec+ (Klenitskiy
& Vasilev, RecSys 2023) trains with 3,000 negatives per user. The proposal is the same for
every id, so the logQ correction is a constant shift and is left out; no sampler is used.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from ..protocols import NegativeSampler
from .base import Negatives, QueryBatch, Scope, Strategy


@torch.no_grad()
def draw_outside_windows(
    windows: Tensor, num_items: int, num_negatives: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """``M`` ids per sequence, uniformly without replacement among the items not in it.

    Random keys for every item, the sequence's own items (and padding id 0) keyed last: the
    ``M`` smallest keys are a uniform draw without replacement from the rest.

    Args:
        windows: ``[B, W]`` item ids of each sequence, padded with ``0``.
        num_items: ``N``.
        num_negatives: ``M``.
        generator: random generator on the device of ``windows`` (``None``: the global one).

    Returns:
        ``[B, M]`` ids in ``1..N``, and a ``[B, M]`` mask of the valid ones (false where a
        sequence holds more than ``N - M`` items and too few are left).

    Example:
        >>> ids, valid = draw_outside_windows(torch.tensor([[1, 2, 0]]), 5, 3)
        >>> sorted(ids[0].tolist()), valid.all().item()
        ([3, 4, 5], True)
    """
    keys = torch.rand(len(windows), num_items + 1, device=windows.device, generator=generator)
    keys[:, 0] = float("inf")
    keys.scatter_(1, windows, float("inf"))
    chosen, ids = keys.topk(min(num_negatives, num_items), dim=1, largest=False)
    return ids, torch.isfinite(chosen)


class OutsideWindow(Strategy):
    """``num_negatives`` ids per training sequence, uniformly without replacement among the
    items outside it (:func:`draw_outside_windows`), without logQ correction.

    Args:
        num_negatives: ``M``, ids per sequence (at most the catalog; a sequence that leaves
            fewer than ``M`` items outside gets the ones there are).

    Raises:
        ValueError: if ``num_negatives < 1``.

    Example:
        >>> from recsys_midx.negatives import QueryBatch
        >>> batch = QueryBatch(torch.randn(2, 8), torch.tensor([2, 3]), num_items=5,
        ...                    windows=torch.tensor([[1, 2, 3]]),
        ...                    positions=torch.tensor([[True, True]]))
        >>> sorted(OutsideWindow(2)(batch, None).ids[0].tolist())  # two of items 4 and 5
        [4, 5]
    """

    name: ClassVar[str] = "outside_window"
    scope: ClassVar[Scope] = "sequence"
    #: Draws uniformly by itself.
    uses_sampler: ClassVar[bool] = False
    needs_windows: ClassVar[bool] = True

    def __init__(self, num_negatives: int) -> None:
        super().__init__()
        if num_negatives < 1:
            raise ValueError(f"num_negatives={num_negatives}: draw at least 1 negative")
        self.num_negatives = int(num_negatives)

    def forward(
        self, batch: QueryBatch, sampler: NegativeSampler | None, with_positive_log_q: bool = True
    ) -> Negatives:
        """The batch's negatives; ``sampler`` is not used.

        Raises:
            ValueError: without the batch's windows or catalog size.
        """
        sequences = batch.sequences(f"negatives={self.name}")
        if batch.num_items is None:
            raise ValueError(f"negatives={self.name} draws from the catalog: give num_items")
        ids, valid = draw_outside_windows(batch.windows, batch.num_items, self.num_negatives)
        return Negatives("sequence", ids, excluded=~valid, sequences=sequences)

    def extra_repr(self) -> str:
        return f"num_negatives={self.num_negatives}"
