"""Several queries per context: the component view of a head's queries, the log-probability of
a mixture of softmaxes, and the queries and scores that rank items by it.

A head with ``K`` queries per context models
``log p(i) = logsumexp_k(log pi_k + log p_k(i))``; a head with one query is the case ``K = 1``,
which every function here accepts as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

if TYPE_CHECKING:
    # Only for the annotations: logsumexp imports this module.
    from .logsumexp import Transform


class RankingQueries(NamedTuple):
    """What ranks the catalog as a model's probabilities do (:func:`catalog_scores` of them).

    Attributes:
        queries: ``[B, D]`` (one query per row) or ``[B, K, D]`` (a mixture's components).
        log_weights: ``None`` for one query per row, else ``[B, K]`` mixture log-weights: each
            component's ``log pi_k`` minus its normaliser over the catalog.
        transform: ``None``, or the pointwise transform of a mixture's component scores (where it
            changes the ranking: inside the mixture's log-sum-exp).
    """

    queries: Tensor
    log_weights: Tensor | None = None
    transform: Transform | None = None


def as_components(queries: Tensor) -> Tensor:
    """``[Q, K, D]`` view of a head's queries: a single ``[Q, D]`` query is one component.

    Args:
        queries: ``[Q, D]`` or ``[Q, K, D]`` queries.

    Returns:
        ``[Q, K, D]`` (``[Q, 1, D]`` for one query per context), a view of ``queries``.

    Example:
        >>> as_components(torch.zeros(3, 4)).shape, as_components(torch.zeros(3, 2, 4)).shape
        (torch.Size([3, 1, 4]), torch.Size([3, 2, 4]))
    """
    return queries.unsqueeze(1) if queries.dim() == 2 else queries


def mixture_log_prob(log_p: Tensor, log_prior: Tensor | None) -> Tensor:
    """``logsumexp_k(log_prior_k + log_p_k)`` over the last dimension (``K``).

    Args:
        log_p: ``[..., K]`` component log-probabilities.
        log_prior: ``[..., K]`` normalised mixture log-weights, or ``None`` when ``K = 1``.

    Returns:
        ``[...]`` log-probabilities of the mixture, in the dtype of ``log_p``.

    Example:
        >>> log_p = torch.log(torch.tensor([[0.2, 0.6]]))
        >>> mixture_log_prob(log_p, torch.log(torch.tensor([[0.5, 0.5]]))).exp()
        tensor([0.4000])
    """
    if log_prior is None:
        return log_p.squeeze(-1)
    return torch.logsumexp(log_p + log_prior.to(log_p.dtype), dim=-1)


def catalog_scores(
    query: Tensor,
    vectors: Tensor,
    log_weights: Tensor | None = None,
    transform: Transform | None = None,
) -> Tensor:
    """Scores ``[B, C]`` of item vectors ``[C, D]`` for one query or a mixture of queries each.

    One query per row (``query`` ``[B, D]``, ``log_weights`` ``None``) scores ``f(query . v)``.
    ``K`` queries per row (``[B, K, D]`` with ``log_weights`` ``[B, K]``) score
    ``logsumexp_k(log_weights_k + f(query_k . v))``, the log-probability of a mixture of
    softmaxes when the weights hold ``log pi_k`` minus each component's normaliser
    (:func:`~recsys_midx.scoring.ranking_queries`). ``f`` is ``transform``, the identity when
    ``None``. The evaluation scores the catalog a chunk of vectors at a time with it.

    Args:
        query: ``[B, D]`` or ``[B, K, D]`` queries.
        vectors: ``[C, D]`` item vectors, on the device and in the dtype of ``query``.
        log_weights: ``[B, K]`` for ``[B, K, D]`` queries, else ``None``.
        transform: pointwise transform of the scores, ``None`` for the identity.

    Returns:
        ``[B, C]`` scores.

    Example:
        >>> query, vectors = torch.randn(2, 3, 4), torch.randn(5, 4)
        >>> weights = torch.zeros(2, 3)
        >>> torch.allclose(catalog_scores(query, vectors, weights),
        ...                torch.logsumexp(query @ vectors.T, dim=1))
        True
    """
    scores = query @ vectors.T
    if transform is not None:
        scores = transform(scores)
    if log_weights is None:
        return scores
    return torch.logsumexp(scores + log_weights[..., None].to(scores.dtype), dim=1)


def check_mixture(query: Tensor, log_weights: Tensor | None) -> None:
    """Check that ``query`` and ``log_weights`` describe one query or a mixture per row.

    Args:
        query: ``[B, D]`` or ``[B, K, D]`` queries.
        log_weights: ``None`` for ``[B, D]`` queries, ``[B, K]`` for ``[B, K, D]`` ones.

    Raises:
        ValueError: unless ``query`` is ``[B, D]`` without weights or ``[B, K, D]`` with
            ``[B, K]`` weights.

    Example:
        >>> check_mixture(torch.zeros(2, 4), None)  # one query per row
        >>> check_mixture(torch.zeros(2, 3, 4), torch.zeros(2, 3))  # three per row
    """
    expected = 2 if log_weights is None else 3
    if query.dim() != expected or (
        log_weights is not None and tuple(log_weights.shape) != tuple(query.shape[:2])
    ):
        raise ValueError(
            f"expected query [B, D] without log_weights or [B, K, D] with log_weights [B, K], "
            f"got {tuple(query.shape)} and "
            f"{None if log_weights is None else tuple(log_weights.shape)}"
        )
