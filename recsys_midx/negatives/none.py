"""``negatives=none``: no drawn negatives, the exact softmax over the whole catalog
(``sampler=full`` chooses it)."""

from __future__ import annotations

from typing import ClassVar

from ..protocols import NegativeSampler
from .base import Negatives, QueryBatch, Scope, Strategy


class NoNegatives(Strategy):
    """Every item of the catalog is a negative, scored exactly: the loss computes the exact
    softmax (chunked over the catalog). No sampler is built.

    Args:
        exclude_window: leave each query's training-sequence items other than its target out
            of its normaliser (sequences only, ``task=seqrec``; the loss then takes only a plain
            dot product): the negatives carry the batch's ``sequences``.

    Example:
        >>> import torch
        >>> from recsys_midx.negatives import QueryBatch
        >>> negatives = NoNegatives()(QueryBatch(torch.randn(2, 4), torch.tensor([1, 2])), None)
        >>> negatives.scope, negatives.ids
        ('catalog', None)
    """

    name: ClassVar[str] = "none"
    scope: ClassVar[Scope] = "catalog"
    uses_sampler: ClassVar[bool] = False

    def __init__(self, exclude_window: bool = False) -> None:
        super().__init__()
        self.exclude_window = self.needs_windows = bool(exclude_window)

    def forward(
        self, batch: QueryBatch, sampler: NegativeSampler | None, with_positive_log_q: bool = True
    ) -> Negatives:
        """The whole catalog, with the batch's sequences under ``exclude_window``.

        Raises:
            ValueError: with ``exclude_window``, without the batch's windows.
        """
        if not self.exclude_window:
            return Negatives("catalog")
        return Negatives("catalog", sequences=batch.sequences("negatives.exclude_window=true"))

    def extra_repr(self) -> str:
        return f"exclude_window={self.exclude_window}"
