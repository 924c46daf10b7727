"""How a MIDX proposal draws a cell, and the log normaliser that comes with the draw.

A cell ``(k_1..k_B)`` weighs ``exp(sum_b s_b(k_b)) * W_cell``, with ``s_b`` the query's codeword
scores and ``W_cell`` the cell's last-stage weight (see :mod:`recsys_midx.samplers.last_stage`).
A cell is drawn in one of two ways:

* **From the cell table** (any ``B``, any stage): the per-query log masses of all cells, one exp,
  one cumsum and one ``torch.searchsorted`` per query: ``O(#cells)`` per query. When at least a
  third of the ``K**B`` cells are non-empty (``B = 2`` with ``N`` much larger than ``K**2``) the
  table is the dense grid, built as an outer sum of the per-codebook scores (a broadcast add,
  cheaper per cell than a gather), with ``log W = -inf`` for empty cells; otherwise
  (``B >= 3``, small ``N``) it lists only the non-empty cells and gathers their scores.
* **In two stages** (``B = 2``, query-independent ``W``: the uniform and popularity stages):
  laid out by code pair, the mass of a cell factors as ``e_1(k_1) * e_2(k_2) * W[k_1, k_2]``
  with ``e_b = exp(s_b)`` (``W = 0`` for empty cells), so the marginal of ``k_1`` is
  ``e_1 * (W @ e_2)``, one ``[Q, K] x [K, K]`` matrix product with no exp per cell, and
  ``k_2 | k_1`` is drawn from ``e_2 * W[k_1]``, ``K`` work per draw: ``O(M*K)`` per query besides
  the product, against ``O(#cells)`` exps, cumsums and searches for the table. So cells finer
  than the items (``K**2 > N``) cost no scan of the non-empty cells. ``cell_draw="auto"`` picks
  the cheaper way: two stages when ``K**2 / 256 + 0.6 * M * K <= #cells`` (costs in units of
  the table's work per cell; about ``M <= 5/3 * K`` on the dense grid). The table remains the
  cheaper way for many draws per query against few codewords, and on clustered tables whose few
  non-empty cells make a short sparse table (which ``#cells`` accounts for). The normaliser of
  :meth:`~recsys_midx.samplers.midx.MIDXSampler.log_prob` comes from the same product, whatever
  ``M``.
  Each codebook's scores are shifted by their maximum over the codewords with non-empty cells
  before the exp; should the masses of a query still fall towards float32's subnormal range
  (the non-empty cells some 80 nats below both peaks), its chunk falls back to the table.

Either way the draw reports ``log Z``, so ``log q`` is normalised for drawn ids and any other id.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from recsys_midx.samplers.cell_layout import cell_keys
from recsys_midx.samplers.draws import inverse_cdf

#: The work of one cell of the table (an exp, a cumsum step and a search) in multiply-adds of the
#: two-stage matrix product, which runs at full arithmetic throughput; set by timing both ways.
_MULTIPLY_ADDS_PER_CELL = 256

#: The work of one weight of a two-stage conditional draw in cells of the table, set by timing
#: both ways on diffuse and clustered catalogs (``scripts/bench_cell_draws.py``).
_CELLS_PER_CONDITIONAL_WEIGHT = 0.6

#: Least total mass, per unit of ``sum(W) + K``, of a query's factorised masses: each subnormal
#: or underflowed product loses at most ``2**-149`` per unit weight, so above this floor the
#: roundings cost under ``2**-29`` of the total, below float32's own rounding.
_MASS_FLOOR = 2.0**-120


class CodePairGrid(NamedTuple):
    """The cells of two codebooks laid out by code pair ``(k_1, k_2)``.

    Attributes:
        weights: ``[K, K]`` cell weights ``W`` (0 for empty cells).
        cells: ``[K*K]`` cell index of each pair ``k_1 * K + k_2``, or ``None`` for the dense
            grid, whose cells are the pairs themselves.
    """

    weights: Tensor
    cells: Tensor | None


def two_stages_are_cheaper(num_codewords: int, num_samples: int, num_cells: int) -> bool:
    """Whether ``num_samples`` draws per query (0: only the normaliser) cost less in two stages.

    The costs are in units of the table's work per cell (an exp, a cumsum step and its share of
    the searches), against the table's ``#cells``: ``K**2 / 256`` for the ``[K, K]`` matrix
    product (a multiply-add is a small fraction of a cell's work) plus ``0.6 * M * K`` for the
    conditionals (``M`` rows of ``K`` weights per query: a gathered row, a multiply and a cumsum
    step per weight, no exp). For the dense grid that is about ``M <= 5/3 * K``.

    Args:
        num_codewords: ``K``.
        num_samples: ``M``.
        num_cells: cells in the per-query table.

    Returns:
        ``True`` when the two-stage draw is the cheaper one.

    Example:
        >>> two_stages_are_cheaper(64, 106, 64 * 64), two_stages_are_cheaper(64, 107, 64 * 64)
        (True, False)
    """
    k = num_codewords
    conditionals = _CELLS_PER_CONDITIONAL_WEIGHT * num_samples * k
    return k * k / _MULTIPLY_ADDS_PER_CELL + conditionals <= num_cells


def code_pair_grid(
    cell_weights: Tensor, cell_codes: Tensor, num_codewords: int, dense: bool
) -> CodePairGrid:
    """The cell weights of two codebooks as a ``[K, K]`` matrix over code pairs.

    Args:
        cell_weights: ``[C]`` query-independent cell weights ``W_cell`` of the table's cells.
        cell_codes: ``[C, 2]`` codes of those cells.
        num_codewords: ``K``.
        dense: whether the table is the dense ``K x K`` grid.

    Returns:
        The grid, with the cell of each pair when the table is sparse.
    """
    k = num_codewords
    if dense:
        return CodePairGrid(cell_weights.view(k, k), None)
    keys = cell_keys(cell_codes, k)
    grid = cell_weights.new_zeros(k * k).index_put_((keys,), cell_weights)
    # Pairs of empty cells have zero weight and are never drawn; 0 is only a placeholder.
    cells = torch.zeros(k * k, dtype=torch.long, device=keys.device)
    cells[keys] = torch.arange(keys.numel(), device=keys.device)
    return CodePairGrid(grid.view(k, k), cells)


def factorised_masses(scores: Tensor, grid: CodePairGrid) -> tuple[Tensor, Tensor, Tensor] | None:
    """``k_1`` masses ``[Qc, K]``, ``e_2`` ``[Qc, K]`` and the log shift ``[Qc, 1]`` of the
    masses, for codeword scores ``[Qc, 2K]``; ``None`` if a query's masses lose precision.

    The masses are ``e_1(k_1) * sum_{k_2} W[k_1, k_2] e_2(k_2)`` with ``e_b = exp(s_b - max
    s_b)``, the maximum taken over the codewords that have non-empty cells (the others get
    ``e_b = 0``); the log normaliser is ``shift + log(sum of the masses)``. When the non-empty
    cells lie far below both peaks, the products fall into float32's subnormal range, where
    they lose relative precision, or underflow to zero; a query whose total mass is below
    :data:`_MASS_FLOOR` times ``sum(W) + K`` (which bounds the mass those roundings can lose)
    makes the chunk go to the table instead, which shifts by the best non-empty cell.
    """
    k = grid.weights.shape[0]
    per_book = scores.view(scores.shape[0], 2, k)
    live = torch.stack([grid.weights.sum(1) > 0, grid.weights.sum(0) > 0])
    peak = per_book.masked_fill(~live, -math.inf).amax(2, keepdim=True)
    # Codewords without non-empty cells may score above the peak: zero them before any product.
    e_1, e_2 = per_book.sub(peak).exp_().masked_fill_(~live, 0.0).unbind(1)
    masses = (e_2 @ grid.weights.T).mul_(e_1)
    floor = grid.weights.sum().add(k).mul_(_MASS_FLOOR)  # a tensor: no host sync for it
    if not bool((masses.sum(1) >= floor).all()):
        return None
    return masses, e_2, peak.sum(1)


def draw_cells_in_two_stages(
    scores: Tensor, grid: CodePairGrid, num_samples: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor] | None:
    """``log Z`` ``[Qc, 1]`` and cells ``[Qc, M]`` drawn as ``k_1`` from its marginal, then
    ``k_2 | k_1``, for codeword scores ``[Qc, 2K]``; ``None`` if the masses underflow."""
    factorised = factorised_masses(scores, grid)
    if factorised is None:
        return None
    masses, e_2, shift = factorised
    k_1, total = inverse_cdf(masses, num_samples, generator)
    conditional = grid.weights[k_1].mul_(e_2.unsqueeze(1))
    k_2, _ = inverse_cdf(conditional, 1, generator)
    pairs = k_1 * grid.weights.shape[0] + k_2.squeeze(2)
    cells = pairs if grid.cells is None else grid.cells[pairs]
    return shift + total.log(), cells


def draw_cells_from_table(
    table: Tensor, num_samples: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """``log Z`` ``[Qc, 1]`` and cells ``[Qc, M]`` drawn from the log cell masses ``[Qc, C]``
    (overwritten)."""
    peak = table.amax(1, keepdim=True)
    cells, total = inverse_cdf(table.sub_(peak).exp_(), num_samples, generator)
    return peak + total.log(), cells


def cell_score_table(scores: Tensor, cell_codes: Tensor, num_codewords: int, dense: bool) -> Tensor:
    """``sum_b s_b(k_b)`` of every cell of the table, ``[Qc, C]``, a fresh tensor.

    The dense grid is an outer sum of the per-codebook scores; a sparse table gathers the scores
    of its cells' codes.

    Args:
        scores: ``[Qc, B*K]`` codeword scores.
        cell_codes: ``[C, B]`` codes of the table's cells.
        num_codewords: ``K``.
        dense: whether the table is the dense ``K**B`` grid (in key order).
    """
    num_books = cell_codes.shape[1]
    if not dense:
        return summed_codeword_scores(scores, cell_codes, num_codewords)
    per_book = scores.view(scores.shape[0], num_books, num_codewords)
    # A copy even for B = 1: callers update the table in place.
    table = per_book[:, 0].clone() if num_books == 1 else per_book[:, 0]
    for b in range(1, num_books):
        table = (table.unsqueeze(2) + per_book[:, b].unsqueeze(1)).flatten(1)
    return table


def summed_codeword_scores(scores: Tensor, codes: Tensor, num_codewords: int) -> Tensor:
    """``sum_b s_b(codes[c, b])`` ``[Qc, C]`` for codeword scores ``[Qc, B*K]`` and code rows
    ``[C, B]`` shared by all queries (cells or items): one ``index_select`` per codebook.

    Example:
        >>> scores = torch.tensor([[1.0, 2.0, 10.0, 20.0]])  # B = 2, K = 2
        >>> summed_codeword_scores(scores, torch.tensor([[0, 1], [1, 0]]), 2).tolist()
        [[21.0, 12.0]]
    """
    num_books = codes.shape[1]
    per_book = scores.view(scores.shape[0], num_books, num_codewords)
    total = per_book[:, 0].index_select(1, codes[:, 0])
    for b in range(1, num_books):
        total += per_book[:, b].index_select(1, codes[:, b])
    return total
