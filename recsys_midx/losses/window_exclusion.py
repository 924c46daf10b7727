"""Negatives outside the training sequence: the softmax over the items a sequence does not hold.

A training window's other items are items its user did interact with; as negatives of the
window's queries they push down what the user chose at other positions. SASRec's own negatives,
SASRec+'s 3,000 per user and RecBole's negative sampling all come from outside the user's items.
With ``negatives.exclude_window=true`` each query's normaliser leaves out every item of its
training sequence (its inputs and targets, padding aside) except its own target:

    loss(q) = log( exp(s(t)) + sum_{i not in W(q)} exp(s(i)) ) - s(t).

A sampled loss keeps its draws and their ``log q`` and masks the negatives that fall in the
window (the strategy marks them: :func:`~recsys_midx.negatives.window_hits`), so its
logQ-corrected sum estimates the sum over the items outside it. The exact loss masks the
window's items inside the catalog's chunked normaliser and adds the target back
(:func:`full_softmax_loss_outside_windows`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..negatives import SequenceWindows
from ..scoring import ExcludedItems, catalog_logsumexp, compute_dtype
from .full_softmax import check_scoring_inputs, without_autocast


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

    ``loss[q] = logaddexp(lse_out[q], s(t)) - s(t)``, with ``lse_out`` the normaliser of the
    items outside the sequence (:func:`~recsys_midx.scoring.catalog_logsumexp`, chunked, the
    sequence's items masked inside each block of scores: it costs what the plain exact softmax
    costs, one mask per block) and the target, itself one of the sequence's items, added back.
    Nothing is subtracted, so the loss stays a cross-entropy (``>= 0``) however much of the mass
    the window holds; a sequence that holds the whole catalog gives ``0``.

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
    # Every item of the sequence, the target too, out of the catalog's sum; the target back in.
    outside = catalog_logsumexp(
        query, item_emb, chunk_size, ExcludedItems(windows.items, windows.rows)
    )
    target_scores = (query * item_emb[targets]).sum(dim=1)
    return torch.logaddexp(outside, target_scores) - target_scores
