"""Row lookups of an item table whose gradient may be sparse, and row blocks of a tensor.

A sampled step reads a few rows of the table; with a sparse table optimizer the table's gradient
must hold only those rows, which every lookup of the step then has to produce as a sparse
gradient (a dense and a sparse gradient of one table add up to a dense one). The table carries
that choice itself, so every reader of it (the encoder's input lookup, the losses) agrees.

Work whose temporaries grow with the rows (queries, items) takes them in blocks
(:func:`row_chunks`, and :func:`catalog_chunks` for a table's real items), so that memory stays
bounded whatever the batch or catalog.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch.nn.functional as F
from torch import Tensor, nn

_SPARSE_ROWS = "sparse_rows"


def mark_sparse_rows(table: nn.Parameter) -> None:
    """Make every :func:`lookup_rows` of ``table`` give it a sparse gradient."""
    setattr(table, _SPARSE_ROWS, True)


def has_sparse_rows(table: Tensor) -> bool:
    """Whether ``table`` was marked by :func:`mark_sparse_rows`."""
    return bool(getattr(table, _SPARSE_ROWS, False))


def lookup_rows(table: Tensor, ids: Tensor) -> Tensor:
    """``table[ids]`` (shape ``ids.shape + (D,)``), with a sparse gradient for a marked table.

    Args:
        table: ``[N+1, D]`` item table.
        ids: integer ids of any shape.

    Returns:
        The rows, in the table's dtype.

    Example:
        >>> import torch
        >>> table = nn.Parameter(torch.randn(5, 3))
        >>> mark_sparse_rows(table)
        >>> lookup_rows(table, torch.tensor([1, 3])).sum().backward()
        >>> table.grad.is_sparse, table.grad.coalesce().indices().tolist()
        (True, [[1, 3]])
    """
    return F.embedding(ids, table, sparse=has_sparse_rows(table))


def row_chunks(rows: Tensor, size: int) -> Iterator[tuple[slice, Tensor]]:
    """The blocks of ``size`` rows of ``rows`` (the last one shorter), with their slices.

    Example:
        >>> import torch
        >>> [(part.start, block.shape[0]) for part, block in row_chunks(torch.zeros(5, 2), 2)]
        [(0, 2), (2, 2), (4, 1)]
    """
    for start in range(0, rows.shape[0], size):
        part = slice(start, start + size)
        yield part, rows[part]


def catalog_chunks(item_emb: Tensor, size: int) -> Iterator[tuple[int, Tensor]]:
    """The blocks of ``size`` real items of a ``[N+1, D]`` table (rows ``1..N``, after the
    padding row), each with the id of its first item.

    Example:
        >>> import torch
        >>> [(first, block.shape[0]) for first, block in catalog_chunks(torch.zeros(6, 2), 2)]
        [(1, 2), (3, 2), (5, 1)]
    """
    for part, block in row_chunks(item_emb[1:], size):
        yield part.start + 1, block
