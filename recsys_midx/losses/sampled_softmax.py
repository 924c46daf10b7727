"""Sampled softmax with the logQ correction and accidental-hit masking, for the plain dot-product
softmax and for the general form of a head (transformed scores, several queries per context).

Negatives come either per query (``neg_ids`` ``[Q, M]``, each query scoring its own rows) or
shared by the whole batch (``neg_ids`` ``[M]``, see
:func:`~recsys_midx.losses.draw_shared_negatives`), scored for all queries by one matrix product.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..scoring import Transform, as_components, compute_dtype, mixture_log_prob
from .full_softmax import check_scoring_inputs, gather_rows, score_candidates, without_autocast


def check_negatives(
    positives_shape: tuple[int, ...], neg_ids: Tensor, neg_log_q: Tensor, pos_log_q: Tensor
) -> None:
    """Check a sampled loss's negatives and proposal log-probabilities against its positives.

    Args:
        positives_shape: ``(Q,)`` for one target per query, ``(Q, P)`` for padded positives.
        neg_ids: must be integer ids, ``[Q, M]`` per query or ``[M]`` shared by the batch.
        neg_log_q: must have the shape of ``neg_ids``.
        pos_log_q: must have ``positives_shape``.

    Raises:
        ValueError: on any mismatch, naming the offending argument.
    """
    num_queries = positives_shape[0]
    if neg_ids.is_floating_point() or neg_ids.dtype == torch.bool:
        raise ValueError(f"neg_ids must be integer ids, got {neg_ids.dtype}")
    if neg_ids.dim() != 1 and (neg_ids.dim() != 2 or neg_ids.shape[0] != num_queries):
        raise ValueError(
            f"neg_ids must have shape [{num_queries}, M], or [M] when shared by the batch, "
            f"got {tuple(neg_ids.shape)}"
        )
    if neg_log_q.shape != neg_ids.shape:
        raise ValueError(
            f"neg_log_q must have the shape of neg_ids {tuple(neg_ids.shape)}, "
            f"got {tuple(neg_log_q.shape)}"
        )
    if tuple(pos_log_q.shape) != tuple(positives_shape):
        raise ValueError(
            f"pos_log_q must have the shape of the positives {tuple(positives_shape)}, "
            f"got {tuple(pos_log_q.shape)}"
        )


def check_excluded(neg_ids: Tensor, excluded: Tensor | None, num_queries: int) -> None:
    """Check a sampled loss's mask of excluded negatives: ``None`` or boolean ``[Q, M]``.

    Raises:
        ValueError: if ``excluded`` is not a ``[Q, M]`` boolean mask.
    """
    if excluded is None:
        return
    shape = (num_queries, neg_ids.shape[-1])
    if excluded.dtype != torch.bool or tuple(excluded.shape) != shape:
        raise ValueError(
            f"excluded must be a boolean mask of shape {list(shape)}, got {excluded.dtype} "
            f"{list(excluded.shape)}"
        )


def score_negatives(queries: Tensor, neg_emb: Tensor) -> Tensor:
    """Scores of the negatives' rows for ``[Q, D]`` queries or ``[Q, K, D]`` query components.

    Args:
        queries: ``[Q, D]`` or ``[Q, K, D]``.
        neg_emb: ``[Q, M, D]`` rows of each query's own negatives, or ``[M, D]`` rows of negatives
            shared by the batch (then one matrix product, without a per-query copy of the rows).

    Returns:
        ``[Q, M]`` or ``[Q, K, M]`` scores.

    Example:
        >>> queries, shared = torch.randn(3, 2, 4), torch.randn(5, 4)
        >>> per_query = score_negatives(queries, shared.expand(3, 5, 4))
        >>> torch.allclose(score_negatives(queries, shared), per_query, atol=1e-6)
        True
    """
    if neg_emb.dim() == 2:
        return queries @ neg_emb.T
    if queries.dim() == 2:
        return torch.einsum("qd,qmd->qm", queries, neg_emb)
    return torch.einsum("qkd,qmd->qkm", queries, neg_emb)


def accidental_hits(neg_ids: Tensor, positives: Tensor) -> Tensor:
    """``[Q, M]`` true where a negative equals one of the query's positives.

    Args:
        neg_ids: ``[Q, M]`` per-query negatives, or ``[M]`` negatives shared by the batch.
        positives: ``[Q, P]`` positive ids padded with ``0`` (never drawn, so never a hit).

    Returns:
        Boolean ``[Q, M]``.

    Example:
        >>> accidental_hits(torch.tensor([3, 5]), torch.tensor([[5, 0], [1, 2]]))
        tensor([[False,  True],
                [False, False]])
    """
    return (neg_ids[..., None] == positives[:, None, :]).any(dim=2)


def _candidate_scores(
    components: Tensor, item_emb: Tensor, targets: Tensor, neg_ids: Tensor, dtype: torch.dtype
) -> Tensor:
    """``[Q, K, 1 + M]`` scores of the target (column 0) and the negatives for ``[Q, K, D]``
    query components.

    Per-query negatives are scored with the target in one call of
    :func:`~recsys_midx.losses.full_softmax.score_candidates`; shared negatives by one
    ``[Q*K, D] x [D, M]`` product.
    """
    if neg_ids.dim() == 1:
        target_emb, neg_emb = gather_rows(item_emb, [targets, neg_ids], dtype)
        target_scores = torch.einsum("qkd,qd->qk", components, target_emb)
        return torch.cat([target_scores[..., None], score_negatives(components, neg_emb)], dim=-1)
    candidates = torch.cat([targets[:, None], neg_ids], dim=1)
    return score_candidates(components, item_emb, candidates, dtype)


def _candidate_logits(
    components: Tensor,
    item_emb: Tensor,
    targets: Tensor,
    neg_ids: Tensor,
    neg_log_q: Tensor,
    pos_log_q: Tensor,
    dtype: torch.dtype,
    transform: Transform | None = None,
    excluded: Tensor | None = None,
) -> Tensor:
    """``[Q, K, 1 + M]`` logQ-corrected logits ``f(s) - log q`` of the target (column 0) and the
    negatives (``[Q, M]`` per query or ``[M]`` shared), accidental hits and the ``[Q, M]``
    ``excluded`` negatives masked to ``-inf``, for ``[Q, K, D]`` query components."""
    scores = _candidate_scores(components, item_emb, targets, neg_ids, dtype)
    if transform is not None:
        scores = transform(scores)
    per_query_log_q = neg_log_q.expand(targets.shape[0], -1)  # a view: shared [M] to [Q, M]
    log_q = torch.cat([pos_log_q[:, None], per_query_log_q], dim=1).to(dtype)
    masked = neg_ids == targets[:, None]
    if excluded is not None:
        masked = masked | excluded
    masked = F.pad(masked, (1, 0), value=False)
    return (scores - log_q[:, None, :]).masked_fill(masked[:, None, :], float("-inf"))


@without_autocast
def sampled_softmax_loss(
    query: Tensor,
    item_emb: Tensor,
    targets: Tensor,
    neg_ids: Tensor,
    neg_log_q: Tensor,
    pos_log_q: Tensor,
    excluded: Tensor | None = None,
) -> Tensor:
    """Per-query sampled-softmax cross-entropy with the logQ correction.

    With scores ``s(i) = query . item_emb[i]`` the corrected logits are ``o_p = s(p) - log q(p)``
    for the target and ``o_j = s(n_j) - log q(n_j)`` for the negatives, and
    ``loss = logsumexp(o_p, o_1..o_M) - o_p``. Negatives equal to the query's own target
    (accidental hits) are masked to ``-inf``: they would otherwise count the positive twice.
    Computed in float32 (float64 inputs stay float64) whatever the input precision.

    Args:
        query: ``[Q, D]`` query vectors (already divided by any temperature).
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        neg_ids: ``[Q, M]`` negative ids in ``1..N``, or ``[M]`` shared by all queries.
        neg_log_q: normalised ``log q`` of the negatives under the proposal, shaped like
            ``neg_ids``.
        pos_log_q: ``[Q]`` normalised ``log q`` of the targets under the same proposal.
        excluded: ``[Q, M]`` true at negatives left out of the query's normaliser besides its
            accidental hits (``loss.exclude_window``:
            :func:`~recsys_midx.losses.window_exclusion.window_hits`); ``None``: none.

    Returns:
        ``[Q]`` losses.

    Raises:
        ValueError: on malformed shapes or targets outside ``1..N``.

    Example:
        With the whole catalog (N = 3) as negatives and ``q = 1/N``, the loss is the exact
        cross-entropy:

        >>> query, item_emb, targets = torch.randn(2, 8), torch.randn(4, 8), torch.tensor([1, 3])
        >>> neg_ids = torch.tensor([[1, 2, 3], [1, 2, 3]])
        >>> log_q = torch.full((2, 3), -torch.log(torch.tensor(3.0)).item())
        >>> loss = sampled_softmax_loss(query, item_emb, targets, neg_ids, log_q, log_q[:, 0])
        >>> exact = F.cross_entropy(query @ item_emb[1:].T, targets - 1, reduction="none")
        >>> torch.allclose(loss, exact, atol=1e-5)
        True
    """
    check_scoring_inputs(query, item_emb, targets)
    check_negatives(query.shape[:1], neg_ids, neg_log_q, pos_log_q)
    dtype = compute_dtype(query, item_emb)
    check_excluded(neg_ids, excluded, len(query))
    logits = _candidate_logits(
        query.to(dtype)[:, None],
        item_emb,
        targets,
        neg_ids,
        neg_log_q,
        pos_log_q,
        dtype,
        excluded=excluded,
    )[:, 0]
    return torch.logsumexp(logits, dim=1) - logits[:, 0]


@without_autocast
def head_sampled_softmax_loss(
    queries: Tensor,
    log_prior: Tensor | None,
    item_emb: Tensor,
    targets: Tensor,
    neg_ids: Tensor,
    neg_log_q: Tensor,
    pos_log_q: Tensor,
    transform: Transform,
    excluded: Tensor | None = None,
) -> Tensor:
    """Per-query sampled cross-entropy of a head's model, the negatives shared by its components.

    The head's transform comes before the logQ correction: component ``k`` has corrected logits
    ``o_k(i) = f(s_k(i)) - log q(i)`` for the target and the negatives (accidental hits masked),
    its sampled log-probability is ``log p_k(t) = o_k(t) - logsumexp(o_k(t), o_k(n_1..n_M))``,
    and ``loss = -logsumexp_k(log_prior_k + log p_k(t))``. Every component sees the same
    negatives with the same ``log q``, the proposal they were actually drawn from (see
    :func:`~recsys_midx.losses.draw_mixture_negatives`), so each component's normaliser gets its
    own logQ-corrected estimate. Computed in at least float32.

    Args:
        queries: ``[Q, D]`` or ``[Q, K, D]`` scaled queries from the head.
        log_prior: ``[Q, K]`` mixture log-weights, ``None`` for one query per context.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        neg_ids: ``[Q, M]`` negative ids in ``1..N``, or ``[M]`` shared by all queries.
        neg_log_q: normalised ``log q`` of the negatives, shaped like ``neg_ids``.
        pos_log_q: ``[Q]`` normalised ``log q`` of the targets.
        transform: the head's pointwise transform ``f`` (identity for none).
        excluded: ``[Q, M]`` true at negatives left out besides the accidental hits (see
            :func:`sampled_softmax_loss`); ``None``: none.

    Returns:
        ``[Q]`` losses.

    Raises:
        ValueError: on malformed shapes or targets outside ``1..N``.

    Example:
        With the whole catalog (N = 3) as negatives and ``q = 1/N`` it is the exact loss:

        >>> from recsys_midx.losses import head_full_softmax_loss
        >>> queries, log_prior = torch.randn(2, 3, 8), torch.randn(2, 3).log_softmax(-1)
        >>> item_emb, targets = torch.randn(4, 8), torch.tensor([1, 3])
        >>> neg_ids = torch.tensor([[1, 2, 3], [1, 2, 3]])
        >>> log_q = torch.full((2, 3), -torch.log(torch.tensor(3.0)).item())
        >>> loss = head_sampled_softmax_loss(queries, log_prior, item_emb, targets, neg_ids,
        ...                                  log_q, log_q[:, 0], torch.tanh)
        >>> exact = head_full_softmax_loss(queries, log_prior, item_emb, targets, torch.tanh)
        >>> torch.allclose(loss, exact, atol=1e-5)
        True
    """
    components = as_components(queries)
    check_scoring_inputs(components[:, 0], item_emb, targets)
    check_negatives(components.shape[:1], neg_ids, neg_log_q, pos_log_q)
    dtype = compute_dtype(components, item_emb)
    check_excluded(neg_ids, excluded, len(components))
    logits = _candidate_logits(
        components.to(dtype),
        item_emb,
        targets,
        neg_ids,
        neg_log_q,
        pos_log_q,
        dtype,
        transform,
        excluded,
    )
    return -mixture_log_prob(logits[..., 0] - torch.logsumexp(logits, dim=-1), log_prior)
