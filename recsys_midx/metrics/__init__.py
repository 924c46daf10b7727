"""Evaluation metrics: full-catalog ranking of held-out targets (HR, NDCG, MRR) and extreme
multi-label classification metrics (P@k, nDCG@k, PSP@k)."""

from recsys_midx.metrics.ranking import (
    RankingMetrics,
    metric_names,
    ranking_metrics,
    target_ranks,
)
from recsys_midx.metrics.xc import (
    XCMetrics,
    inverse_propensities,
    top_labels,
    xc_metric_names,
    xc_metrics,
)

__all__ = [
    "RankingMetrics",
    "XCMetrics",
    "inverse_propensities",
    "metric_names",
    "ranking_metrics",
    "target_ranks",
    "top_labels",
    "xc_metric_names",
    "xc_metrics",
]
