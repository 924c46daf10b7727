"""Negatives outside the training sequence: the softmax over the items a sequence does not hold.

A training window's other items are items its user did interact with; as negatives of the
window's queries they push down what the user chose at other positions. SASRec's own negatives,
SASRec+'s 3,000 per user and RecBole's negative sampling all come from outside the user's items.
With ``negatives.exclude_window=true`` each query's normaliser leaves out every item of its
training sequence (its inputs and targets, padding aside) except its own target:

    loss(q) = log( exp(s(t)) + sum_{i not in W(q)} exp(s(i)) ) - s(t).

A sampled loss keeps its draws and their ``log q`` and masks the negatives that fall in the
window (the strategy marks them: :func:`~recsys_midx.negatives.window_hits`), so its
logQ-corrected sum estimates the sum over the items outside it. The exact loss removes the
window's mass from the catalog's normaliser (:func:`full_softmax_loss_outside_windows`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..negatives import SequenceWindows
from ..scoring import catalog_logsumexp, compute_dtype
from .full_softmax import check_scoring_inputs, without_autocast


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
