"""The items of a batch's training sequences, and which drawn ids fall in them.

A training window's other items are items its user did interact with; as negatives of the
window's queries they push down what the user chose at other positions. SASRec's own negatives,
SASRec+'s 3,000 per user and RecBole's negative sampling all come from outside the user's items.
The strategies that leave each sequence's items out (``negatives.exclude_window``) mark the
drawn ids that fall in the query's sequence (:func:`window_hits`), and the per-sequence ones
those that fall in the sequence (:func:`sequence_hits`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class SequenceWindows(NamedTuple):
    """The items of a batch's training sequences and the sequence each query belongs to.

    Attributes:
        items: ``[B, W]`` each sequence's item ids sorted ascending (padding ``0`` first).
        positions: ``[B, L]`` boolean mask of the query positions, row-major as the queries.
        rows: ``[Q]`` the sequence of each query.
    """

    items: Tensor
    positions: Tensor
    rows: Tensor

    @classmethod
    def of_batch(cls, windows: Tensor, positions: Tensor) -> SequenceWindows:
        """Windows ``[B, W]`` (padded with ``0``) and the ``[B, L]`` query positions.

        Raises:
            ValueError: if ``windows`` and ``positions`` do not have one row per sequence.

        Example:
            >>> seq = SequenceWindows.of_batch(torch.tensor([[0, 7, 3]]),
            ...                                torch.tensor([[False, True, True]]))
            >>> seq.items.tolist(), seq.rows.tolist()
            ([[0, 3, 7]], [0, 0])
        """
        if windows.dim() != 2 or positions.dim() != 2 or len(windows) != len(positions):
            raise ValueError(
                f"windows [B, W] and positions [B, L] need one row per sequence, got "
                f"{tuple(windows.shape)} and {tuple(positions.shape)}"
            )
        rows = torch.arange(len(positions), device=positions.device)
        return cls(
            windows.sort(dim=1).values, positions, rows[:, None].expand_as(positions)[positions]
        )


def window_hits(neg_ids: Tensor, windows: SequenceWindows) -> Tensor:
    """``[Q, M]`` true where a negative is an item of its query's training sequence.

    A query's own target is one of its sequence's items, so its accidental hits are among them.

    Args:
        neg_ids: ``[Q, M]`` per-query negatives, or ``[M]`` negatives shared by the batch.
        windows: the batch's sequences and the sequence of each of the ``Q`` queries.

    Returns:
        Boolean ``[Q, M]``.

    Example:
        >>> seq = SequenceWindows.of_batch(torch.tensor([[4, 5], [6, 0]]),
        ...                                torch.tensor([[True], [True]]))
        >>> window_hits(torch.tensor([5, 6, 9]), seq).tolist()
        [[True, False, False], [False, True, False]]
    """
    if neg_ids.dim() == 1:  # shared: each sequence against the M ids, then spread to its queries
        return sequence_hits(neg_ids, windows)[windows.rows]
    return _contains(_sequence_keys(windows.items), _keys(windows.rows, neg_ids))


def sequence_hits(neg_ids: Tensor, windows: SequenceWindows) -> Tensor:
    """``[B, M]`` true where a sequence's negative is one of its items.

    Args:
        neg_ids: ``[B, M]`` negatives of each sequence, or ``[M]`` shared by all.
        windows: the batch's ``B`` sequences.

    Returns:
        Boolean ``[B, M]``.

    Example:
        >>> seq = SequenceWindows.of_batch(torch.tensor([[4, 5], [6, 0]]),
        ...                                torch.tensor([[True], [True]]))
        >>> sequence_hits(torch.tensor([[5, 6], [6, 9]]), seq).tolist()
        [[True, False], [True, False]]
    """
    sequences = torch.arange(len(windows.items), device=windows.items.device)
    return _contains(_sequence_keys(windows.items), _keys(sequences, neg_ids))


def _keys(sequences: Tensor, ids: Tensor) -> Tensor:
    """``(sequence, id)`` pairs as one int64 key, the sequence in the high bits, for ``[R]``
    sequence numbers and their ``[R, M]`` (or shared ``[M]``) ids."""
    return (sequences[:, None] << _ID_BITS) + ids


def _sequence_keys(items: Tensor) -> Tensor:
    """The keys of every sequence's sorted items, laid end to end: one ascending array,
    searched once for all the pairs rather than copying a sequence's row for each query."""
    return _keys(torch.arange(len(items), device=items.device), items).flatten()


#: Bits an item id may take in :func:`window_hits`'s keys.
_ID_BITS = 32


def _contains(sorted_keys: Tensor, keys: Tensor) -> Tensor:
    """True where ``keys`` is in the ascending 1-d ``sorted_keys``."""
    at = torch.searchsorted(sorted_keys, keys).clamp_(max=len(sorted_keys) - 1)
    return sorted_keys[at] == keys
