"""The softmax over each target and the negatives drawn for its training sequence, shared by all
the sequence's positions (``negatives=outside_window``, ``negatives=per_sequence``): how SASRec+
(Klenitskiy & Vasilev, RecSys 2023) trains with 3,000 negatives.

Every position of a sequence is scored against its positive and the sequence's ``M`` columns,
each column's score raised by its log-weight (``-log(M q) + log c`` for ``c`` draws of an id from
a proposal ``q``; none for a uniform draw outside the sequence, whose constant correction
cancels), the positive counted exactly (:func:`window_softmax_loss`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from ..scoring import compute_dtype, softmax_weights_
from .full_softmax import check_scoring_inputs, gather_rows, without_autocast


class _SequenceNegativesLogSumExp(torch.autograd.Function):
    """``lse[b, l] = log sum_m exp(query[b, l] . negatives[b, m] + log_weights[b, m])`` over
    the valid negatives (``log_weights`` ``None``: zero).

    Forward turns the ``[B, L, M]`` scores into softmax weights in place and keeps them; backward
    reuses them in two batched products. Autograd through ``bmm`` and ``logsumexp`` would hold
    the scores, their shifted exponentials and a masked copy, and pass over each again in
    backward: at SASRec+ 3000's shape every such pass is 300 MB.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        query: Tensor,
        negatives: Tensor,
        log_weights: Tensor | None,
        valid: Tensor | None,
    ) -> Tensor:
        weights = torch.bmm(query, negatives.transpose(1, 2))
        if log_weights is not None:  # constants: the backward below is unchanged
            weights.add_(log_weights[:, None, :])
        if valid is not None:
            weights.masked_fill_(~valid[:, None, :], float("-inf"))
        lse = softmax_weights_(weights)
        ctx.save_for_backward(query, negatives, weights)
        return lse

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, grad_lse: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        query, negatives, weights = ctx.saved_tensors
        need_query, need_negatives = ctx.needs_input_grad[:2]
        # d loss / d scores = weights scaled by grad_lse per row: applied to the products' small
        # operands rather than to the [B, L, M] weights.
        grad_query = grad_lse[..., None] * torch.bmm(weights, negatives) if need_query else None
        grad_negatives = (
            torch.bmm(weights.transpose(1, 2), grad_lse[..., None] * query)
            if need_negatives
            else None
        )
        return grad_query, grad_negatives, None, None


@without_autocast
def window_softmax_loss(
    query: Tensor,
    item_emb: Tensor,
    targets: Tensor,
    positions: Tensor,
    neg_ids: Tensor,
    valid: Tensor | None = None,
    log_weights: Tensor | None = None,
) -> Tensor:
    """Per-query ``logsumexp(s(p), s(n_1..n_M) + log_weights) - s(p)`` with each sequence's own
    negatives.

    Args:
        query: ``[Q, D]`` queries (already divided by any temperature), the positions of
            ``positions`` in row-major order.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        positions: ``[B, L]`` boolean, true at the ``Q`` positions that are queries.
        neg_ids: ``[B, M]`` negatives of each sequence.
        valid: ``[B, M]`` mask of the negatives that count (``None``: all).
        log_weights: ``[B, M]`` added to the negatives' scores, e.g. ``-log(M q)`` for draws
            from a proposal ``q`` (``None``: none, a uniform draw's constant left out).

    Returns:
        ``[Q]`` losses.

    Raises:
        ValueError: if ``positions`` does not hold ``Q`` queries or ``neg_ids`` has not one row
            per sequence.

    Example:
        >>> query, item_emb = torch.zeros(2, 2), torch.zeros(5, 2)
        >>> loss = window_softmax_loss(query, item_emb, torch.tensor([1, 2]),
        ...                            torch.tensor([[True, True]]), torch.tensor([[3, 4]]))
        >>> [round(value, 4) for value in loss.tolist()]  # log 3 each
        [1.0986, 1.0986]
    """
    check_scoring_inputs(query, item_emb, targets)
    if positions.dtype != torch.bool or int(positions.sum()) != len(query):
        raise ValueError(f"positions must be a boolean mask of the {len(query)} queries")
    if neg_ids.dim() != 2 or neg_ids.shape[0] != positions.shape[0]:
        raise ValueError(
            f"neg_ids must have shape [{positions.shape[0]}, M], got {tuple(neg_ids.shape)}"
        )
    if log_weights is not None and log_weights.shape != neg_ids.shape:
        raise ValueError(
            f"log_weights must have the shape of neg_ids {tuple(neg_ids.shape)}, got "
            f"{tuple(log_weights.shape)}"
        )
    dtype = compute_dtype(query, item_emb)
    target_emb, neg_emb = gather_rows(item_emb, [targets, neg_ids], dtype)
    query = query.to(dtype)
    # Scored per sequence ([B, L, M]) rather than per query: a query's negatives are its
    # sequence's, and gathering them per query would copy M rows for every position.
    padded = query.new_zeros(*positions.shape, query.shape[1])
    padded[positions] = query
    if valid is not None and bool(valid.all()):
        valid = None
    if log_weights is not None:
        log_weights = log_weights.to(dtype)
    negative = _SequenceNegativesLogSumExp.apply(padded, neg_emb, log_weights, valid)[positions]
    positive = (query * target_emb).sum(dim=-1)
    return torch.logaddexp(positive, negative) - positive
