"""The last stage of a MIDX proposal: the within-cell weights ``w_i`` and draws inside a cell.

A MIDX proposal draws a cell, then an item inside it in proportion to ``w_i``; the cell's weight
``W_cell = sum_{i in cell} w_i`` enters the cell masses. Each stage keeps what its weights need in
buffers, rebuilt from the sampler's cell layout (ids in cell order and the cells' start offsets):

* :class:`UniformStage`: ``w_i = 1``;
* :class:`PopularityStage`: ``w_i = (count_i + smoothing) ** alpha``, query independent;
* :class:`ResidualStage`: ``w_i = exp(z.r_i)`` with the residual ``r_i = v_i - c_i``, which makes
  the proposal the softmax itself.
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from recsys_midx.index import Codebooks, IndexModule
from recsys_midx.samplers.draws import draw_weighted, position_of_ids, prefix_sum
from recsys_midx.samplers.popularity import popularity_weights

#: Cap on ``query rows x items`` per chunk of the residual stage (its per-query tables are ``[N]``).
_EXACT_CHUNK_ELEMENTS = 1 << 22


class LastStage(IndexModule, abc.ABC):
    """The within-cell weights ``w_i`` of a MIDX proposal and how to draw from them.

    ``offsets`` ``[C+1]`` are the start positions of the cells in cell order (the order of the
    sampler's ``order`` buffer); positions index that order, ids index the item table.

    Example:
        >>> from recsys_midx.index import ProductCodebooks
        >>> from recsys_midx.samplers.cell_layout import build_cell_layout
        >>> items = torch.randn(101, 8)
        >>> books = ProductCodebooks(num_codewords=4)
        >>> order, offsets, _ = build_cell_layout(books.fit(items[1:]), 4)
        >>> stage = UniformStage()
        >>> stage.rebuild(order, offsets, items, None, books)
        >>> int(stage.cell_log_weight(None).exp().sum())
        100
    """

    #: Largest ``query rows x items`` block the stage needs per chunk, or ``None`` if none.
    chunk_elements: ClassVar[int | None] = None
    #: Whether the weights depend on the query (the cell weights are then ``[Q, C]``).
    query_dependent: ClassVar[bool] = False

    @abc.abstractmethod
    def rebuild(
        self,
        order: Tensor,
        offsets: Tensor,
        item_emb: Tensor,
        item_counts: Tensor | None,
        codebooks: Codebooks,
    ) -> None:
        """Rebuild from the cell layout (``order`` ``[N]``: ids in cell order), the item table
        ``[N+1, D]``, optional counts ``[N+1]`` and the fitted codebooks."""

    def prepare(self, query: Tensor, offsets: Tensor) -> Any:
        """Per-chunk state shared by the other methods (none for query-independent weights)."""
        return None

    @abc.abstractmethod
    def cell_log_weight(self, state: Any) -> Tensor:
        """``log W_cell``, ``[C]`` (query independent) or ``[Q, C]``; ``-inf`` for empty cells."""

    @abc.abstractmethod
    def draw(
        self, state: Any, cells: Tensor, offsets: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        """Positions ``[Q, M]`` drawn inside ``cells`` ``[Q, M]`` in proportion to ``w_i``."""

    @abc.abstractmethod
    def item_log_weight(self, state: Any, ids: Tensor) -> Tensor:
        """``log w_i`` of ``ids`` ``[Q, L]`` (ids ``>= 1``), broadcastable to ``[Q, L]``."""


class UniformStage(LastStage):
    """``w_i = 1``: a cell weighs its item count; the draw is ``offset + floor(u * count)``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("log_cell_weights", torch.empty(0))

    def rebuild(
        self,
        order: Tensor,
        offsets: Tensor,
        item_emb: Tensor,
        item_counts: Tensor | None,
        codebooks: Codebooks,
    ) -> None:
        self.log_cell_weights = offsets.diff().float().log()

    def cell_log_weight(self, state: None) -> Tensor:
        return self.log_cell_weights

    def draw(
        self, state: None, cells: Tensor, offsets: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        start = offsets[cells]
        count = offsets[cells + 1] - start
        # float64: 53 random bits keep floor(u * count) uniform for any realistic cell size.
        u = torch.rand(cells.shape, dtype=torch.float64, device=cells.device, generator=generator)
        return start + (u * count).long().clamp_max_(count - 1)

    def item_log_weight(self, state: None, ids: Tensor) -> Tensor:
        return torch.zeros((), device=ids.device)


class PopularityStage(LastStage):
    """``w_i = (count_i + smoothing) ** alpha``, drawn by a search in global cumulative weights.

    The counts are kept, so ``update(item_emb)`` without counts reuses the last ones.

    Args:
        alpha: exponent of the weight (the sampler's ``pop_alpha``).
        smoothing: added to every count (the sampler's ``pop_smoothing``).

    Raises:
        ValueError: if ``alpha`` is not finite or ``smoothing`` is negative or not finite; from
            :meth:`rebuild`, if no counts were ever given.
    """

    def __init__(self, alpha: float, smoothing: float) -> None:
        super().__init__()
        if not math.isfinite(alpha):
            raise ValueError(f"pop_alpha must be finite, got {alpha}")
        if not (math.isfinite(smoothing) and smoothing >= 0):
            raise ValueError(f"pop_smoothing must be finite and >= 0, got {smoothing}")
        self.alpha = float(alpha)
        self.smoothing = float(smoothing)
        self.register_buffer("counts", torch.empty(0, dtype=torch.float64))
        self.register_buffer("log_weights", torch.empty(0))
        # float64: a running sum over millions of items must still resolve a single weight.
        self.register_buffer("cum_weights", torch.empty(0, dtype=torch.float64))
        self.register_buffer("cell_cum_weights", torch.empty(0, dtype=torch.float64))
        self.register_buffer("log_cell_weights", torch.empty(0))

    def rebuild(
        self,
        order: Tensor,
        offsets: Tensor,
        item_emb: Tensor,
        item_counts: Tensor | None,
        codebooks: Codebooks,
    ) -> None:
        if item_counts is None and self.counts.numel() == 0:
            raise ValueError("the popularity last stage needs item_counts on its first update")
        counts = self.counts if item_counts is None else item_counts.detach().to(item_emb.device)
        weights = popularity_weights(counts, item_emb.shape[0] - 1, self.alpha, self.smoothing)
        self.counts = counts.to(torch.float64)
        self.log_weights = weights.log().float()
        self.cum_weights = weights[order].cumsum(0)
        self.cell_cum_weights = prefix_sum(self.cum_weights, offsets)
        self.log_cell_weights = self.cell_cum_weights.diff().log().float()

    def cell_log_weight(self, state: None) -> Tensor:
        return self.log_cell_weights

    def draw(
        self, state: None, cells: Tensor, offsets: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        return draw_weighted(self.cum_weights, self.cell_cum_weights, cells, offsets, generator)

    def item_log_weight(self, state: None, ids: Tensor) -> Tensor:
        return self.log_weights[ids]

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, smoothing={self.smoothing}"


class ExactState(NamedTuple):
    """Per-chunk tables of the residual stage, all over positions in cell order."""

    #: ``[Q, N]`` float64 inclusive cumsum of ``exp(z.r - max_{cell} z.r)``.
    cum: Tensor
    #: ``[Q, C+1]`` that cumsum before each cell start (last entry: the total).
    cell_cum: Tensor
    #: ``[Q, C]`` ``log W_cell = log sum_{i in cell} exp(z.r_i)``.
    log_cell_weights: Tensor
    #: ``[Q, N]`` residual scores ``z.r``.
    residual_scores: Tensor


class ResidualStage(LastStage):
    """``w_i = exp(z.r_i)``, ``r_i = v_i - c_i``: the proposal is the softmax itself.

    Per query chunk it scores all residuals and shifts them by their per-cell maximum, so every
    non-empty cell sums to at least 1 and a float64 cumsum resolves every cell's mass, however
    small against the others.
    """

    chunk_elements = _EXACT_CHUNK_ELEMENTS
    query_dependent = True

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("residuals", torch.empty(0, 0))
        self.register_buffer("positions", torch.empty(0, dtype=torch.long))
        self.register_buffer("cell_of_position", torch.empty(0, dtype=torch.long))

    def rebuild(
        self,
        order: Tensor,
        offsets: Tensor,
        item_emb: Tensor,
        item_counts: Tensor | None,
        codebooks: Codebooks,
    ) -> None:
        items = item_emb[order].float()
        self.residuals = items - codebooks.reconstruct(codebooks.codes[order - 1])
        self.positions = position_of_ids(order)
        cells = torch.arange(offsets.numel() - 1, device=order.device)
        self.cell_of_position = cells.repeat_interleave(offsets.diff())

    def prepare(self, query: Tensor, offsets: Tensor) -> ExactState:
        scores = query @ self.residuals.T
        rows, num_cells = query.shape[0], offsets.numel() - 1
        cell_index = self.cell_of_position.expand(rows, -1)
        cell_max = scores.new_full((rows, num_cells), -math.inf).scatter_reduce_(
            1, cell_index, scores, "amax"
        )
        shifted = (scores - cell_max.gather(1, cell_index)).exp_()
        cum = shifted.cumsum(1, dtype=torch.float64)
        cell_cum = prefix_sum(cum, offsets.expand(rows, -1))
        log_cell_weights = cell_cum.diff(dim=1).log().float() + cell_max
        return ExactState(cum, cell_cum, log_cell_weights, scores)

    def cell_log_weight(self, state: ExactState) -> Tensor:
        return state.log_cell_weights

    def draw(
        self, state: ExactState, cells: Tensor, offsets: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        return draw_weighted(state.cum, state.cell_cum, cells, offsets, generator)

    def item_log_weight(self, state: ExactState, ids: Tensor) -> Tensor:
        return state.residual_scores.gather(1, self.positions[ids])
