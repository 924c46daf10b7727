"""Exact full-softmax cross-entropy over the catalog, with memory bounded by chunking over items:
the plain dot-product softmax, and the general form of a head (transformed scores, several
queries per context). The chunked normalisers are :mod:`recsys_midx.scoring`'s; this module adds
the targets, and the input checks and helpers every softmax loss shares."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ..scoring import (
    Transform,
    as_components,
    catalog_logsumexp,
    compute_dtype,
    has_sparse_rows,
    head_logsumexp,
    lookup_rows,
    mixture_log_prob,
)

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


def gather_rows(item_emb: Tensor, ids: list[Tensor], dtype: torch.dtype) -> list[Tensor]:
    """Rows ``item_emb[ids_j]`` for each id tensor ``ids_j`` (shapes ``ids_j.shape + (D,)``), cast
    to ``dtype``, from one lookup of the table.

    Every lookup of the table gives backward a dense ``[N+1, D]`` gradient to fill and add, which
    at a million items costs more than the scores themselves; one lookup makes one (or, for a
    table marked by :func:`~recsys_midx.scoring.mark_sparse_rows`, a sparse gradient of the
    gathered rows only). Only the gathered rows are cast, never the table.
    """
    rows = lookup_rows(item_emb, torch.cat([part.reshape(-1) for part in ids])).to(dtype)
    chunks = rows.split([part.numel() for part in ids])
    return [chunk.view(*part.shape, item_emb.shape[1]) for chunk, part in zip(chunks, ids)]


#: The most ``[Q, K, N+1]`` catalog scores :func:`score_candidates` computes to pick candidates
#: from (256 MiB of float32).
_DENSE_PICK_MAX_SCORES = 1 << 26


def picks_from_catalog(queries: Tensor, item_emb: Tensor, num_candidates: int) -> bool:
    """Whether :func:`score_candidates` scores the whole catalog and picks ``num_candidates`` per
    query rather than gathering their rows (see there).

    Example:
        >>> picks_from_catalog(torch.zeros(8, 4), torch.zeros(11, 4), 3)  # 10 items <= 3 x 4
        True
    """
    components = queries.shape[1] if queries.dim() == 3 else 1
    num_rows, dim = item_emb.shape
    return (
        num_rows - 1 <= num_candidates * dim
        and len(queries) * components * num_rows <= _DENSE_PICK_MAX_SCORES
        and not has_sparse_rows(item_emb)
    )


def score_candidates(queries: Tensor, item_emb: Tensor, ids: Tensor, dtype: torch.dtype) -> Tensor:
    """Scores ``queries[q] . item_emb[ids[q, c]]`` of each query's own candidates.

    Gathering the rows copies ``C x D`` numbers per query, and backward adds as many into the
    table. Where the catalog is no larger than that (``N <= C * D``), scoring every item in one
    product and picking the candidates' scores costs less: the product is compute-bound and only
    the ``[Q, N]`` scores are memory. The dense pick is skipped when its scores would exceed
    :data:`_DENSE_PICK_MAX_SCORES`, and for a table marked for sparse row gradients
    (:func:`~recsys_midx.scoring.mark_sparse_rows`), whose gradient must stay on the rows read.

    Args:
        queries: ``[Q, D]`` queries or ``[Q, K, D]`` query components, in ``dtype``.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        ids: ``[Q, C]`` candidate ids in ``0..N``.
        dtype: the compute dtype; only the rows used are cast.

    Returns:
        ``[Q, C]`` (or ``[Q, K, C]``) scores.

    Example:
        >>> queries, item_emb = torch.randn(3, 4), torch.randn(6, 4)
        >>> ids = torch.tensor([[1, 2], [3, 3], [5, 0]])
        >>> expected = (queries[:, None, :] * item_emb[ids]).sum(-1)
        >>> torch.allclose(score_candidates(queries, item_emb, ids, torch.float32), expected)
        True
    """
    if picks_from_catalog(queries, item_emb, ids.shape[1]):
        scores = queries @ item_emb.to(dtype).T
        index = ids if queries.dim() == 2 else ids[:, None, :].expand(-1, queries.shape[1], -1)
        return scores.gather(-1, index)
    (rows,) = gather_rows(item_emb, [ids], dtype)
    if queries.dim() == 2:
        return torch.einsum("qd,qcd->qc", queries, rows)
    return torch.einsum("qkd,qcd->qkc", queries, rows)


def without_autocast(loss: Callable[_Params, _Result]) -> Callable[_Params, _Result]:
    """Run a loss function with autocast off on the device of its first argument (the query).

    The losses cast their inputs to :func:`~recsys_midx.scoring.compute_dtype`; inside an autocast
    region their products would still be lowered to half precision, which at large norms reorders
    scores and overflows the normaliser's backward.
    """

    @functools.wraps(loss)
    def wrapper(*args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
        with torch.autocast(args[0].device.type, enabled=False):
            return loss(*args, **kwargs)

    return wrapper


def check_scoring_inputs(query: Tensor, item_emb: Tensor, targets: Tensor) -> None:
    """Check the inputs every softmax loss shares.

    Raises:
        ValueError: unless ``query`` is a floating ``[Q, D]`` tensor, ``item_emb`` a floating
            ``[N+1, D]`` tensor with ``N >= 1``, and ``targets`` an integer ``[Q]`` tensor of ids
            in ``1..N``.
    """
    if not (query.is_floating_point() and item_emb.is_floating_point()):
        raise ValueError(
            f"query and item_emb must be floating point, got {query.dtype} and {item_emb.dtype}"
        )
    if query.dim() != 2:
        raise ValueError(f"query must have shape [Q, D], got {tuple(query.shape)}")
    if item_emb.dim() != 2 or item_emb.shape[0] < 2 or item_emb.shape[1] != query.shape[1]:
        raise ValueError(
            f"item_emb must have shape [N+1, D] with N >= 1 and D = {query.shape[1]}, "
            f"got {tuple(item_emb.shape)}"
        )
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer ids, got {targets.dtype}")
    if tuple(targets.shape) != (query.shape[0],):
        raise ValueError(f"targets must have shape [{query.shape[0]}], got {tuple(targets.shape)}")
    num_items = item_emb.shape[0] - 1
    if targets.numel() and bool(((targets < 1) | (targets > num_items)).any()):
        raise ValueError(f"targets must lie in 1..{num_items} (0 is padding)")


def full_softmax_loss(
    query: Tensor, item_emb: Tensor, targets: Tensor, chunk_size: int = 32768
) -> Tensor:
    """Per-query cross-entropy of the softmax over all items ``1..N``.

    ``loss[q] = logsumexp_{i=1..N}(query[q] . item_emb[i]) - query[q] . item_emb[targets[q]]``.
    Row ``0`` of ``item_emb`` (padding) is not part of the normaliser. The normaliser
    (:func:`~recsys_midx.scoring.catalog_logsumexp`) is computed ``chunk_size`` items at a time in
    forward and backward, so memory is ``O(Q * chunk_size)`` rather than ``O(Q * N)``.
    Half-precision inputs are computed in float32.

    Args:
        query: ``[Q, D]`` query vectors (already divided by any temperature).
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        chunk_size: items scored at once (on CPU fewer where ``Q`` is large, so that a block of
            scores stays cache-sized); peak extra memory is about ``Q * chunk_size`` floats.

    Returns:
        ``[Q]`` losses (float32, or float64 for float64 inputs).

    Raises:
        ValueError: on malformed shapes, targets outside ``1..N``, or ``chunk_size < 1``.

    Example:
        >>> query, item_emb = torch.randn(4, 8), torch.randn(11, 8)
        >>> targets = torch.tensor([1, 5, 10, 3])
        >>> loss = full_softmax_loss(query, item_emb, targets, chunk_size=4)
        >>> reference = F.cross_entropy(query @ item_emb[1:].T, targets - 1, reduction="none")
        >>> torch.allclose(loss, reference, atol=1e-5)
        True
    """
    check_scoring_inputs(query, item_emb, targets)
    dtype = compute_dtype(query, item_emb)
    query, item_emb = query.to(dtype), item_emb.to(dtype)
    lse = catalog_logsumexp(query, item_emb, chunk_size)
    target_logits = (query * F.embedding(targets, item_emb)).sum(dim=1)
    return lse - target_logits


def head_full_softmax_loss(
    queries: Tensor,
    log_prior: Tensor | None,
    item_emb: Tensor,
    targets: Tensor,
    transform: Transform,
    chunk_size: int = 32768,
) -> Tensor:
    """Per-query exact cross-entropy of a head's model over all items ``1..N``.

    ``loss[q] = -logsumexp_k(log_prior[q, k] + f(s_k(t)) - log sum_i exp f(s_k(i)))`` with
    ``s_k(i) = queries[q, k] . item_emb[i]`` and ``t = targets[q]``; the normalisers come from
    :func:`~recsys_midx.scoring.head_logsumexp` (memory ``O(Q * chunk_size)``, forward and
    backward).

    Args:
        queries: ``[Q, D]`` or ``[Q, K, D]`` scaled queries from the head.
        log_prior: ``[Q, K]`` mixture log-weights, ``None`` for one query per context.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        transform: the head's pointwise transform ``f`` (identity for none).
        chunk_size: items (times components) scored at once.

    Returns:
        ``[Q]`` losses (at least float32).

    Raises:
        ValueError: on malformed shapes, targets outside ``1..N`` or ``chunk_size < 1``.

    Example:
        With one query and the identity it is the plain cross-entropy:

        >>> query, item_emb = torch.randn(4, 8), torch.randn(11, 8)
        >>> targets = torch.tensor([1, 5, 10, 3])
        >>> loss = head_full_softmax_loss(query, None, item_emb, targets, lambda s: s)
        >>> torch.allclose(loss, full_softmax_loss(query, item_emb, targets), atol=1e-5)
        True
    """
    components = as_components(queries)
    check_scoring_inputs(components[:, 0], item_emb, targets)
    lse = head_logsumexp(components, item_emb, transform, chunk_size)
    target_emb = F.embedding(targets, item_emb).to(lse.dtype)
    target_scores = transform((components.to(lse.dtype) * target_emb[:, None]).sum(dim=-1))
    return -mixture_log_prob(target_scores - lse, log_prior)
