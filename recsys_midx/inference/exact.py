"""Exact top-k softmax: one dense matrix-vector product, the baseline of AdaptiveSoftmax."""

from __future__ import annotations

import torch
from torch import Tensor

from recsys_midx.inference.result import TopKResult
from recsys_midx.inference.validation import check_query


@torch.no_grad()
def exact_softmax_topk(A: Tensor, x: Tensor, k: int = 1, *, temperature: float = 1.0) -> TopKResult:
    """The exact top-``k`` classes of ``softmax(A x / temperature)`` and their probabilities.

    Args:
        A: ``[n, d]`` floating matrix of class vectors (e.g. an item table without its padding
            row).
        x: ``[d]`` query, cast to ``A``'s dtype and device.
        k: number of classes returned, ``1 <= k <= n``.
        temperature: divides the logits; finite and positive.

    Returns:
        A :class:`TopKResult` with ``multiplications = n * d``.

    Raises:
        ValueError: on shapes that do not match, ``k`` out of range or a bad temperature.

    Example:
        >>> A = torch.randn(1000, 64); x = A[7] * 3
        >>> exact_softmax_topk(A, x, k=2).ids[0].item()
        7
    """
    x = check_query(A, x, k, temperature)
    logits = (A @ x) / temperature
    log_normalizer = torch.logsumexp(logits, dim=0)
    top_logits, ids = logits.topk(k)
    return TopKResult(
        ids=ids,
        probs=torch.exp(top_logits - log_normalizer),
        logits=top_logits,
        log_normalizer=log_normalizer,
        multiplications=A.shape[0] * A.shape[1],
    )
