"""Evaluation metrics: full-catalog ranking of held-out targets (HR, NDCG, MRR), extreme
multi-label classification metrics (P@k, nDCG@k, PSP@k) and a language model's perplexity."""

from recsys_midx.metrics.perplexity import PERPLEXITY_METRICS, Perplexity
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
    "PERPLEXITY_METRICS",
    "Perplexity",
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
