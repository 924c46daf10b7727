"""Chi-square goodness of fit of sampled ids against the probabilities a sampler reports."""

from __future__ import annotations

import torch
from scipy import stats


def chi_square_pvalue(ids: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of draws ``ids`` ``[Q, n]`` (ids ``1..N``) against ``probs`` ``[Q, N]`` (q of
    ``1..N``).

    Bins are (query, item), so a query-independent sampler can pass ``[1, n]`` and ``[1, N]``.
    Rows of ``probs`` are normalised here; bins expecting fewer than ``min_expected`` draws are
    pooled into one, and a draw of an id with zero probability fails the assertion outright.
    """
    num_items = probs.shape[1]
    assert int(ids.min()) >= 1, "padding id drawn"
    observed = torch.zeros(ids.shape[0], num_items + 1, dtype=torch.float64).scatter_add_(
        1, ids, torch.ones(ids.shape, dtype=torch.float64)
    )[:, 1:]
    expected = probs.double() / probs.double().sum(1, keepdim=True) * ids.shape[1]
    small = expected < min_expected
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    assert obs[~keep].sum() == 0, "draws of ids with zero probability"
    return float(stats.chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue)
