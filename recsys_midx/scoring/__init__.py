"""Catalog scoring: what every part that scores the whole catalog shares.

The normalisers over all items, computed in chunks so that memory stays ``O(Q * chunk_size)`` in
forward and backward (:func:`catalog_logsumexp` for the dot product, :func:`head_logsumexp` for
a head's transformed scores and mixture components); the mixtures of softmaxes
(:func:`as_components`, :func:`mixture_log_prob`, :class:`RankingQueries`,
:func:`catalog_scores`); and a head's model
over the catalog (:func:`ranking_queries` for evaluation and inference, :func:`log_probs` for
the diagnostics); the row lookups of a table whose gradient may be sparse (:func:`lookup_rows`);
and the row blocks that bound a computation's memory (:func:`row_chunks`, and
:func:`catalog_chunks` for a table's items). The objectives, the metrics, the samplers, the index,
the Lightning modules and the analysis build on it; it imports nothing else of the toolkit, so
any of them loads it without the others.
"""

from .head_model import log_probs, ranking_queries
from .logsumexp import (
    ExcludedItems,
    Transform,
    catalog_logsumexp,
    compute_dtype,
    head_logsumexp,
    identity,
    softmax_weights_,
)
from .mixtures import (
    RankingQueries,
    as_components,
    catalog_scores,
    check_mixture,
    mixture_log_prob,
)
from .rows import catalog_chunks, has_sparse_rows, lookup_rows, mark_sparse_rows, row_chunks

__all__ = [
    "ExcludedItems",
    "RankingQueries",
    "Transform",
    "as_components",
    "catalog_chunks",
    "catalog_logsumexp",
    "catalog_scores",
    "check_mixture",
    "compute_dtype",
    "has_sparse_rows",
    "head_logsumexp",
    "identity",
    "log_probs",
    "lookup_rows",
    "mark_sparse_rows",
    "mixture_log_prob",
    "ranking_queries",
    "row_chunks",
    "softmax_weights_",
]
