"""Evaluation metrics: full-catalog ranking of held-out targets (HR, NDCG, MRR)."""

from recsys_midx.metrics.ranking import RankingMetrics, metric_names, ranking_metrics, target_ranks

__all__ = ["RankingMetrics", "metric_names", "ranking_metrics", "target_ranks"]
