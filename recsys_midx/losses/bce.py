"""Binary cross-entropy on sampled negatives: each position's positive against its negatives,
every item scored on its own through a sigmoid (SASRec's original objective).

No normaliser is estimated, so the proposal's ``log q`` plays no part: the negatives are
whatever the sampler draws, per query or shared by the batch.

A dot product has no bias, so a model whose scores start near zero gives every item the
probability 1/2 and spends its first steps pushing every score down; with hundreds of negatives
per positive that push, far larger than any item's own signal, turns the encoder's query into one
vector for every sequence, and training stays at the popularity ranking. The prior offset
(:func:`prior_score`, added to every score inside the loss, as a classifier's output bias is
started at the class prior) makes a zero score the best constant prediction instead.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ..heads import DotHead, HeadOutput
from ..samplers import Sampler
from ..scoring import compute_dtype
from .full_softmax import (
    check_scoring_inputs,
    gather_rows,
    picks_from_catalog,
    score_candidates,
    without_autocast,
)
from .negatives import draw_negatives, draw_shared_negatives
from .sampled_softmax import check_excluded, score_negatives
from .window_exclusion import batch_sequences, window_hits


def prior_score(positive_weight: float, num_negatives: int) -> float:
    """``log(w / M)``: the constant score that minimises ``w softplus(-s) + M softplus(s)``, the
    loss of a positive with weight ``w`` and its ``M`` negatives all scored ``s``.

    Example:
        >>> round(prior_score(1.0, 256), 4)  # sigmoid(offset) = 1 / (M + 1)
        -5.5452
    """
    return math.log(positive_weight / num_negatives)


@without_autocast
def binary_cross_entropy_loss(
    query: Tensor,
    item_emb: Tensor,
    targets: Tensor,
    neg_ids: Tensor,
    positive_weight: float = 1.0,
    excluded: Tensor | None = None,
    score_offset: float = 0.0,
) -> Tensor:
    """Per-query ``w * softplus(-s(p)) + sum_j softplus(s(n_j))``: ``-w log sigmoid(s(p)) -
    sum_j log(1 - sigmoid(s(n_j)))``, with ``s = z . v + score_offset``.

    Negatives equal to the query's own target (accidental hits) are left out: they would push
    the positive down. Computed in float32 (float64 inputs stay float64).

    Args:
        query: ``[Q, D]`` query vectors (already divided by any temperature).
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        neg_ids: ``[Q, M]`` negative ids in ``1..N``, or ``[M]`` shared by all queries.
        positive_weight: ``w``, the positive term's weight (gBCE's ``beta``; 1 for plain BCE).
        excluded: ``[Q, M]`` true at negatives left out besides the accidental hits
            (``loss.exclude_window``); ``None``: none.
        score_offset: a constant added to every score (:func:`prior_score`); it moves no
            ranking.

    Returns:
        ``[Q]`` losses.

    Raises:
        ValueError: on malformed shapes or ids.

    Example:
        >>> query, item_emb = torch.zeros(1, 2), torch.zeros(4, 2)
        >>> loss = binary_cross_entropy_loss(query, item_emb, torch.tensor([1]),
        ...                                  torch.tensor([[2, 3]]))
        >>> round(loss.item(), 4)  # three times log 2
        2.0794
    """
    check_scoring_inputs(query, item_emb, targets)
    if neg_ids.dim() not in (1, 2) or (neg_ids.dim() == 2 and neg_ids.shape[0] != len(targets)):
        raise ValueError(
            f"neg_ids must have shape [{len(targets)}, M], or [M] when shared by the batch, "
            f"got {tuple(neg_ids.shape)}"
        )
    check_excluded(neg_ids, excluded, len(query))
    dtype = compute_dtype(query, item_emb)
    query = query.to(dtype)
    if neg_ids.dim() == 2 and picks_from_catalog(query, item_emb, 1 + neg_ids.shape[1]):
        candidates = torch.cat([targets[:, None], neg_ids], dim=1)
        positive, negative = score_candidates(query, item_emb, candidates, dtype).split(
            [1, neg_ids.shape[1]], dim=1
        )
        positive = positive[:, 0]
    else:
        target_emb, neg_emb = gather_rows(item_emb, [targets, neg_ids], dtype)
        positive = (query * target_emb).sum(dim=-1)
        negative = score_negatives(query, neg_emb)
    if score_offset:
        positive, negative = positive + score_offset, negative + score_offset
    negative = F.softplus(negative)
    masked = neg_ids == targets[:, None]
    if excluded is not None:
        masked = masked | excluded
    negative = negative.masked_fill(masked, 0.0)
    return positive_weight * F.softplus(-positive) + negative.sum(dim=-1)


class BCELoss(torch.nn.Module):
    """Binary cross-entropy of each target against ``sampler.num_negatives`` sampled negatives.

    The negatives come from the sampler (per query, or one set shared by the batch with
    ``shared_negatives``) without any logQ correction: the sigmoid scores every item on its
    own, so there is no normaliser to estimate. The loss is the batch mean of
    :func:`binary_cross_entropy_loss`.

    Args:
        shared_negatives: draw one set of ``sampler.num_negatives`` negatives for the whole
            batch instead of one per query.
        exclude_window: leave out the negatives that are items of the query's training
            sequence (:mod:`~recsys_midx.losses.window_exclusion`), as SASRec's own training
            draws them from outside the user's items: the loss is then called with the batch's
            ``windows`` and query ``positions`` (``per_sequence``).
        prior_offset: add :func:`prior_score` of the positive's weight and
            ``sampler.num_negatives`` to every score, so that scores near zero are the best
            constant prediction (0 with one negative and weight 1). The model's own scores,
            which rankings use, leave it out; their calibrated probability is
            ``sigmoid(s + offset)``.

    Raises:
        ValueError: when called with an exhaustive sampler (``sampler=full``): it draws no
            negatives; with ``exclude_window``, when called without the sequences.

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> loss = BCELoss()(DotHead()(torch.randn(4, 8)), torch.tensor([1, 2, 3, 4]),
        ...                  torch.randn(11, 8), UniformSampler(10, 1))
        >>> loss.shape
        torch.Size([])
    """

    #: The objective's name in messages, as the ``loss`` config group spells it.
    name: ClassVar[str] = "bce"
    #: A sigmoid of the plain dot product.
    accepted_heads: ClassVar[tuple[type[DotHead], ...]] = (DotHead,)
    refreshable: ClassVar[bool] = False
    #: Trains on the sampler's negatives: an exhaustive sampler is refused.
    needs_negatives: ClassVar[bool] = True
    #: Called with the batch's training sequences (set per instance by ``exclude_window``).
    per_sequence: bool = False

    def __init__(
        self,
        shared_negatives: bool = False,
        exclude_window: bool = False,
        prior_offset: bool = True,
    ) -> None:
        super().__init__()
        self.shared_negatives = bool(shared_negatives)
        self.exclude_window = self.per_sequence = bool(exclude_window)
        self.prior_offset = bool(prior_offset)

    def positive_weight(self, sampler: Sampler) -> float:
        """The weight of the positive term: 1 for plain binary cross-entropy."""
        return 1.0

    def forward(
        self,
        output: HeadOutput,
        targets: Tensor,
        item_emb: Tensor,
        sampler: Sampler,
        *,
        windows: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Scalar loss of a batch: ``output``'s ``[Q, D]`` scaled queries, ``[Q]`` targets, the
        ``[N+1, D]`` item table and the sampler that draws the negatives; with
        ``exclude_window`` also the ``[B, W]`` training sequences and ``[B, L]`` query
        positions."""
        if sampler.exhaustive:
            raise ValueError(f"loss={self.name} needs sampled negatives, not sampler=full")
        sequences = batch_sequences(self.name, windows, positions) if self.exclude_window else None
        draw = draw_shared_negatives if self.shared_negatives else draw_negatives
        # Exact positives: the positives' log q is never used, so it is not computed.
        negatives = draw(sampler, output.queries, targets, True)
        excluded = None if sequences is None else window_hits(negatives.ids, sequences)
        weight = self.positive_weight(sampler)
        offset = prior_score(weight, sampler.num_negatives) if self.prior_offset else 0.0
        return binary_cross_entropy_loss(
            output.queries, item_emb, targets, negatives.ids, weight, excluded, offset
        ).mean()

    def extra_repr(self) -> str:
        return (
            f"shared_negatives={self.shared_negatives}, exclude_window={self.exclude_window}, "
            f"prior_offset={self.prior_offset}"
        )
