"""Batches of sparse-feature points in ``torch.nn.EmbeddingBag`` form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from recsys_midx.data.xc.containers import XCData


@dataclass(frozen=True)
class SparseFeatures:
    """A batch of sparse feature vectors in ``torch.nn.EmbeddingBag`` form.

    Bag ``b`` holds ``indices[offsets[b]:offsets[b + 1]]`` weighted by the same slice of
    ``weights`` (``EmbeddingBag(..., include_last_offset=True)`` takes ``offsets`` as is). It
    slices by rows (``features[:n]`` is the first ``n`` bags) and moves with ``.to(device)``, so
    Lightning transfers it like a tensor.

    Attributes:
        indices: ``int64 [nnz]`` feature ids ``0..F-1``.
        offsets: ``int64 [B+1]`` bag starts, ``offsets[0] == 0``.
        weights: ``float32 [nnz]`` feature values.

    Example:
        >>> bags = SparseFeatures(torch.tensor([3, 1, 4]), torch.tensor([0, 2, 3]),
        ...                       torch.tensor([0.5, 1.0, 2.0]))
        >>> len(bags), bags[1:].indices
        (2, tensor([4]))
    """

    indices: Tensor
    offsets: Tensor
    weights: Tensor

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def __getitem__(self, rows: slice) -> SparseFeatures:
        """The bags ``rows`` (a slice with step 1)."""
        start, stop, step = rows.indices(len(self))
        if step != 1:
            raise ValueError("SparseFeatures slices need a step of 1")
        stop = max(start, stop)
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        return SparseFeatures(
            self.indices[first:last],
            self.offsets[start : stop + 1] - first,
            self.weights[first:last],
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SparseFeatures:
        """The same bags on ``device``."""
        return SparseFeatures(
            *(
                t.to(device, non_blocking=non_blocking)
                for t in (self.indices, self.offsets, self.weights)
            )
        )


Batch = dict[str, Any]


def make_batch(data: XCData, rows: Sequence[int] | np.ndarray) -> Batch:
    """The batch of points ``rows``: ``features`` and 0-padded ``labels`` ``[B, P]``.

    Args:
        data: the points.
        rows: ``[B]`` point indices.

    Returns:
        ``{"features": SparseFeatures, "labels": LongTensor [B, P]}`` with ``P`` the largest
        label count in the batch (at least 1).

    Example:
        ```python
        batch = make_batch(dataset.train, np.arange(4))
        ```
    """
    rows = np.asarray(rows, dtype=np.int64)
    points = data.take(rows)
    features, labels = points.features, points.labels
    lengths = labels.row_lengths()
    padded = np.zeros((len(rows), max(int(lengths.max(initial=0)), 1)), dtype=np.int64)
    columns = np.arange(len(labels.indices)) - np.repeat(labels.indptr[:-1], lengths)
    padded[np.repeat(np.arange(len(rows)), lengths), columns] = labels.indices
    return {
        "features": SparseFeatures(
            torch.from_numpy(features.indices.astype(np.int64)),
            torch.from_numpy(features.indptr),
            torch.from_numpy(features.values.astype(np.float32, copy=False)),
        ),
        "labels": torch.from_numpy(padded),
    }
