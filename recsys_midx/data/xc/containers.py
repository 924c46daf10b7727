"""In-memory containers of extreme classification data: CSR arrays and labelled points.

**Ids.** Feature ids stay 0-based (``0..F-1``): they index an ``EmbeddingBag`` that has no
padding row. Label ids are ``1..L`` (the repository's file id + 1), so that ``0`` is padding, as
for items everywhere else in the toolkit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CSR:
    """A sparse row matrix as CSR arrays: row ``r`` owns ``indices[indptr[r]:indptr[r + 1]]``.

    Attributes:
        indptr: ``int64 [rows + 1]`` row starts, ``indptr[0] == 0``.
        indices: ``int32 [nnz]`` column ids, ascending within each row.
        values: ``float32 [nnz]`` values aligned with ``indices``, or ``None`` (all ones).
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        """Number of rows."""
        return len(self.indptr) - 1

    def row_lengths(self) -> np.ndarray:
        """``int64 [rows]`` non-zeros per row."""
        return np.diff(self.indptr)

    def take(self, rows: np.ndarray) -> CSR:
        """The rows ``rows`` (any order, repeats allowed), gathered without a Python loop.

        Args:
            rows: ``[R]`` row indices.

        Returns:
            A CSR matrix with ``R`` rows.

        Example:
            >>> m = CSR(np.array([0, 2, 3]), np.array([4, 7, 1], dtype=np.int32))
            >>> m.take(np.array([1, 0])).indices
            array([1, 4, 7], dtype=int32)
        """
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        # Position j of the output comes from starts[row(j)] + (j - indptr[row(j)]).
        source = np.arange(indptr[-1], dtype=np.int64) + np.repeat(starts - indptr[:-1], lengths)
        values = None if self.values is None else self.values[source]
        return CSR(indptr, self.indices[source], values)


@dataclass(frozen=True)
class XCData:
    """Points with sparse features and label sets.

    Attributes:
        features: feature ids ``0..F-1`` with float32 values, one row per point.
        labels: label ids ``1..L`` (no values), one row per point.
        num_features: ``F``.
        num_labels: ``L``.
    """

    features: CSR
    labels: CSR
    num_features: int
    num_labels: int

    @property
    def num_points(self) -> int:
        """Number of points."""
        return self.features.num_rows

    def take(self, rows: np.ndarray) -> XCData:
        """The points ``rows``, in that order (see :meth:`CSR.take`)."""
        return XCData(
            self.features.take(rows), self.labels.take(rows), self.num_features, self.num_labels
        )

    def label_counts(self) -> np.ndarray:
        """``int64 [L+1]``: how many points carry each label (entry 0, padding, is 0)."""
        return np.bincount(self.labels.indices, minlength=self.num_labels + 1).astype(np.int64)


def csr_from_pairs(
    rows: np.ndarray, columns: np.ndarray, values: np.ndarray | None, num_rows: int
) -> CSR:
    """CSR of ``(row, column)`` entries; repeated entries merge (values add up), columns sort.

    Entries already strictly increasing within each row (the usual case for files) are taken
    as they are, which avoids sorting tens of millions of keys.

    Args:
        rows: ``[nnz]`` row of each entry, non-decreasing.
        columns: ``[nnz]`` non-negative column of each entry.
        values: ``[nnz]`` value of each entry, or ``None`` for a matrix without values.
        num_rows: rows of the matrix (trailing rows may be empty).

    Returns:
        The matrix, with ``int32`` columns and ``float32`` values.

    Example:
        >>> m = csr_from_pairs(np.array([0, 0, 2]), np.array([5, 1, 5]), None, num_rows=3)
        >>> m.indptr.tolist(), m.indices.tolist()
        ([0, 2, 2, 3], [1, 5, 5])
    """
    rows = rows.astype(np.int64, copy=False)
    indptr = np.zeros(num_rows + 1, dtype=np.int64)
    step = np.diff(columns)
    if not np.all((step > 0) | (np.diff(rows) > 0)):
        width = int(columns.max()) + 1
        keys, inverse = np.unique(rows * width + columns, return_inverse=True)
        if values is not None:
            values = np.bincount(inverse, weights=values)
        rows, columns = keys // width, keys % width
    np.cumsum(np.bincount(rows, minlength=num_rows), out=indptr[1:])
    merged = None if values is None else values.astype(np.float32, copy=False)
    return CSR(indptr, columns.astype(np.int32, copy=False), merged)
