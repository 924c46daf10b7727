"""Inverse-CDF draws shared by the MIDX proposal's stages, vectorised over queries, and the
map from ids to their positions in cell order that those draws index."""

from __future__ import annotations

import torch
from torch import Tensor


def position_of_ids(order: Tensor) -> Tensor:
    """``[N+1]`` the position of each id in ``order`` (ids ``1..N`` in cell order), the inverse
    permutation; 0 for the padding id."""
    positions = torch.zeros(order.numel() + 1, dtype=torch.long, device=order.device)
    positions[order] = torch.arange(order.numel(), device=order.device)
    return positions


def prefix_sum(cum: Tensor, at: Tensor) -> Tensor:
    """Sum of the first ``at`` weights, from an inclusive cumulative sum.

    ``cum`` is ``[N]`` (shared by all queries) or ``[Q, N]`` (one per query, with ``at``
    ``[Q, L]``).
    """
    before = (at - 1).clamp_min(0)
    taken = cum[before] if cum.dim() == 1 else cum.gather(1, before)
    return taken.masked_fill(at == 0, 0.0)


def inverse_cdf(
    masses: Tensor, num_samples: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Indices drawn along the last dim in proportion to non-negative ``masses`` ``[..., C]``.

    Returns ``[..., num_samples]`` indices and the totals ``[..., 1]``. ``masses`` is overwritten
    with its cumsum. Zero-mass entries are never drawn: ``(1 - u) * total`` lies in
    ``(0, total]``, and the first entry whose cumulative mass reaches it has positive mass.
    """
    cdf = masses.cumsum_(-1)
    total = cdf[..., -1:]
    u = torch.rand(
        (*cdf.shape[:-1], num_samples), dtype=cdf.dtype, device=cdf.device, generator=generator
    )
    return torch.searchsorted(cdf, u.neg_().add_(1.0).mul_(total)), total


def draw_weighted(
    cum: Tensor,
    cell_cum: Tensor,
    cells: Tensor,
    offsets: Tensor,
    generator: torch.Generator | None,
) -> Tensor:
    """Positions drawn inside ``cells`` in proportion to the weights whose cumsum is ``cum``.

    Args:
        cum: inclusive cumulative weights in cell order, ``[N]`` or ``[Q, N]`` (float64).
        cell_cum: ``cum`` before each cell start, ``[C+1]`` or ``[Q, C+1]`` (the last entry is
            the total), kept apart so a draw reads the big ``cum`` only in its search.
        cells: ``[Q, M]`` cell indices.
        offsets: ``[C+1]`` cell start positions.
        generator: random generator, or ``None`` for the global one.

    Returns:
        ``[Q, M]`` positions in ``0..N-1``.
    """
    if cell_cum.dim() == 1:
        base, end = cell_cum[cells], cell_cum[cells + 1]
    else:
        base, end = cell_cum.gather(1, cells), cell_cum.gather(1, cells + 1)
    mass = end - base
    u = torch.rand(cells.shape, dtype=cum.dtype, device=cum.device, generator=generator)
    # (1 - u) is in (0, 1]: the target lies in (base, base + mass], so the first position whose
    # cumulative weight reaches it has positive weight. The clamp only absorbs rounding.
    target = base.add_(u.neg_().add_(1.0).mul_(mass))
    return torch.searchsorted(cum, target).clamp_(offsets[cells], offsets[cells + 1] - 1)
