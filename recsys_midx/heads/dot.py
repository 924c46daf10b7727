"""The plain dot-product softmax: scores ``z . v / temperature`` unchanged."""

from __future__ import annotations

from .base import Head


class DotHead(Head):
    """The identity head: the softmax of the plain scaled dot products (the default).

    The objectives recognise it and take their dot-product code paths unchanged.

    Example:
        >>> from recsys_midx.losses import SoftmaxLoss
        >>> SoftmaxLoss(head=DotHead()).head
        DotHead()
    """
