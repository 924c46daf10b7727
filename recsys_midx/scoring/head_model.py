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
from .mixtures import RankingQueries, as_components, mixture_log_prob

if TYPE_CHECKING:
    # Only for the annotations: the heads sit above catalog scoring and never import it back.
    from recsys_midx.heads import Head


@torch.no_grad()
def ranking_queries(
    head: Head, query: Tensor, item_emb: Tensor, chunk_size: int = 32768
) -> RankingQueries:
    """Queries whose scores rank the catalog as the model's probabilities do, for evaluation.

    A single query ranks items by its dot product whatever the temperature and whatever
    increasing transform the head applies (sigsoftmax, PLIF), so it is returned unscaled (for the
    plain dot product, ``query`` itself). A mixture of softmaxes ranks by
    ``log p(i) = logsumexp_k(log pi_k - lse_k + f(z_k . v_i))``: its scaled component queries are
    returned with log-weights ``log pi_k - lse_k``, the component normalisers computed over the
    whole catalog in chunks, and with the head's transform ``f`` when it has one (MoS with PLIF),
    since inside the log-sum-exp an increasing ``f`` changes the order.
    :func:`~recsys_midx.metrics.target_ranks` and :func:`~recsys_midx.metrics.top_labels` take
    all three.

    Args:
        head: the model's output head.
        query: ``[B, D]`` encoder outputs.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        chunk_size: items scored at once for the normalisers.

    Returns:
        :class:`~recsys_midx.scoring.RankingQueries`: ``[B, D]`` queries alone, or ``[B, K, D]``
        queries with ``[B, K]`` log-weights (and the transform, if any).

    Example:
        >>> from recsys_midx.heads import MoSHead
        >>> ranking = ranking_queries(MoSHead(dim=4, num_components=2),
        ...                           torch.randn(3, 4), torch.randn(11, 4))
        >>> ranking.queries.shape, ranking.log_weights.shape, ranking.transform
        (torch.Size([3, 2, 4]), torch.Size([3, 2]), None)
    """
    queries, log_prior = head.queries(query)
    if queries.dim() == 2:
        return RankingQueries(queries)
    z = queries.float() / head.temperature
    lse = head_logsumexp(z, item_emb, head.transform, chunk_size)
    transform = head.transform if head.transforms_logits else None
    return RankingQueries(z, log_prior.float() - lse, transform)


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
