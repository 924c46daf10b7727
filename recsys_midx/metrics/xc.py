"""Extreme multi-label classification metrics: P@k, nDCG@k and propensity-scored PSP@k.

Predictions are the top-``k`` labels of each point over the whole label set, found
``chunk_size`` labels at a time with a running top-``k`` merge (:func:`top_labels`), so no
``[B, L]`` score matrix is ever built. Label ids are ``1..L``; id ``0`` is padding and is never
predicted. With ``hit_j = 1`` when the ``j``-th prediction (0-based) is a positive of the point
and ``y`` its set of positives:

* ``p@k = sum_{j<k} hit_j / k``;
* ``ndcg@k = DCG@k / IDCG@k`` with ``DCG@k = sum_{j<k} hit_j / log2(j + 2)`` and ``IDCG@k`` the
  DCG of a perfect ranking, ``sum_{j < min(k, |y|)} 1 / log2(j + 2)``; ``0`` when ``y`` is empty;
* ``psp@k`` (Jain et al., 2016): ``sum_{j<k} hit_j / p_{l_j} / k`` summed over points, divided by
  the same sum for the best achievable prediction (the ``k`` positives of largest ``1 / p``), so
  ``psp@k = 1`` for a perfect ranking. ``p_l`` are the propensities of
  :func:`inverse_propensities`.

Means are over all points, points without positives included (they score 0, as in the usual
evaluation of the Extreme Classification Repository's datasets).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torchmetrics
from torch import Tensor

from recsys_midx.scoring import Transform, catalog_chunks, catalog_scores, check_mixture

__all__ = ["XCMetrics", "inverse_propensities", "top_labels", "xc_metric_names", "xc_metrics"]

#: Metrics computed at every cut-off ``k``, in the order they appear in results.
_METRICS: tuple[str, ...] = ("p", "ndcg", "psp")


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    """Validate cut-offs: a non-empty sequence of distinct positive integers."""
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
        raise ValueError(f"ks must be a non-empty sequence of distinct positive integers, got {ks}")
    return ks


def xc_metric_names(ks: Sequence[int] = (1, 3, 5)) -> list[str]:
    """Names of the metrics :func:`xc_metrics` returns for the cut-offs ``ks``.

    Args:
        ks: cut-offs, distinct positive integers.

    Returns:
        ``["p@k", "ndcg@k", "psp@k"]`` for each ``k`` in the order given.

    Raises:
        ValueError: if ``ks`` is empty, has duplicates or a value below 1.

    Example:
        >>> xc_metric_names((1, 3))
        ['p@1', 'ndcg@1', 'psp@1', 'p@3', 'ndcg@3', 'psp@3']
    """
    return [f"{name}@{k}" for k in _check_ks(ks) for name in _METRICS]


def inverse_propensities(
    label_counts: Tensor, num_points: int, a: float = 0.55, b: float = 1.5
) -> Tensor:
    """Inverse propensities ``1 / p_l`` of the labels (Jain et al., 2016).

    ``p_l = 1 / (1 + C (N_l + B)^-A)`` with ``C = (log N - 1) (B + 1)^A``, where ``N`` is the
    number of training points and ``N_l`` the training frequency of label ``l``. Rare labels get
    small propensities (large weights), so PSP rewards predicting them.

    Args:
        label_counts: ``[L+1]`` training frequencies; entry ``0`` (padding) is ignored.
        num_points: ``N``, the number of training points.
        a: ``A`` (0.55 in general, 0.6 for Amazon datasets, 0.5 for Wikipedia ones).
        b: ``B`` (1.5 in general, 2.6 for Amazon datasets, 0.4 for Wikipedia ones).

    Returns:
        ``[L+1]`` float32 ``1 / p_l``, with ``0`` for the padding entry.

    Raises:
        ValueError: if ``num_points < 1``, counts are negative, or ``a``/``b`` are negative.

    Example:
        >>> weights = inverse_propensities(torch.tensor([0, 0, 10, 1000]), num_points=1000)
        >>> [round(w, 3) for w in weights.tolist()]
        [0.0, 8.824, 3.552, 1.219]
    """
    if num_points < 1:
        raise ValueError(f"num_points must be >= 1, got {num_points}")
    if a < 0 or b < 0:
        raise ValueError(f"propensity constants must be >= 0, got A={a}, B={b}")
    counts = label_counts.detach().to(torch.float64)
    if bool((counts < 0).any()):
        raise ValueError("label_counts must be non-negative")
    c = (math.log(num_points) - 1.0) * (b + 1.0) ** a
    weights = 1.0 + c * (counts + b).pow(-a)
    weights[0] = 0.0
    return weights.float()


@torch.no_grad()
def top_labels(
    query: Tensor,
    item_emb: Tensor,
    k: int,
    chunk_size: int = 65536,
    log_weights: Tensor | None = None,
    transform: Transform | None = None,
) -> tuple[Tensor, Tensor]:
    """The ``k`` best-scoring labels of each query over labels ``1..L``, scored in chunks.

    Scores are ``query . item_emb[l]`` in float32 on the device of ``query``. Each chunk's own
    top-``k`` is merged with the running one, so memory is ``O(B * (chunk_size + k))`` and no
    ``[B, L]`` matrix is built; the table may stay on another device. NaN scores rank last.

    Args:
        query: ``[B, D]`` query vectors.
        item_emb: ``[L+1, D]`` label table; row 0 is padding and never returned.
        k: labels returned per query, ``1 <= k <= L``.
        chunk_size: labels scored at a time.
        log_weights: ``[B, K]`` mixture log-weights when ``query`` holds ``K`` queries per row
            ``[B, K, D]``; labels are then scored by
            :func:`~recsys_midx.scoring.catalog_scores`.
        transform: the pointwise transform of the scores inside a mixture
            (:class:`~recsys_midx.scoring.RankingQueries`), ``None`` for the identity.

    Returns:
        ``scores`` ``[B, k]`` (float32, descending) and ``ids`` ``[B, k]`` (int64, in ``1..L``).

    Raises:
        ValueError: on mismatched shapes, ``k`` outside ``1..L`` or ``chunk_size < 1``.

    Example:
        >>> item_emb = torch.tensor([[0.0], [1.0], [3.0], [2.0]])
        >>> top_labels(torch.tensor([[1.0], [-1.0]]), item_emb, k=2, chunk_size=2)[1]
        tensor([[2, 3],
                [1, 3]])
    """
    check_mixture(query, log_weights)
    if item_emb.dim() != 2 or query.shape[-1] != item_emb.shape[1]:
        raise ValueError(
            f"expected query [B, D] and item_emb [L+1, D], got {tuple(query.shape)} and "
            f"{tuple(item_emb.shape)}"
        )
    num_labels = item_emb.shape[0] - 1
    if not 1 <= k <= num_labels:
        raise ValueError(f"k must be in 1..{num_labels}, got {k}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    query = query.float()
    device = query.device
    best_scores = query.new_full((query.shape[0], 0), float("-inf"))
    best_ids = torch.zeros((query.shape[0], 0), dtype=torch.long, device=device)
    for first, labels in catalog_chunks(item_emb, chunk_size):
        chunk = labels.to(device=device, dtype=torch.float32)
        scores = catalog_scores(query, chunk, log_weights, transform)
        scores = scores.nan_to_num_(nan=float("-inf"))
        chunk_scores, chunk_ids = scores.topk(min(k, scores.shape[1]), dim=1)
        merged_scores = torch.cat((best_scores, chunk_scores), dim=1)
        merged_ids = torch.cat((best_ids, chunk_ids + first), dim=1)
        best_scores, order = merged_scores.topk(min(k, merged_scores.shape[1]), dim=1)
        best_ids = merged_ids.gather(1, order)
    return best_scores, best_ids


def _discounts(length: int, device: torch.device) -> Tensor:
    """``1 / log2(j + 2)`` for ``j = 0..length-1`` (float64)."""
    return 1.0 / torch.log2(torch.arange(length, device=device, dtype=torch.float64) + 2.0)


def _per_point(
    top_ids: Tensor, positives: Tensor, ks: tuple[int, ...], inv_propensity: Tensor
) -> dict[str, Tensor]:
    """Per-point ``[B, len(ks)]`` float64 values: ``p``, ``ndcg``, PSP gain ``psp`` and the best
    achievable PSP gain ``psp_best``."""
    max_k = max(ks)
    if top_ids.shape[1] < max_k:
        raise ValueError(f"top_ids must hold at least {max_k} predictions, got {top_ids.shape[1]}")
    top_ids = top_ids[:, :max_k]
    device = top_ids.device
    positives = positives.to(device=device, dtype=torch.long)
    weights = inv_propensity.to(device=device, dtype=torch.float64)
    is_positive = positives > 0
    hits = ((top_ids[:, :, None] == positives[:, None, :]) & is_positive[:, None, :]).any(dim=2)
    hits = hits.double()
    discounts = _discounts(max_k, device)
    num_positives = is_positive.sum(dim=1)
    # The best PSP prediction lists the point's positives by decreasing 1/p (padding weighs 0).
    best_weights = weights[positives].sort(dim=1, descending=True).values
    best_weights = torch.nn.functional.pad(best_weights, (0, max(0, max_k - best_weights.shape[1])))

    cum_hits = hits.cumsum(dim=1)
    cum_dcg = (hits * discounts).cumsum(dim=1)
    cum_ideal = discounts.cumsum(dim=0)
    cum_psp = (hits * weights[top_ids]).cumsum(dim=1)
    cum_best = best_weights[:, :max_k].cumsum(dim=1)
    columns = torch.tensor([k - 1 for k in ks], device=device)
    sizes = torch.tensor(ks, device=device, dtype=torch.float64)
    ideal_len = torch.minimum(num_positives[:, None], columns[None, :] + 1)
    ideal = torch.where(ideal_len > 0, cum_ideal[(ideal_len - 1).clamp_min(0)], 0.0)
    dcg = cum_dcg[:, columns]
    return {
        "p": cum_hits[:, columns] / sizes,
        "ndcg": torch.where(ideal > 0, dcg / ideal.clamp_min(1e-12), 0.0),
        "psp": cum_psp[:, columns] / sizes,
        "psp_best": cum_best[:, columns] / sizes,
    }


def _check_batch(top_ids: Tensor, positives: Tensor, inv_propensity: Tensor) -> None:
    if top_ids.dim() != 2 or positives.dim() != 2 or top_ids.shape[0] != positives.shape[0]:
        raise ValueError(
            f"expected top_ids [B, K] and positives [B, P], got {tuple(top_ids.shape)} and "
            f"{tuple(positives.shape)}"
        )
    if inv_propensity.dim() != 1:
        raise ValueError(f"inv_propensity must be [L+1], got {tuple(inv_propensity.shape)}")


def xc_metrics(
    top_ids: Tensor, positives: Tensor, inv_propensity: Tensor, ks: Sequence[int] = (1, 3, 5)
) -> dict[str, Tensor]:
    """P@k, nDCG@k and PSP@k of one set of points (see the module docstring).

    Args:
        top_ids: ``[B, K]`` predicted label ids, best first, ``K >= max(ks)`` (e.g. from
            :func:`top_labels`).
        positives: ``[B, P]`` positive label ids in ``1..L``, padded with ``0``.
        inv_propensity: ``[L+1]`` inverse propensities ``1 / p_l`` (from
            :func:`inverse_propensities`), ``0`` at the padding entry.
        ks: cut-offs, distinct positive integers.

    Returns:
        A dict keyed as :func:`xc_metric_names` of float32 scalars: means over points for ``p``
        and ``ndcg``, the normalised ratio for ``psp`` (NaN if no point has a positive).

    Raises:
        ValueError: on mismatched shapes, fewer than ``max(ks)`` predictions or bad ``ks``.

    Example:
        >>> top = torch.tensor([[3, 1, 2]])
        >>> out = xc_metrics(top, torch.tensor([[1, 0]]), torch.tensor([0.0, 2.0, 1.0, 1.0]),
        ...                  ks=(1, 3))
        >>> {name: round(value.item(), 4) for name, value in out.items()}
        {'p@1': 0.0, 'ndcg@1': 0.0, 'psp@1': 0.0, 'p@3': 0.3333, 'ndcg@3': 0.6309, 'psp@3': 1.0}
    """
    metric = XCMetrics(ks)
    metric.update(top_ids, positives, inv_propensity)
    return metric.compute()


class XCMetrics(torchmetrics.Metric):
    """Accumulates P@k, nDCG@k and PSP@k over batches of points.

    The state is one float64 vector of per-metric sums (``p`` and ``ndcg`` per point, PSP gain
    and best achievable PSP gain) and a point count, all reduced with ``sum`` across processes,
    so distributed evaluation counts every point exactly once. PSP is the ratio of the two PSP
    sums, the usual normalisation by the best achievable prediction.

    Args:
        ks: cut-offs, distinct positive integers.
        **kwargs: passed on to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``ks`` is empty, has duplicates or a value below 1.

    Example:
        >>> metric = XCMetrics(ks=(1,))
        >>> weights = torch.tensor([0.0, 1.0, 3.0])
        >>> metric.update(torch.tensor([[1], [1]]), torch.tensor([[1, 2], [2, 0]]), weights)
        >>> {name: round(value.item(), 4) for name, value in metric.compute().items()}
        {'p@1': 0.5, 'ndcg@1': 0.5, 'psp@1': 0.1667}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    sums: Tensor
    count: Tensor

    def __init__(self, ks: Sequence[int] = (1, 3, 5), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ks = _check_ks(ks)
        self.names = xc_metric_names(self.ks)
        # Rows: p, ndcg, psp gain, best psp gain; one column per cut-off.
        self.add_state(
            "sums", torch.zeros(4, len(self.ks), dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state("count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    @property
    def max_k(self) -> int:
        """The largest cut-off: how many predictions :meth:`update` needs per point."""
        return max(self.ks)

    def update(self, top_ids: Tensor, positives: Tensor, inv_propensity: Tensor) -> None:
        """Add a batch of points.

        Args:
            top_ids: ``[B, K]`` predicted label ids, best first, ``K >= max(ks)``.
            positives: ``[B, P]`` positive label ids, padded with ``0``.
            inv_propensity: ``[L+1]`` inverse propensities, ``0`` at the padding entry.

        Raises:
            ValueError: on mismatched shapes or fewer than ``max(ks)`` predictions.
        """
        _check_batch(top_ids, positives, inv_propensity)
        values = _per_point(top_ids, positives, self.ks, inv_propensity)
        self.sums += torch.stack(
            [values[name].sum(dim=0) for name in ("p", "ndcg", "psp", "psp_best")]
        ).to(self.sums.device)
        self.count += top_ids.shape[0]

    def compute(self) -> dict[str, Tensor]:
        """Metrics over all points seen so far, keyed as :func:`xc_metric_names`."""
        precision, ndcg, psp, psp_best = self.sums.unbind()
        values = {"p": precision / self.count, "ndcg": ndcg / self.count, "psp": psp / psp_best}
        return {
            f"{name}@{k}": values[name][column].float()
            for column, k in enumerate(self.ks)
            for name in _METRICS
        }
