"""PLIF (Ganea et al., 2019): a learnable piecewise-linear increasing function of the logits.

``K`` knots ``t_j = -T + j * w`` (``w = 2T / K``, ``j = 0..K``) cut ``[-T, T]`` into ``K`` bins;
bin ``j`` has slope ``a_j = softplus(r_j) > 0``. The function is anchored at ``f(-T) = -T`` (the
softmax ignores a common offset) and takes the value ``F_j = -T + w * sum_{i<j} a_i`` at knot
``t_j``, so for a logit ``x`` in bin ``j``: ``f(x) = F_j + a_j (x - t_j)``. Outside ``[-T, T]``
the first and last bins extend linearly with their own slopes, so ``f`` is increasing and
unbounded on both sides.

Forward is a gather of two ``K``-vectors (intercepts and ``a``) at each logit's bin. Backward needs,
for each slope, ``d f(x) / d a_i = w [i < bin(x)] + [i = bin(x)] (x - t_i)``; summing upstream
gradients ``g`` per bin (``G_j``) and then taking a reverse cumulative sum gives
``grad a_i = w * sum_{j > i} G_j + sum_{x in bin i} g (x - t_i)`` with ``O(#logits + K)`` memory,
never a ``[#logits, K]`` tensor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .base import Head


def _bins(x: Tensor, num_bins: int, bound: float) -> Tensor:
    """Bin of each logit, clamped to the edge bins outside ``[-T, T]``, as ``int32``: which
    ``index_select`` takes, in half the memory of ``int64`` kept for backward."""
    position = (x.detach() + bound) / (2.0 * bound / num_bins)
    # Clamped first, the position is non-negative, so truncation is the floor.
    return position.nan_to_num_(nan=0.0).clamp_(0, num_bins - 1).to(torch.int32)


def _knots(num_bins: int, bound: float, device: torch.device) -> Tensor:
    """The knots ``t_j = -T + j * w`` of the ``K`` bins, in float64."""
    width = 2.0 * bound / num_bins
    return torch.arange(num_bins, dtype=torch.float64, device=device) * width - bound


def _at(values: Tensor, bins: Tensor) -> Tensor:
    """``values[bins]`` for a ``[K]`` vector and bins of any shape."""
    return values.index_select(0, bins.reshape(-1)).view(bins.shape)


class PLIFFunction(torch.autograd.Function):
    """``f(x)`` of the module docstring for logits ``x`` (any shape) and slopes ``a`` ``[K]``.

    Example:
        >>> x = torch.linspace(-3, 3, 7, dtype=torch.float64)
        >>> torch.allclose(PLIFFunction.apply(x, torch.ones(4, dtype=torch.float64), 2.0), x)
        True
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, slopes: Tensor, bound: float) -> Tensor:
        num_bins = slopes.shape[0]
        width = 2.0 * bound / num_bins
        bins = _bins(x, num_bins, bound)
        # In bin j, f(x) = F_j + a_j (x - t_j) = c_j + a_j x with the intercept
        # c_j = F_j - a_j t_j. Knot values accumulate K slopes: in float64, so that the identity
        # initialisation stays the identity (c = 0 exactly) even with 10^5 knots.
        exact = slopes.detach().double()
        cumulative = exact.cumsum(0)
        knots = _knots(num_bins, bound, x.device)
        intercepts = (width * (cumulative - exact) - bound) - exact * knots
        ctx.save_for_backward(x, bins, slopes)
        ctx.bound = bound
        return torch.addcmul(
            _at(intercepts.to(x.dtype), bins), _at(slopes.detach().to(x.dtype), bins), x
        )

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, bins, slopes = ctx.saved_tensors
        num_bins = slopes.shape[0]
        width = 2.0 * ctx.bound / num_bins
        grad_x = grad_slopes = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_out * _at(slopes.to(grad_out.dtype), bins)
        if ctx.needs_input_grad[1]:
            flat_bins = bins.reshape(-1)
            upstream = grad_out.reshape(-1)
            knots = _knots(num_bins, ctx.bound, x.device).to(x.dtype)
            offsets = x.detach().reshape(-1) - _at(knots, flat_bins)
            # Sums per bin in the gradient's dtype (float64 would convert every logit's
            # gradient first); the K-long sums below are float64.
            per_bin = upstream.new_zeros(num_bins).index_add_(0, flat_bins, upstream).double()
            own = upstream.new_zeros(num_bins).index_add_(0, flat_bins, offsets.mul_(upstream))
            # sum_{j > i} G_j: reverse cumulative sum, minus the bin itself.
            later = per_bin.flip(0).cumsum(0).flip(0) - per_bin
            grad_slopes = (width * later + own.double()).to(slopes.dtype)
        return grad_x, grad_slopes, None


class PLIFHead(Head):
    """Softmax of a learnable piecewise-linear increasing function of the scaled scores.

    Slopes are ``softplus`` of free parameters, initialised so that every slope is 1: training
    starts from the plain softmax. The function is increasing, so rankings are those of the
    plain scores (evaluation needs no change); it is not affine once trained, so the softmax
    bottleneck (rank ``D + 1`` of the log-probability matrix) no longer binds.

    Args:
        num_knots: ``K``, the number of bins on ``[-T, T]`` (parameters of the head).
        bound: ``T``: bins cover ``[-T, T]``; scaled scores outside extend the edge bins
            linearly. Choose it to cover the scores the model produces.
        lr: learning rate of the slopes (their own optimiser group); ``None`` uses the
            optimiser's.
        temperature: divides the query once; the function applies to ``z . v / temperature``.

    Raises:
        ValueError: if ``num_knots < 1``, ``bound`` is not finite and positive, or ``lr`` or
            ``temperature`` is bad.

    Example:
        >>> head = PLIFHead(num_knots=100, bound=5.0)
        >>> scores = torch.randn(3, 7)
        >>> torch.allclose(head.transform(scores), scores, atol=1e-5)
        True
    """

    name = "plif"
    transforms_logits = True

    def __init__(
        self,
        num_knots: int = 10_000,
        bound: float = 20.0,
        lr: float | None = None,
        temperature: float = 1.0,
    ) -> None:
        super().__init__(lr=lr, temperature=temperature)
        if isinstance(num_knots, bool) or not isinstance(num_knots, int) or num_knots < 1:
            raise ValueError(f"num_knots must be a positive int, got {num_knots!r}")
        if not (math.isfinite(bound) and bound > 0):
            raise ValueError(f"bound must be finite and > 0, got {bound}")
        self.bound = float(bound)
        # softplus(log(e - 1)) = 1: every slope starts at 1, f starts as the identity.
        self.raw_slopes = torch.nn.Parameter(torch.full((num_knots,), math.log(math.e - 1.0)))

    @property
    def num_knots(self) -> int:
        """``K``, the number of bins."""
        return self.raw_slopes.shape[0]

    def slopes(self) -> Tensor:
        """The slopes ``a = softplus(r)`` ``[K]``, all positive."""
        return F.softplus(self.raw_slopes)

    def transform(self, scores: Tensor) -> Tensor:
        """``f(scores)`` elementwise, in at least float32."""
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        return PLIFFunction.apply(scores, self.slopes().to(scores.dtype), self.bound)

    def extra_repr(self) -> str:
        return f"num_knots={self.num_knots}, bound={self.bound}, {super().extra_repr()}"
