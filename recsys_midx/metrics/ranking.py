"""Full-ranking evaluation for next-item recommendation.

Every query is scored against the whole catalog, the 0-based rank of its single held-out target is
computed (optionally ignoring the user's history), and the rank is turned into hit rate, NDCG and
MRR at several cut-offs. Item ids are ``1..N``; id ``0`` is padding and is never ranked.

Rank semantics, shared by everything in this module:

- The rank of the target is the number of competing items ``j`` in ``1..N`` (``j`` is not the
  target and not excluded) whose score is ``>=`` the target's score. Ties count against the
  target, so a scorer that gives every item the same score ranks the target last and earns
  metrics of ``0``, never perfect ones.
- NaN scores are the worst possible: a competitor scored NaN never outranks a target with a
  finite score, and a target scored NaN (for instance because its query is NaN) is ranked behind
  every competitor. Infinite scores compare as usual (``+inf`` ties with ``+inf``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torchmetrics
from torch import Tensor

from recsys_midx.scoring import Transform, catalog_chunks, catalog_scores, check_mixture

__all__ = [
    "RankingMetrics",
    "metric_names",
    "ranking_metrics",
    "target_ranks",
]

#: Metrics computed at every cut-off ``k``, in the order they appear in results.
_METRICS: tuple[str, ...] = ("hr", "ndcg", "mrr")

_INTEGER_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    """Validate cut-offs: a non-empty sequence of distinct positive integers."""
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
        raise ValueError(f"ks must be a non-empty sequence of distinct positive integers, got {ks}")
    return ks


def metric_names(ks: Sequence[int] = (10, 20)) -> list[str]:
    """Names of the metrics :func:`ranking_metrics` returns for the cut-offs ``ks``.

    Args:
        ks: cut-offs, distinct positive integers.

    Returns:
        ``["hr@k", "ndcg@k", "mrr@k"]`` for each ``k`` in the order given.

    Raises:
        ValueError: if ``ks`` is empty, has duplicates or a value below 1.

    Example:
        >>> metric_names((1, 5))
        ['hr@1', 'ndcg@1', 'mrr@1', 'hr@5', 'ndcg@5', 'mrr@5']
    """
    return [f"{name}@{k}" for k in _check_ks(ks) for name in _METRICS]


def _removal_lists(targets: Tensor, exclude: Tensor | None) -> tuple[Tensor, Tensor]:
    """Per-row ids whose own score must be taken back out of the ``>=`` count.

    The chunked count includes the target's own column and every excluded item, so both are
    subtracted afterwards. Sorting each row lets repeats be masked with one comparison between
    neighbours; putting the target in the same list makes a target that also appears in the
    history subtracted exactly once.

    Returns:
        ``ids`` ``[B, H+1]`` (sorted) and ``keep`` ``[B, H+1]``, true at the first occurrence of
        each non-padding id.
    """
    ids = targets.unsqueeze(1)
    if exclude is not None:
        ids = torch.cat((ids, exclude.to(targets.dtype)), dim=1)
    ids = ids.sort(dim=1).values
    keep = ids != 0
    keep[:, 1:] &= ids[:, 1:] != ids[:, :-1]
    return ids, keep


@torch.no_grad()
def target_ranks(
    query: Tensor,
    item_emb: Tensor,
    targets: Tensor,
    exclude: Tensor | None = None,
    chunk_size: int = 65536,
    log_weights: Tensor | None = None,
    transform: Transform | None = None,
) -> Tensor:
    """0-based full-catalog rank of each query's target, with the user's history excluded.

    Items are scored ``chunk_size`` at a time in float32 on the device of ``query``, so no
    ``[B, N]`` score matrix is ever built and the item table may stay on another device (for
    instance in host memory while the queries are on a GPU). The loop over chunks has no host
    synchronisation.

    Each chunk's scores come from one matrix product of the queries with the chunk's items
    *and* the batch's target vectors, and the target's score used for that chunk is read from
    the same product. Matrix-multiply kernels round differently depending on the operand shapes,
    so a target score computed separately could differ in the last bit from a tied item's score
    and turn a tie into a win; computing both in one call keeps ties exact as far as the kernel
    returns equal values for equal columns. Ties between items that are only equal in exact
    arithmetic may still be broken by rounding, as in any float32 evaluation.

    Args:
        query: ``[B, D]`` query vectors, any floating dtype.
        item_emb: ``[N+1, D]`` item table; row 0 is padding and is never ranked.
        targets: ``[B]`` integer target ids in ``1..N``.
        exclude: optional ``[B, H]`` integer ids in ``0..N`` removed from the ranking (the user's
            history), 0-padded. Repeats count once; an entry equal to the target is ignored, so
            the target is always ranked.
        chunk_size: items scored at a time; extra memory is ``O(B * (chunk_size + B))``
            (``K`` times that for a mixture).
        log_weights: ``[B, K]`` mixture log-weights when ``query`` holds ``K`` queries per row
            ``[B, K, D]``; items are then scored by :func:`~recsys_midx.scoring.catalog_scores`.
        transform: the pointwise transform of the scores inside a mixture
            (:class:`~recsys_midx.scoring.RankingQueries`), ``None`` for the identity.

    Returns:
        ``[B]`` int64 ranks on the device of ``query``: the number of competing items, neither
        the target nor excluded, whose score is ``>=`` the target's. NaN scores rank last (see
        the module docstring).

    Raises:
        ValueError: on inconsistent shapes, an empty catalog, ``chunk_size < 1``, a target
            outside ``1..N`` or an excluded id outside ``0..N``.
        TypeError: if ``targets`` or ``exclude`` is not an integer tensor.

    Example:
        >>> item_emb = torch.tensor([[0.0], [1.0], [3.0], [2.0]])  # padding, then items 1..3
        >>> query = torch.tensor([[1.0], [1.0]])
        >>> target_ranks(query, item_emb, torch.tensor([1, 1]))
        tensor([2, 2])
        >>> target_ranks(query, item_emb, torch.tensor([1, 1]), exclude=torch.tensor([[2], [0]]))
        tensor([1, 2])
    """
    check_mixture(query, log_weights)
    if item_emb.dim() != 2 or query.shape[-1] != item_emb.shape[1]:
        raise ValueError(
            f"expected query [B, D] and item_emb [N+1, D], got {tuple(query.shape)} and "
            f"{tuple(item_emb.shape)}"
        )
    num_queries, num_items = query.shape[0], item_emb.shape[0] - 1
    if num_items < 1:
        raise ValueError("item_emb must hold the padding row and at least one item")
    if targets.shape != (num_queries,):
        raise ValueError(f"expected targets of shape ({num_queries},), got {tuple(targets.shape)}")
    if exclude is not None and (exclude.dim() != 2 or exclude.shape[0] != num_queries):
        raise ValueError(
            f"expected exclude of shape ({num_queries}, H), got {tuple(exclude.shape)}"
        )
    for name, ids in (("targets", targets), ("exclude", exclude)):
        if ids is not None and ids.dtype not in _INTEGER_DTYPES:
            raise TypeError(f"{name} must be an integer tensor, got {ids.dtype}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    device = query.device
    targets = targets.to(device=device, dtype=torch.long)
    # A single host synchronisation, before the loop, guards every index used below.
    invalid = (targets < 1) | (targets > num_items)
    if exclude is not None:
        exclude = exclude.to(device=device, dtype=torch.long)
        invalid = torch.cat((invalid, ((exclude < 0) | (exclude > num_items)).flatten()))
    if bool(invalid.any()):
        raise ValueError(f"targets must lie in 1..{num_items} and excluded ids in 0..{num_items}")

    query = query.float()
    target_vecs = item_emb[targets.to(item_emb.device)]
    removal_ids, removal_keep = _removal_lists(targets, exclude)
    counts = torch.zeros(num_queries, dtype=torch.long, device=device)
    nan_target = torch.zeros(num_queries, dtype=torch.bool, device=device)
    diagonal = torch.arange(num_queries, device=device)

    for first, items in catalog_chunks(item_emb, chunk_size):
        width = items.shape[0]
        vectors = torch.cat((items, target_vecs))
        vectors = vectors.to(device=device, dtype=torch.float32)
        scores = catalog_scores(query, vectors, log_weights, transform)  # [B, width + B]
        target_score = scores[diagonal, width + diagonal].unsqueeze(1)
        scores = scores[:, :width]
        # int32 partial sums (exact below 2**31 items per chunk) make the bool reduction faster.
        counts += (scores >= target_score).sum(dim=1, dtype=torch.int32)
        # Take back the target's own column and excluded items that were counted in this chunk.
        offsets = removal_ids - first
        in_chunk = removal_keep & (offsets >= 0) & (offsets < width)
        removed = scores.gather(1, offsets.clamp(0, width - 1)) >= target_score
        counts -= (removed & in_chunk).sum(dim=1)
        nan_target |= target_score.squeeze(1).isnan()

    # A NaN target score compares false with everything; ranking it last means every competitor
    # counts: all items but the target and the distinct excluded ones.
    competitors = num_items - removal_keep.sum(dim=1)
    return torch.where(nan_target, competitors, counts)


def ranking_metrics(ranks: Tensor, ks: Sequence[int] = (10, 20)) -> dict[str, Tensor]:
    """Per-user hit rate, NDCG and MRR at each cut-off, for one relevant item per user.

    With 0-based rank ``r``: ``hr@k = [r < k]``, ``ndcg@k = [r < k] / log2(r + 2)`` and
    ``mrr@k = [r < k] / (r + 1)``; all three are exactly 1 at ``r = 0``.

    Args:
        ranks: 0-based ranks of any shape, such as the output of :func:`target_ranks`.
        ks: cut-offs, distinct positive integers.

    Returns:
        A dict keyed as :func:`metric_names` (``"hr@10"``, ``"ndcg@10"``, ``"mrr@10"``, ...) of
        float32 tensors with the shape and device of ``ranks``.

    Raises:
        ValueError: if ``ks`` is empty, has duplicates or a value below 1.

    Example:
        >>> out = ranking_metrics(torch.tensor([0, 1, 5]), ks=(2,))
        >>> out["hr@2"], out["mrr@2"]
        (tensor([1., 1., 0.]), tensor([1.0000, 0.5000, 0.0000]))
    """
    ks = _check_ks(ks)
    positions = ranks.float() + 1.0
    gains = {
        "hr": torch.ones_like(positions),
        "ndcg": 1.0 / torch.log2(positions + 1.0),
        "mrr": 1.0 / positions,
    }
    zero = torch.zeros((), dtype=positions.dtype, device=positions.device)
    return {
        f"{name}@{k}": torch.where(ranks < k, gains[name], zero) for k in ks for name in _METRICS
    }


class RankingMetrics(torchmetrics.Metric):
    """Accumulates :func:`ranking_metrics` over batches and returns their means over users.

    The state is one vector of per-metric sums and a user count, both reduced with ``sum`` across
    processes, so distributed evaluation counts every user exactly once (provided each user is
    evaluated by exactly one process). Sums are kept in float64 so that means over millions of
    users do not lose precision.

    Args:
        ks: cut-offs, distinct positive integers.
        **kwargs: passed on to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``ks`` is empty, has duplicates or a value below 1.

    Example:
        >>> metric = RankingMetrics(ks=(1, 3))
        >>> metric.update(torch.tensor([0, 2]))
        >>> metric.update(torch.tensor([5]))
        >>> means = metric.compute()
        >>> {name: round(means[name].item(), 4) for name in ("hr@1", "hr@3", "ndcg@3", "mrr@3")}
        {'hr@1': 0.3333, 'hr@3': 0.6667, 'ndcg@3': 0.5, 'mrr@3': 0.4444}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    sums: Tensor
    count: Tensor

    def __init__(self, ks: Sequence[int] = (10, 20), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ks = _check_ks(ks)
        self.names = metric_names(self.ks)
        sums = torch.zeros(len(self.names), dtype=torch.float64)
        self.add_state("sums", sums, dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, ranks: Tensor) -> None:
        """Add the users whose 0-based target ranks are ``ranks`` (any shape)."""
        per_user = ranking_metrics(ranks.flatten(), self.ks)
        self.sums += torch.stack([per_user[name].double().sum() for name in self.names])
        self.count += ranks.numel()

    def compute(self) -> dict[str, Tensor]:
        """Means over all users seen so far, keyed as :func:`metric_names`; NaN before any user."""
        means = (self.sums / self.count).float()
        return dict(zip(self.names, means.unbind()))
