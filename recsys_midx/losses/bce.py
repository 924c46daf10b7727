"""Binary cross-entropy on sampled negatives: each position's positive against its negatives,
every item scored on its own through a sigmoid (SASRec's original objective).

No normaliser is estimated, so the proposal's ``log q`` plays no part: the negatives are
whatever the strategy draws, per query or shared by the batch.

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
from ..negatives import Negatives, Scope
from ..scoring import compute_dtype
from .full_softmax import (
    check_scoring_inputs,
    gather_rows,
    picks_from_catalog,
    score_candidates,
    without_autocast,
)
from .sampled_softmax import check_excluded, score_negatives
from .softmax import check_scope


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
            (``negatives.exclude_window``); ``None``: none.
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
    """Binary cross-entropy of each target against the negatives drawn for it.

    The negatives come per query or shared by the batch (``negatives=per_query`` or
    ``negatives=shared``, with ``negatives.exclude_window`` those in the query's training
    sequence left out, as SASRec's own training draws them from outside the user's items),
    without any logQ correction: the sigmoid scores every item on its own, so there is no
    normaliser to estimate. The loss is the batch mean of :func:`binary_cross_entropy_loss`.

    Args:
        prior_offset: add :func:`prior_score` of the positive's weight and the ``M`` negatives
            per positive to every score, so that scores near zero are the best constant
            prediction (0 with one negative and weight 1). The model's own scores, which
            rankings use, leave it out; their calibrated probability is ``sigmoid(s + offset)``.

    Raises:
        ValueError: when called with negatives it does not score (the whole catalog, or drawn
            per sequence).

    Example:
        >>> output, targets = DotHead()(torch.randn(4, 8)), torch.tensor([1, 2, 3, 4])
        >>> negatives = Negatives("query", torch.tensor([[5], [6], [7], [8]]))  # one each
        >>> BCELoss()(output, targets, torch.randn(11, 8), negatives).shape
        torch.Size([])
    """

    #: The objective's name in messages, as the ``loss`` config group spells it.
    name: ClassVar[str] = "bce"
    #: A sigmoid of the plain dot product.
    accepted_heads: ClassVar[tuple[type[DotHead], ...]] = (DotHead,)
    #: Trains on drawn negatives, per query or shared by the batch.
    scopes: ClassVar[frozenset[Scope]] = frozenset({"query", "batch"})
    #: No normaliser: the positives' log q is never used.
    corrects_by_log_q: ClassVar[bool] = False
    exact_on_catalog: ClassVar[bool] = False
    refreshable: ClassVar[bool] = False

    def __init__(self, prior_offset: bool = True) -> None:
        super().__init__()
        self.prior_offset = bool(prior_offset)

    def positive_weight(self, num_negatives: int, num_items: int) -> float:
        """The weight of the positive term for ``num_negatives`` per positive from
        ``num_items``: 1 for plain binary cross-entropy."""
        return 1.0

    def forward(
        self, output: HeadOutput, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Scalar loss of a batch: ``output``'s ``[Q, D]`` scaled queries, ``[Q]`` targets, the
        ``[N+1, D]`` item table and the negatives drawn per query or for the batch (those
        ``excluded`` left out)."""
        check_scope(self, negatives)
        num_drawn = negatives.num_drawn
        weight = self.positive_weight(num_drawn, item_emb.shape[0] - 1)
        offset = prior_score(weight, num_drawn) if self.prior_offset else 0.0
        return binary_cross_entropy_loss(
            output.queries, item_emb, targets, negatives.ids, weight, negatives.excluded, offset
        ).mean()

    def extra_repr(self) -> str:
        return f"prior_offset={self.prior_offset}"
