"""Shares of a best value, for metrics where higher is better (NDCG, P@k) and where lower is
(perplexity): a run comes within 95% of the best at ``0.95 * best`` NDCG@10, and at
``best / 0.95`` perplexity."""

from __future__ import annotations

import pandas as pd

from recsys_midx.metrics.perplexity import PERPLEXITY_METRICS


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of ``metric`` (``test/ppl``, ``val/nll``, ...) is the better one.

    Example:
        >>> lower_is_better("val/ppl"), lower_is_better("val/ndcg@10")
        (True, False)
    """
    return metric.rsplit("/", 1)[-1] in PERPLEXITY_METRICS


def best_of(values: pd.Series, lower: bool) -> float:
    """The best of ``values``: the smallest where lower is better, else the largest."""
    return float(values.min() if lower else values.max())


def threshold(best: float, share: float, lower: bool) -> float:
    """The value that comes within ``share`` of ``best``: ``share * best``, or ``best / share``
    for a metric where lower is better."""
    return best / share if lower else share * best


def share_of(value: float, best: float, lower: bool) -> float:
    """How close ``value`` comes to ``best``, as a share (1 at the best): the inverse of
    :func:`threshold`."""
    return best / value if lower else value / best


def reached(values: pd.Series, best: float, share: float, lower: bool) -> pd.Series:
    """Where ``values`` come within ``share`` of ``best`` (:func:`threshold`)."""
    bound = threshold(best, share, lower)
    return values <= bound if lower else values >= bound
