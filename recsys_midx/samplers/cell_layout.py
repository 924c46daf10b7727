"""The cell layout of a MIDX index: items grouped by their codes into the cells of the table.

Item ``i`` with codes ``(k_1..k_B)`` falls in the cell whose key is ``sum_b k_b * K**(B-1-b)``,
its row-major index in the dense ``K**B`` grid. The layout lists the ids sorted by key (cell
order), the start offset of each cell, and the codes of the cells the per-query table holds: the
whole grid (empty cells included) when it is well filled, else only the non-empty cells, in key
order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

#: The dense ``K**B`` table is used when at least this fraction of its cells is non-empty.
_DENSE_MIN_FILL = 1.0 / 3.0


class CellLayout(NamedTuple):
    """Items grouped by cell.

    Attributes:
        order: ``[N]`` ids ``1..N`` in cell order: the items of cell ``c`` are
            ``order[offsets[c]:offsets[c+1]]``.
        offsets: ``[C+1]`` start of each cell in ``order`` (last entry: ``N``).
        cell_codes: ``[C, B]`` codes of the cells in the table (all ``K**B`` cells when dense).
    """

    order: Tensor
    offsets: Tensor
    cell_codes: Tensor


def build_cell_layout(codes: Tensor, num_codewords: int) -> CellLayout:
    """Group items ``1..N`` by their codes ``[N, B]`` (row ``i-1`` holds item ``i``'s codes).

    Args:
        codes: ``[N, B]`` long codes in ``0..K-1``.
        num_codewords: ``K``.

    Returns:
        The layout; dense when at least a third of the ``K**B`` cells are non-empty.

    Example:
        >>> layout = build_cell_layout(torch.tensor([[1, 0], [0, 1], [1, 0]]), 2)
        >>> layout.order.tolist(), layout.offsets.tolist()
        ([2, 1, 3], [0, 0, 1, 3, 3])
    """
    keys = cell_keys(codes, num_codewords)
    positions = torch.argsort(keys, stable=True)
    sorted_keys = keys[positions]
    present, counts = torch.unique_consecutive(sorted_keys, return_counts=True)
    grid = num_codewords ** codes.shape[1]
    if present.numel() >= _DENSE_MIN_FILL * grid:
        present = torch.arange(grid, device=keys.device)
        counts = torch.bincount(keys, minlength=grid)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return CellLayout(positions + 1, offsets, decode_keys(present, num_codewords, codes.shape[1]))


def cell_keys(codes: Tensor, num_codewords: int) -> Tensor:
    """Cell key ``sum_b k_b * K**(B-1-b)`` of each code row ``[n, B]``.

    Example:
        >>> cell_keys(torch.tensor([[1, 2], [0, 3]]), 4).tolist()
        [6, 3]
    """
    return (codes * _radix(num_codewords, codes.shape[1], codes.device)).sum(1)


def decode_keys(keys: Tensor, num_codewords: int, num_codebooks: int) -> Tensor:
    """Codes ``[C, B]`` of cell keys ``[C]``, the inverse of :func:`cell_keys`.

    Example:
        >>> decode_keys(torch.tensor([6, 3]), 4, 2).tolist()
        [[1, 2], [0, 3]]
    """
    radix = _radix(num_codewords, num_codebooks, keys.device)
    place_values = torch.div(keys.unsqueeze(1), radix, rounding_mode="floor")
    return place_values % num_codewords


def cells_of_keys(
    keys: Tensor, cell_codes: Tensor, num_codewords: int, dense: bool
) -> tuple[Tensor, Tensor]:
    """Table index of each cell key and whether the cell is in the table.

    Args:
        keys: cell keys, any shape.
        cell_codes: ``[C, B]`` codes of the table's cells (:attr:`CellLayout.cell_codes`).
        num_codewords: ``K``.
        dense: whether the table is the dense grid, whose index of a cell is its key; a sparse
            table holds only the non-empty cells, in key order.

    Returns:
        Cell indices (in range even for a missing cell) and a bool mask, both shaped like
        ``keys``.

    Example:
        >>> codes = torch.tensor([[0, 1], [1, 1]])
        >>> cells, present = cells_of_keys(torch.tensor([3, 2]), codes, 2, dense=False)
        >>> cells.tolist(), present.tolist()
        ([1, 1], [True, False])
    """
    if dense:
        return keys, torch.ones_like(keys, dtype=torch.bool)
    table_keys = cell_keys(cell_codes, num_codewords)
    cells = torch.searchsorted(table_keys, keys).clamp_max_(table_keys.numel() - 1)
    return cells, table_keys[cells] == keys


def _radix(num_codewords: int, num_codebooks: int, device: torch.device) -> Tensor:
    """``[K**(B-1), ..., K, 1]``: the place values of the mixed-radix cell keys."""
    powers = torch.arange(num_codebooks - 1, -1, -1, device=device)
    return num_codewords**powers
