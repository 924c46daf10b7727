"""The plain dot-product softmax: scores ``z . v / temperature`` unchanged."""

from __future__ import annotations

from .base import Head


class DotHead(Head):
    """The identity head: the softmax of the plain scaled dot products (the default).

    The objectives recognise it and take their dot-product code paths unchanged.

    Args:
        temperature: divides the query once; scores become ``z . v / temperature``.

    Raises:
        ValueError: if ``temperature`` is not finite and positive.

    Example:
        >>> DotHead(temperature=0.5)
        DotHead(temperature=0.5)
    """

    name = "dot"

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__(lr=None, temperature=temperature)  # nothing to learn
