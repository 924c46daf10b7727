"""The answer of a top-k softmax query, shared by the exact and the adaptive algorithms."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class TopKResult:
    """The ``k`` most probable classes of ``softmax(A x / temperature)`` for one query.

    Attributes:
        ids: ``[k]`` long row indices of ``A``, most probable first.
        probs: ``[k]`` estimated (or exact) softmax probabilities of ``ids``.
        logits: ``[k]`` the logits ``A[ids] x / temperature`` (computed exactly by both
            algorithms).
        log_normalizer: 0-d tensor, the (estimated) ``log sum_i exp(logit_i)``;
            ``probs = exp(logits - log_normalizer)``.
        multiplications: number of coordinate products ``A[i, j] * x[j]`` computed.
    """

    ids: Tensor
    probs: Tensor
    logits: Tensor
    log_normalizer: Tensor
    multiplications: int
