"""Negatives outside the training sequence: the softmax over the items a sequence does not hold.

A training window's other items are items its user did interact with; as negatives of the
window's queries they push down what the user chose at other positions. SASRec's own negatives,
SASRec+'s 3,000 per user and RecBole's negative sampling all come from outside the user's items.
With ``loss.exclude_window=true`` each query's normaliser leaves out every item of its training
sequence (its inputs and targets, padding aside) except its own target:

    loss(q) = log( exp(s(t)) + sum_{i not in W(q)} exp(s(i)) ) - s(t).

A sampled loss keeps its draws and their ``log q`` and masks the negatives that fall in the
window (:func:`window_hits`), so its logQ-corrected sum estimates the sum over the items outside
it. The exact loss removes the window's mass from the catalog's normaliser
(:func:`full_softmax_loss_outside_windows`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..scoring import catalog_logsumexp, compute_dtype
from .full_softmax import check_scoring_inputs, without_autocast


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


def batch_sequences(
    loss_name: str, windows: Tensor | None, positions: Tensor | None
) -> SequenceWindows:
    """The sequences a loss with ``exclude_window`` was called with.

    Raises:
        ValueError: naming ``loss_name`` when the training step did not give them.
    """
    if windows is None or positions is None:
        raise ValueError(
            f"loss={loss_name} with loss.exclude_window=true needs each batch's training "
            "sequences (windows=, positions=): it trains sequences (task=seqrec)"
        )
    return SequenceWindows.of_batch(windows, positions)


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


def _window_log_mass(
    query: Tensor, item_emb: Tensor, targets: Tensor, windows: SequenceWindows
) -> Tensor:
    """``[Q]`` logsumexp of the scores of each query's sequence items other than its target
    (each distinct item once, padding aside), ``-inf`` where there is none."""
    items = windows.items
    # One product per sequence ([B, L, W]) rather than a [Q, W, D] copy of the rows per query.
    padded = query.new_zeros(*windows.positions.shape, query.shape[1])
    padded[windows.positions] = query
    scores = torch.bmm(padded, item_emb[items].transpose(1, 2))[windows.positions]
    repeated = torch.zeros_like(items, dtype=torch.bool)
    repeated[:, 1:] = items[:, 1:] == items[:, :-1]
    left_out = (repeated | (items == 0))[windows.rows] | (items[windows.rows] == targets[:, None])
    return _safe_logsumexp(scores.masked_fill(left_out, float("-inf")))


def _safe_logsumexp(scores: Tensor) -> Tensor:
    """``logsumexp`` over the last dimension whose gradient stays finite (zero) on rows that
    are all ``-inf``, where :func:`torch.logsumexp`'s is NaN."""
    top = scores.amax(dim=-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = (scores - top).exp().sum(dim=-1)
    some = total > 0
    lse = top[..., 0] + torch.where(some, total, torch.ones_like(total)).log()
    return torch.where(some, lse, torch.full_like(lse, float("-inf")))


@without_autocast
def full_softmax_loss_outside_windows(
    query: Tensor,
    item_emb: Tensor,
    targets: Tensor,
    windows: SequenceWindows,
    chunk_size: int = 32768,
) -> Tensor:
    """Per-query exact cross-entropy of the softmax over the target and the items outside the
    query's training sequence.

    ``loss[q] = log(exp(lse[q]) - exp(lse_W[q])) - s(t)``, with ``lse`` the catalog's normaliser
    (:func:`~recsys_midx.scoring.catalog_logsumexp`, chunked) and ``lse_W`` that of the
    sequence's distinct items other than the target. The difference is at least ``exp(s(t))``;
    where rounding puts it lower (the window holding all but a negligible part of the mass) the
    loss is clamped at ``0``, its value in exact arithmetic to within that rounding.

    Args:
        query: ``[Q, D]`` query vectors (already divided by any temperature).
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        windows: the batch's sequences and the sequence of each query.
        chunk_size: items scored at once for the catalog's normaliser.

    Returns:
        ``[Q]`` losses (float32, or float64 for float64 inputs).

    Raises:
        ValueError: on malformed shapes or targets outside ``1..N``.

    Example:
        >>> query, item_emb = torch.randn(2, 4).double(), torch.randn(6, 4).double()
        >>> seq = SequenceWindows.of_batch(torch.tensor([[1, 2, 3]]), torch.tensor([[True, True]]))
        >>> loss = full_softmax_loss_outside_windows(query, item_emb, torch.tensor([2, 3]), seq)
        >>> kept = [[2, 4, 5], [3, 4, 5]]  # each target and the items outside {1, 2, 3}
        >>> reference = [torch.logsumexp(q @ item_emb[k].T, 0) - q @ item_emb[k[0]]
        ...              for q, k in zip(query, kept)]
        >>> torch.allclose(loss, torch.stack(reference), atol=1e-5)
        True
    """
    check_scoring_inputs(query, item_emb, targets)
    if len(windows.rows) != len(query):
        raise ValueError(f"windows hold {len(windows.rows)} queries, got {len(query)}")
    dtype = compute_dtype(query, item_emb)
    query, item_emb = query.to(dtype), item_emb.to(dtype)
    lse = catalog_logsumexp(query, item_emb, chunk_size)
    target_scores = (query * item_emb[targets]).sum(dim=1)
    # The share of the catalog's mass outside the window: 1 - exp(lse_W - lse) > 0 in exact
    # arithmetic. Where rounding makes it 0, the unused branch's log stays finite, so that no
    # NaN reaches the gradient.
    room = -torch.expm1(_window_log_mass(query, item_emb, targets, windows) - lse)
    positive = room > 0
    kept = lse + torch.where(positive, room, torch.ones_like(room)).log()
    kept = torch.where(positive, kept, target_scores)
    return (kept - target_scores).clamp(min=0.0)
