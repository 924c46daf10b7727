"""Sigsoftmax (Kanai et al., 2018): ``softmax(z + log sigmoid(z))`` instead of ``softmax(z)``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Head


class SigSoftmaxHead(Head):
    """Deforms each scaled score ``s`` into ``s + log sigmoid(s)``, so ``p ∝ exp(s) sigmoid(s)``.

    The transform is increasing (derivative ``2 - sigmoid(s) > 0``), so rankings are those of the
    plain scores, but it is not affine: the log-probability matrix escapes the rank ``D + 1``
    bound of the softmax. It is computed as ``s + logsigmoid(s)``, never as
    ``log(exp(s) * sigmoid(s))``, which overflows for large ``s`` and underflows for very
    negative ones; half-precision scores are transformed in float32.

    Args:
        temperature: divides the query once; the transform applies to ``z . v / temperature``.

    Raises:
        ValueError: if ``temperature`` is not finite and positive.

    Example:
        >>> head = SigSoftmaxHead()
        >>> scores = torch.tensor([-3.0, 0.0, 3.0])
        >>> torch.allclose(head.transform(scores), torch.log(scores.exp() * scores.sigmoid()))
        True
    """

    name = "sigsoftmax"
    transforms_logits = True

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__(lr=None, temperature=temperature)  # nothing to learn

    def transform(self, scores: Tensor) -> Tensor:
        """``s + logsigmoid(s)``, elementwise, in at least float32."""
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        return scores + F.logsigmoid(scores)
