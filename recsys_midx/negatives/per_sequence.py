"""``negatives=per_sequence``: ``M`` ids per training sequence from the sampler's proposal at
the mean of the sequence's queries, shared by all its positions (MIDX drawn once per user).

Each draw is weighted by ``1 / (M q)``, the draws that fall in the sequence are dropped and the
positive is counted exactly: for every position the weighted sum estimates the mass of the items
outside the sequence, as ``negatives.exclude_window`` does per query. A sequence's draws all come
from one proposal, so a repeated draw is scored once, its weight multiplied by its count
(:func:`merge_repeated_draws`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from ..protocols import NegativeSampler
from .base import Negatives, QueryBatch, Scope, Strategy
from .windows import SequenceWindows, sequence_hits


@torch.no_grad()
def draw_from_proposal(
    sampler: NegativeSampler,
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
        sampler: the proposal, built.
        query: ``[Q, D]`` scaled queries, at ``windows.positions`` in row-major order.
        targets: ``[Q]`` target ids, shown to the sampler first (``observe_targets``).
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


class PerSequence(Strategy):
    """``M = sampler.num_negatives`` ids per training sequence from the proposal at the mean of
    its queries (:func:`draw_from_proposal`), the repeats merged (:func:`merge_repeated_draws`):
    ``[B, U]`` ids with their log-weights ``-log(M q) + log c``, the columns without a valid
    draw excluded, the positive counted exactly.

    Example:
        >>> from recsys_midx.negatives import QueryBatch
        >>> from recsys_midx.samplers import UniformSampler
        >>> batch = QueryBatch(torch.randn(2, 8), torch.tensor([2, 3]),
        ...                    windows=torch.tensor([[1, 2, 3]]),
        ...                    positions=torch.tensor([[True, True]]))
        >>> drawn = PerSequence()(batch, UniformSampler(100, 10))
        >>> drawn.scope, drawn.ids.shape[0], drawn.log_weights.shape == drawn.ids.shape
        ('sequence', 1, True)
    """

    name: ClassVar[str] = "per_sequence"
    scope: ClassVar[Scope] = "sequence"
    uses_sampler: ClassVar[bool] = True
    needs_windows: ClassVar[bool] = True

    def forward(
        self, batch: QueryBatch, sampler: NegativeSampler | None, with_positive_log_q: bool = True
    ) -> Negatives:
        """The batch's negatives, drawn once per sequence from ``sampler``.

        Raises:
            ValueError: without a sampler, or without the batch's windows.
        """
        sampler = self.proposal(sampler)
        sequences = batch.sequences(f"negatives={self.name}")
        ids, log_weights, valid = merge_repeated_draws(
            *draw_from_proposal(sampler, batch.queries, batch.positives, sequences)
        )
        return Negatives(
            "sequence", ids, log_weights=log_weights, excluded=~valid, sequences=sequences
        )
