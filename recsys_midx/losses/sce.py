"""Scalable Cross-Entropy (Mezentsev et al., "Scalable Cross-Entropy Loss for Sequential
Recommendations with Large Item Catalogs", RecSys 2024).

Random directions ("buckets") each gather the queries and the items that score highest with
them; each gathered query's cross-entropy runs over its positive and its bucket's items. Items
near a query in the embedding space tend to share its buckets, so the negatives are hard ones
found without scoring the catalog for every query: the cost is ``B * (Q + N)`` projection scores
and ``B * bucket_queries * bucket_items`` logits.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from ..heads import DotHead, HeadOutput
from ..negatives import Negatives, Scope
from ..scoring import compute_dtype
from .full_softmax import check_scoring_inputs, gather_rows, without_autocast
from .softmax import check_scope


@torch.no_grad()
def bucket_members(
    query: Tensor, item_emb: Tensor, centres: Tensor, bucket_queries: int, bucket_items: int
) -> tuple[Tensor, Tensor]:
    """The queries and the items that score highest with each bucket centre.

    Args:
        query: ``[Q, D]`` queries.
        item_emb: ``[N+1, D]`` item table, row 0 padding (never a member).
        centres: ``[B, D]`` bucket directions.
        bucket_queries: queries per bucket (at most ``Q`` are taken).
        bucket_items: items per bucket (at most ``N`` are taken).

    Returns:
        ``[B, bucket_queries]`` query rows and ``[B, bucket_items]`` item ids in ``1..N``.
    """
    centres = centres.to(query.dtype)
    query_rows = (centres @ query.T).topk(min(bucket_queries, len(query)), dim=1).indices
    item_scores = centres @ item_emb[1:].to(query.dtype).T
    item_ids = item_scores.topk(min(bucket_items, item_scores.shape[1]), dim=1).indices + 1
    return query_rows, item_ids


@without_autocast
def bucketed_cross_entropy_loss(
    query: Tensor, item_emb: Tensor, targets: Tensor, query_rows: Tensor, item_ids: Tensor
) -> tuple[Tensor, Tensor]:
    """Each query's cross-entropy over its positive and the items of a bucket it belongs to,
    the largest over its buckets.

    In bucket ``b`` a member query ``q`` gets ``logsumexp(s(p), s(i) for i in items_b, i != p) -
    s(p)``; a query in several buckets keeps its largest loss (the bucket with the hardest
    negatives). Computed in float32 (float64 inputs stay float64).

    Args:
        query: ``[Q, D]`` queries (already divided by any temperature).
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        query_rows: ``[B, b_q]`` member queries of each bucket (rows of ``query``).
        item_ids: ``[B, b_i]`` member items of each bucket.

    Returns:
        ``[Q]`` losses and a ``[Q]`` boolean mask of the queries in at least one bucket (the
        others' losses are 0).

    Example:
        >>> query, item_emb = torch.zeros(2, 2), torch.zeros(4, 2)
        >>> loss, covered = bucketed_cross_entropy_loss(
        ...     query, item_emb, torch.tensor([1, 2]), torch.tensor([[0]]), torch.tensor([[2, 3]]))
        >>> round(loss[0].item(), 4), covered.tolist()  # log 3: the positive and two items
        (1.0986, [True, False])
    """
    check_scoring_inputs(query, item_emb, targets)
    dtype = compute_dtype(query, item_emb)
    query = query.to(dtype)
    target_emb, bucket_emb = gather_rows(item_emb, [targets, item_ids], dtype)
    positive = (query * target_emb).sum(dim=-1)
    members = query[query_rows]  # [B, b_q, D]
    logits = members @ bucket_emb.transpose(1, 2)  # [B, b_q, b_i]
    own_target = targets[query_rows][:, :, None] == item_ids[:, None, :]
    logits = logits.masked_fill(own_target, float("-inf"))
    member_positive = positive[query_rows]
    per_member = (
        torch.logsumexp(torch.cat([member_positive[..., None], logits], dim=-1), dim=-1)
        - member_positive
    )
    loss = torch.full_like(positive, float("-inf"))
    loss = loss.scatter_reduce(0, query_rows.reshape(-1), per_member.reshape(-1), reduce="amax")
    covered = torch.isfinite(loss)
    return loss.masked_fill(~covered, 0.0), covered


class ScalableCrossEntropyLoss(torch.nn.Module):
    """Scalable Cross-Entropy: cross-entropy over hard negatives found by random buckets.

    Each step draws ``num_buckets`` random directions ``omega ~ N(0, I / sqrt(D))`` (or, with
    ``mix_queries``, random mixtures ``R^T Z`` of the batch's queries, which follow where the
    queries are), puts in each the ``bucket_queries`` queries and the ``bucket_items`` items
    scoring highest with it (:func:`bucket_members`), and averages
    :func:`bucketed_cross_entropy_loss` over the queries some bucket holds. It draws its own
    candidates: it takes no drawn negatives, only the whole catalog (``negatives=none``, which
    ``loss=sce`` selects).

    Args:
        num_buckets: ``B``, buckets per step.
        bucket_queries: queries per bucket.
        bucket_items: items per bucket, the negatives each member query is scored against.
        mix_queries: bucket centres from random mixtures of the queries instead of random
            directions.

    Raises:
        ValueError: if a size is not positive.

    Example:
        >>> loss_fn = ScalableCrossEntropyLoss(num_buckets=4, bucket_queries=3, bucket_items=5)
        >>> loss = loss_fn(DotHead()(torch.randn(6, 8)), torch.tensor([1, 2, 3, 4, 5, 6]),
        ...                torch.randn(21, 8), Negatives("catalog"))
        >>> loss.shape
        torch.Size([])
    """

    #: The objective's name in messages, as the ``loss`` config group spells it.
    name: ClassVar[str] = "sce"
    #: Buckets of plain dot products.
    accepted_heads: ClassVar[tuple[type[DotHead], ...]] = (DotHead,)
    #: Scores candidates of its own choosing (its buckets) from the whole catalog.
    scopes: ClassVar[frozenset[Scope]] = frozenset({"catalog"})
    corrects_by_log_q: ClassVar[bool] = False
    exact_on_catalog: ClassVar[bool] = False
    refreshable: ClassVar[bool] = False

    def __init__(
        self,
        num_buckets: int = 256,
        bucket_queries: int = 256,
        bucket_items: int = 256,
        mix_queries: bool = False,
    ) -> None:
        super().__init__()
        for setting, value in (
            ("num_buckets", num_buckets),
            ("bucket_queries", bucket_queries),
            ("bucket_items", bucket_items),
        ):
            if value < 1:
                raise ValueError(f"{setting}={value} must be >= 1")
        self.num_buckets = int(num_buckets)
        self.bucket_queries = int(bucket_queries)
        self.bucket_items = int(bucket_items)
        self.mix_queries = bool(mix_queries)

    def centres(self, query: Tensor) -> Tensor:
        """``[B, D]`` random bucket directions for the batch's ``[Q, D]`` queries."""
        scale = 1.0 / math.sqrt(math.sqrt(query.shape[1]))
        query = query.detach().float()
        if self.mix_queries:
            mixing = torch.randn(len(query), self.num_buckets, device=query.device) * scale
            return mixing.T @ query
        return torch.randn(self.num_buckets, query.shape[1], device=query.device) * scale

    def forward(
        self, output: HeadOutput, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Scalar loss of a batch: ``output``'s ``[Q, D]`` scaled queries, ``[Q]`` targets and
        the ``[N+1, D]`` item table; ``negatives`` must be the whole catalog, without windows.

        Raises:
            ValueError: for drawn negatives, or with the batch's windows to leave out.
        """
        check_scope(self, negatives, windows=False)
        query = output.queries
        rows, ids = bucket_members(
            query.detach().float(),
            item_emb.detach(),
            self.centres(query),
            self.bucket_queries,
            self.bucket_items,
        )
        loss, covered = bucketed_cross_entropy_loss(query, item_emb, targets, rows, ids)
        return loss.sum() / covered.sum().clamp(min=1)

    def extra_repr(self) -> str:
        return (
            f"num_buckets={self.num_buckets}, bucket_queries={self.bucket_queries}, "
            f"bucket_items={self.bucket_items}, mix_queries={self.mix_queries}"
        )
