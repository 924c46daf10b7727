"""How far a sampler's proposal is from the softmax it stands in for.

For a query ``z`` let ``p = softmax(z.v)`` over items ``1..N`` and ``q`` the sampler's proposal.
:func:`proposal_divergence` reports, averaged over queries:

* ``kl``: ``KL(p || q) = sum_i p_i (log p_i - log q_i)`` in nats; 0 iff ``q = p``.
* ``ess_fraction``: the effective sample size per draw of the importance weights ``p/q`` under
  ``q``, ``1 / E_q[(p/q)^2] = 1 / sum_i p_i^2 / q_i`` (Kong's ESS, ``(sum w)^2 / sum w^2`` for
  ``M`` draws, in its large-``M`` limit, divided by ``M``). It lies in ``(0, 1]`` and is 1 iff
  ``q = p``; ``1 / ess_fraction - 1`` is the chi-square divergence ``chi2(p || q)``.
* ``ess``: ``num_samples * ess_fraction``, the ESS of ``num_samples`` draws (by default the
  sampler's ``num_negatives``).
* ``kl_uniform``: ``KL(p || uniform) = log N - H(p)``, the divergence a uniform proposal would
  have on the same queries: the yardstick for ``kl``.

Both are exact: ``q`` comes from ``sampler.catalog_log_prob`` (every id), in chunks of queries.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from recsys_midx.samplers.base import Sampler
from recsys_midx.scoring import row_chunks

#: Cap on ``queries x items`` scored at once.
_CHUNK_ELEMENTS = 1 << 22


@torch.no_grad()
def proposal_divergence(
    sampler: Sampler, query: Tensor, item_emb: Tensor, num_samples: int | None = None
) -> dict[str, float]:
    """KL and importance-sampling ESS of ``sampler``'s proposal against ``softmax(query @ v.T)``.

    Args:
        sampler: any :class:`Sampler`, already updated with ``item_emb``.
        query: ``[Q, D]`` scaled queries.
        item_emb: ``[N+1, D]`` item table (row 0 is padding and ignored).
        num_samples: draws per query for ``ess`` (default ``sampler.num_negatives``).

    Returns:
        ``{"kl", "kl_max", "ess_fraction", "ess", "kl_uniform"}``: mean KL over queries (nats),
        the largest per-query KL, mean ESS per draw, mean ESS of ``num_samples`` draws and the
        mean KL of a uniform proposal on the same queries.

    Raises:
        ValueError: if ``item_emb`` does not have ``sampler.num_items + 1`` rows.

    Example:
        >>> from recsys_midx.samplers.midx import MIDXSampler
        >>> items = torch.randn(501, 16)
        >>> sampler = MIDXSampler(500, num_negatives=20, num_codewords=8, last_stage="residual")
        >>> sampler.update(items)
        >>> stats = proposal_divergence(sampler, torch.randn(8, 16), items)
        >>> stats["kl"] < 1e-4
        True
    """
    num_items = sampler.num_items
    if item_emb.shape[0] != num_items + 1:
        raise ValueError(
            f"item_emb must have N+1 = {num_items + 1} rows, got {tuple(item_emb.shape)}"
        )
    items = item_emb[1:].detach().float()
    query = query.detach().float()
    rows = max(1, _CHUNK_ELEMENTS // num_items)
    kl_parts, ratio_parts, neg_entropy_parts = [], [], []
    for _, z in row_chunks(query, rows):
        log_p = torch.log_softmax(z @ items.T, dim=1).double()
        log_q = sampler.catalog_log_prob(z).double()
        p = log_p.exp()
        # p * (log p - log q) with the convention 0 * log 0 = 0 where p underflows.
        kl_parts.append(torch.where(p > 0, p * (log_p - log_q), 0.0).sum(1))
        neg_entropy_parts.append(torch.where(p > 0, p * log_p, 0.0).sum(1))
        ratio_parts.append(torch.exp(2.0 * log_p - log_q).sum(1))
    kl = torch.cat(kl_parts)
    ess_fraction = 1.0 / torch.cat(ratio_parts)
    draws = sampler.num_negatives if num_samples is None else num_samples
    return {
        "kl": float(kl.mean()),
        "kl_max": float(kl.max()),
        "ess_fraction": float(ess_fraction.mean()),
        "ess": float(draws * ess_fraction.mean()),
        "kl_uniform": float(torch.cat(neg_entropy_parts).mean()) + math.log(num_items),
    }
