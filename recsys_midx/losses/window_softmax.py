"""Sampled softmax with negatives drawn per training sequence, outside it, shared by its
positions: how SASRec+ (Klenitskiy & Vasilev, RecSys 2023) trains with 3,000 negatives.

Each sequence of the batch (a user's window in ``train_samples=last_window``) draws ``M`` ids;
every position of the sequence is scored against its positive and those ``M`` ids. By default
(``negatives="outside"``) they are drawn uniformly without replacement among the items the
sequence does not hold: the proposal is the same for every negative, so the logQ correction is a
constant shift and is left out. With ``negatives="proposal"`` they are drawn from the sampler's
proposal at the mean of the sequence's queries (:func:`draw_from_proposal`), with replacement,
each weighted by ``1 / (M q)`` and the draws that fall in the sequence dropped: the positive is
counted exactly and the weighted sum estimates, for every position, the mass of the items
outside the sequence, as ``loss.exclude_window`` does per query. A repeated draw is scored once,
its weight multiplied by its count (:func:`merge_repeated_draws`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from ..heads import DotHead, HeadOutput
from ..samplers import Sampler
from ..scoring import compute_dtype, softmax_weights_
from .full_softmax import check_scoring_inputs, gather_rows, without_autocast
from .window_exclusion import SequenceWindows, sequence_hits


@torch.no_grad()
def draw_outside_windows(
    windows: Tensor, num_items: int, num_negatives: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """``M`` ids per sequence, uniformly without replacement among the items not in it.

    Random keys for every item, the sequence's own items (and padding id 0) keyed last: the
    ``M`` smallest keys are a uniform draw without replacement from the rest.

    Args:
        windows: ``[B, W]`` item ids of each sequence, padded with ``0``.
        num_items: ``N``.
        num_negatives: ``M``.
        generator: random generator on the device of ``windows`` (``None``: the global one).

    Returns:
        ``[B, M]`` ids in ``1..N``, and a ``[B, M]`` mask of the valid ones (false where a
        sequence holds more than ``N - M`` items and too few are left).

    Example:
        >>> ids, valid = draw_outside_windows(torch.tensor([[1, 2, 0]]), 5, 3)
        >>> sorted(ids[0].tolist()), valid.all().item()
        ([3, 4, 5], True)
    """
    keys = torch.rand(len(windows), num_items + 1, device=windows.device, generator=generator)
    keys[:, 0] = float("inf")
    keys.scatter_(1, windows, float("inf"))
    chosen, ids = keys.topk(min(num_negatives, num_items), dim=1, largest=False)
    return ids, torch.isfinite(chosen)


@torch.no_grad()
def draw_from_proposal(
    sampler: Sampler,
    query: Tensor,
    targets: Tensor,
    windows: SequenceWindows,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``sampler.num_negatives`` ids per sequence from the proposal at its mean query.

    One draw per sequence rather than per query: the sampler draws for ``B`` queries instead of
    ``Q``. The mean of the sequence's (scaled) queries stands for all of them; any proposal
    that gives every item outside the sequence a positive ``q`` keeps the estimate unbiased for
    each position, and one near each position's softmax keeps its variance low.

    Args:
        sampler: a non-exhaustive sampler, built.
        query: ``[Q, D]`` scaled queries, at ``windows.positions`` in row-major order.
        targets: ``[Q]`` target ids, shown to the sampler first (:meth:`Sampler.observe_targets`).
        windows: the batch's sequences and the sequence of each query.
        generator: random generator on the device of ``query`` (``None``: the global one).

    Returns:
        ``[B, M]`` ids, their ``[B, M]`` log-weights ``-log(M q)``, and the ``[B, M]`` mask of
        the draws outside their sequence.

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> seq = SequenceWindows.of_batch(torch.tensor([[1, 2, 3]]), torch.tensor([[True, True]]))
        >>> ids, log_weights, valid = draw_from_proposal(
        ...     UniformSampler(10, 5), torch.randn(2, 4), torch.tensor([2, 3]), seq)
        >>> ids.shape, round(log_weights[0, 0].item(), 4)  # -log(5 / 10)
        (torch.Size([1, 5]), 0.6931)
        >>> bool((valid == (ids > 3)).all())
        True
    """
    counts = windows.positions.sum(dim=1, keepdim=True).clamp(min=1)
    sums = query.new_zeros(len(windows.positions), query.shape[1])
    mean_query = sums.index_add_(0, windows.rows, query.detach()) / counts
    sampler.observe_targets(targets)
    ids, log_q = sampler.sample(mean_query, generator=generator)
    log_weights = -(log_q + math.log(ids.shape[1]))
    return ids, log_weights, ~sequence_hits(ids, windows)


@torch.no_grad()
def merge_repeated_draws(
    ids: Tensor, log_weights: Tensor, valid: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Each sequence's distinct valid draws once, their log-weight raised by the log of how
    often they were drawn.

    A sequence's draws come from one proposal, so the repeats of an id share its weight ``w``,
    and ``c`` of them add ``c * exp(s + w) = exp(s + w + log c)`` to each position's sum: the
    loss and its gradients are those of the ``M`` draws, scored against ``U`` ids, the most
    distinct valid draws any sequence of the batch has. A proposal close to the sequence's
    softmax repeats its heavy items, and draws inside the sequence are dropped here rather
    than scored and masked.

    Args:
        ids: ``[B, M]`` draws of each sequence.
        log_weights: ``[B, M]`` their log-weights, equal for equal ids of a row.
        valid: ``[B, M]`` mask of the draws that count.

    Returns:
        ``[B, U]`` distinct ids (``0`` after a row's last), their log-weights, and the mask of
        the columns that hold one.

    Example:
        >>> ids, log_weights, valid = merge_repeated_draws(
        ...     torch.tensor([[3, 1, 3, 5]]), torch.zeros(1, 4),
        ...     torch.tensor([[True, True, True, False]]))
        >>> ids.tolist(), [round(w, 4) for w in log_weights[0].tolist()], valid.tolist()
        ([[1, 3]], [0.0, 0.6931], [[True, True]])
    """
    dropped = torch.iinfo(ids.dtype).max  # sorts after every id
    keys, order = ids.masked_fill(~valid, dropped).sort(dim=1)
    kept = keys != dropped
    first = kept.clone()
    first[:, 1:] &= keys[:, 1:] != keys[:, :-1]
    width = max(int(first.sum(dim=1).max()), 1)
    # Each kept draw goes to its id's column, the dropped ones to a spare last column.
    column = (first.cumsum(dim=1) - 1).masked_fill_(~kept, width)
    shape = (len(ids), width + 1)
    merged_ids = ids.new_zeros(shape).scatter_(1, column, keys.masked_fill(~kept, 0))
    merged = log_weights.new_zeros(shape).scatter_(1, column, log_weights.gather(1, order))
    counts = log_weights.new_zeros(shape).scatter_add_(1, column, torch.ones_like(log_weights))
    merged.add_(counts.clamp(min=1).log_())
    return merged_ids[:, :width], merged[:, :width], counts[:, :width] > 0


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


class WindowSoftmaxLoss(torch.nn.Module):
    """Softmax cross-entropy over each target and ``sampler.num_negatives`` negatives drawn per
    training sequence, shared by all the sequence's positions (:func:`window_softmax_loss`).

    The training step hands it each batch's sequences (``windows``: inputs and targets) and
    which positions are queries (``positions``), as it does for every objective that declares
    ``per_sequence``.

    Args:
        negatives: ``"outside"``: uniformly without replacement among the items outside the
            sequence (:func:`draw_outside_windows`), without logQ correction; only
            ``sampler.num_negatives`` and ``sampler.num_items`` are read, the sampler draws
            nothing. ``"proposal"``: from the sampler's proposal at the sequence's mean query
            (:func:`draw_from_proposal`), weighted by ``1 / (M q)``, the draws in the sequence
            dropped, the repeats scored once (:func:`merge_repeated_draws`) and the positive
            counted exactly.

    Raises:
        ValueError: if ``negatives`` is neither.

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> positions = torch.tensor([[False, True, True], [True, True, True]])
        >>> loss = WindowSoftmaxLoss()(DotHead()(torch.randn(5, 8)), torch.tensor([2, 3, 5, 6, 7]),
        ...                            torch.randn(21, 8), UniformSampler(20, 4),
        ...                            windows=torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]),
        ...                            positions=positions)
        >>> loss.shape
        torch.Size([])
    """

    #: The objective's name in messages, as the ``loss`` config group spells it.
    name: ClassVar[str] = "window_softmax"
    #: A softmax of the plain dot product.
    accepted_heads: ClassVar[tuple[type[DotHead], ...]] = (DotHead,)
    refreshable: ClassVar[bool] = False
    #: Trains on drawn negatives: an exhaustive sampler is refused.
    needs_negatives: ClassVar[bool] = True
    #: Called with the batch's sequences (``windows``) and query ``positions``.
    per_sequence: ClassVar[bool] = True
    #: The values of ``negatives``.
    draws: ClassVar[tuple[str, ...]] = ("outside", "proposal")

    def __init__(self, negatives: Literal["outside", "proposal"] = "outside") -> None:
        super().__init__()
        self.check_settings({"negatives": negatives})
        self.negatives = negatives

    @classmethod
    def check_settings(cls, settings: Mapping[str, Any]) -> None:
        """Check ``negatives`` in ``settings`` (a loss config or the constructor's arguments).

        Raises:
            ValueError: ``"negatives=VALUE: ..."`` when it is not one of :attr:`draws`.

        Example:
            >>> WindowSoftmaxLoss.check_settings({"negatives": "inside"})
            Traceback (most recent call last):
            ...
            ValueError: negatives=inside: choose one of outside, proposal
        """
        negatives = settings.get("negatives")
        if negatives not in cls.draws:
            raise ValueError(f"negatives={negatives}: choose one of {', '.join(cls.draws)}")

    def forward(
        self,
        output: HeadOutput,
        targets: Tensor,
        item_emb: Tensor,
        sampler: Sampler,
        *,
        windows: Tensor,
        positions: Tensor,
    ) -> Tensor:
        """Scalar loss of a batch.

        Args:
            output: the head's output, ``[Q, D]`` scaled queries.
            targets: ``[Q]`` target ids.
            item_emb: ``[N+1, D]`` item table, row 0 padding.
            sampler: gives ``num_negatives`` and ``num_items``, and draws with
                ``negatives="proposal"``.
            windows: ``[B, W]`` items of each sequence (padded with ``0``), never counted as
                its negatives.
            positions: ``[B, L]`` boolean, true at the queries' positions (row-major).

        Returns:
            Scalar loss.
        """
        if self.negatives == "outside":
            neg_ids, valid = draw_outside_windows(windows, sampler.num_items, sampler.num_negatives)
            log_weights = None
        else:
            sequences = SequenceWindows.of_batch(windows, positions)
            neg_ids, log_weights, valid = merge_repeated_draws(
                *draw_from_proposal(sampler, output.queries, targets, sequences)
            )
        return window_softmax_loss(
            output.queries, item_emb, targets, positions, neg_ids, valid, log_weights
        ).mean()
