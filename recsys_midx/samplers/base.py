"""The sampler protocol shared by every negative sampler.

A sampler proposes negative item ids for a batch of (already temperature-scaled) query vectors and
reports the exact, normalised log-probability ``log q`` of each id, which the sampled-softmax loss
uses for the logQ correction. Item ids are ``1..N``; id ``0`` is padding and is never drawn.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import torch
from torch import Tensor


class Sampler(torch.nn.Module, abc.ABC):
    """Base class of all samplers.

    Subclasses implement :meth:`sample` and :meth:`log_prob`, and override :meth:`update` when the
    proposal depends on the item table or on item counts. Samplers are plain torch modules: their
    state (codebooks, weights) lives in buffers, so it follows ``.to(device)`` and ``state_dict``.

    Args:
        num_items: ``N``, the number of real items; valid ids are ``1..N``.
        num_negatives: ``M``, how many negatives the objective draws per query with this sampler.

    Raises:
        ValueError: if ``num_items < 1`` or ``num_negatives`` is not in ``1..N-1``.
    """

    #: True for the sampler that stands for "no sampling": the objective computes the exact
    #: full-softmax cross-entropy instead of drawing negatives.
    exhaustive: ClassVar[bool] = False

    def __init__(self, num_items: int, num_negatives: int = 100) -> None:
        super().__init__()
        if num_items < 1:
            raise ValueError(f"num_items must be >= 1, got {num_items}")
        if not self.exhaustive and not 0 < num_negatives < num_items:
            raise ValueError(
                f"num_negatives must be in 1..{num_items - 1} for a catalog of {num_items} items, "
                f"got {num_negatives}"
            )
        self.num_items = int(num_items)
        self.num_negatives = int(num_negatives)

    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """(Re)build the proposal from the item table ``[N+1, D]`` and optional counts ``[N+1]``.

        The default does nothing: proposals that depend on neither need no state.
        """

    @abc.abstractmethod
    def sample(self, query: Tensor, num_samples: int) -> tuple[Tensor, Tensor]:
        """Draw ``num_samples`` ids per query, with replacement.

        Args:
            query: ``[Q, D]`` scaled query vectors.
            num_samples: ``M``, ids drawn per query.

        Returns:
            ``ids`` ``[Q, M]`` (long, in ``1..N``) and ``log_q`` ``[Q, M]`` (float32, normalised).
        """

    @abc.abstractmethod
    def log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """Normalised ``log q(ids | query)`` with the shape of ``ids`` (``[Q, ...]``), float32."""

    def extra_repr(self) -> str:
        return f"num_items={self.num_items}, num_negatives={self.num_negatives}"
