"""A head's model over the whole catalog: the queries that rank it and the exact log-probabilities.

Both need the head's normalisers over every item, computed in chunks by
:func:`~recsys_midx.scoring.head_logsumexp`. Evaluation and inference rank with
:func:`ranking_queries`; the softmax-bottleneck diagnostics (:mod:`recsys_midx.analysis`) read
:func:`log_probs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .logsumexp import head_logsumexp
from .mixtures import as_components, mixture_log_prob

if TYPE_CHECKING:
    # Only for the annotations: the heads sit above catalog scoring and never import it back.
    from recsys_midx.heads import Head


@torch.no_grad()
def ranking_queries(
    head: Head, query: Tensor, item_emb: Tensor, chunk_size: int = 32768
) -> tuple[Tensor, Tensor | None]:
    """Queries whose scores rank the catalog as the model's probabilities do, for evaluation.

    A single query ranks items by its dot product whatever the temperature and whatever
    increasing transform the head applies (sigsoftmax, PLIF), so it is returned unscaled (for the
    plain dot product, ``query`` itself). A mixture of softmaxes ranks by
    ``log p(i) = logsumexp_k(log pi_k - lse_k + z_k . v_i)``: its scaled component queries are
    returned with log-weights ``log pi_k - lse_k``, the component normalisers computed over the
    whole catalog in chunks. :func:`~recsys_midx.metrics.target_ranks` and
    :func:`~recsys_midx.metrics.top_labels` take both.

    Args:
        head: the model's output head.
        query: ``[B, D]`` encoder outputs.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        chunk_size: items scored at once for the normalisers.

    Returns:
        ``(queries, None)`` with ``queries`` ``[B, D]``, or ``[B, K, D]`` queries and ``[B, K]``
        log-weights.

    Raises:
        NotImplementedError: for a head with several queries that also transforms scores.

    Example:
        >>> from recsys_midx.heads import MoSHead
        >>> queries, log_weights = ranking_queries(MoSHead(dim=4, num_components=2),
        ...                                        torch.randn(3, 4), torch.randn(11, 4))
        >>> queries.shape, log_weights.shape
        (torch.Size([3, 2, 4]), torch.Size([3, 2]))
    """
    queries, log_prior = head.queries(query)
    if queries.dim() == 2:
        return queries, None
    if head.transforms_logits:
        # Mixture scores are log-sum-exps of dot products: a transform would not fit them.
        raise NotImplementedError(f"{head} both transforms scores and has several queries")
    z = queries.float() / head.temperature
    lse = head_logsumexp(z, item_emb, head.transform, chunk_size)
    return z, log_prior.float() - lse


def log_probs(
    head: Head, query: Tensor, item_emb: Tensor, ids: Tensor, chunk_size: int = 32768
) -> Tensor:
    """Exact ``log p(ids | context)`` of the model, normalised over the whole catalog.

    Differentiable (the normalisers are chunked and checkpointed); used by the
    softmax-bottleneck diagnostics (:mod:`recsys_midx.analysis`).

    Args:
        head: the model's output head.
        query: ``[Q, D]`` encoder outputs.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        ids: item ids in ``1..N``: ``[m]``, the same for every context, or ``[Q, m]``, each
            context's own (a language model's next token: ``[Q, 1]``).
        chunk_size: items scored at once for the normalisers.

    Returns:
        ``[Q, m]`` log-probabilities (at least float32).

    Example:
        >>> from recsys_midx.heads import DotHead
        >>> item_emb = torch.randn(11, 4)
        >>> log_p = log_probs(DotHead(), torch.randn(2, 4), item_emb, torch.arange(1, 11))
        >>> torch.allclose(log_p.exp().sum(1), torch.ones(2))
        True
    """
    queries, log_prior = head.queries(query)
    z = as_components(queries / head.temperature)
    lse = head_logsumexp(z, item_emb, head.transform, chunk_size)  # [Q, K]
    items = item_emb[ids].to(device=z.device, dtype=lse.dtype)  # [m, D] or [Q, m, D]
    if ids.dim() == 1:
        raw = z.to(lse.dtype) @ items.T
    else:
        raw = torch.einsum("qkd,qmd->qkm", z.to(lse.dtype), items)
    scores = head.transform(raw.to(lse.dtype))  # [Q, K, m]
    log_p = (scores - lse[..., None]).transpose(1, 2)  # [Q, m, K]
    return mixture_log_prob(log_p, None if log_prior is None else log_prior[:, None])
