"""Argument checks shared by the top-k softmax algorithms."""

from __future__ import annotations

import math

from torch import Tensor


def check_query(A: Tensor, x: Tensor, k: int, temperature: float) -> Tensor:
    """Validate a top-``k`` query ``(A, x)`` and return ``x`` in ``A``'s dtype and device.

    Args:
        A: ``[n, d]`` floating matrix.
        x: ``[d]`` query.
        k: number of classes asked for.
        temperature: softmax temperature.

    Returns:
        ``x`` converted to ``A.dtype`` on ``A.device``.

    Raises:
        ValueError: if ``A`` is not a non-empty floating 2-D tensor, ``x`` is not ``[d]``,
            ``k`` is not in ``1..n`` or ``temperature`` is not finite and positive.
    """
    if A.dim() != 2 or A.shape[0] == 0 or A.shape[1] == 0 or not A.is_floating_point():
        raise ValueError(
            f"A must be a non-empty floating [n, d] tensor, got shape {tuple(A.shape)} "
            f"and dtype {A.dtype}"
        )
    if x.dim() != 1 or x.shape[0] != A.shape[1]:
        raise ValueError(f"x must have shape [{A.shape[1]}], got {tuple(x.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= A.shape[0]:
        raise ValueError(f"k must be an integer in 1..{A.shape[0]}, got {k!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    return x.to(dtype=A.dtype, device=A.device)
