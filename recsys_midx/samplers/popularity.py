"""Popularity sampler: ``q(i) ∝ (count_i + smoothing) ** alpha``, independent of the query."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .base import Sampler
from .uniform import RANDOM_RANGE, random_int62

_LOG_RANGE = math.log(RANDOM_RANGE)


class PopularitySampler(Sampler):
    """Draws negatives with probability ``q(i) ∝ w_i = (count_i + smoothing) ** alpha``.

    ``alpha = 0.75`` is the word2vec unigram flattening; ``alpha = 0`` is uniform and ``alpha = 1``
    follows raw popularity. The padding id ``0`` has weight ``0``.

    The distribution is stored as integer cumulative weights: item ``i`` owns the integer interval
    ``[cum[i], cum[i+1])`` of ``[0, 2**62)``, whose width is ``w_i`` rescaled and rounded (items
    with ``w_i > 0`` keep a width of at least 1). Sampling draws a uniform integer and locates it
    with ``torch.searchsorted`` (``O(M log N)`` per query), and ``log q`` is recomputed from the
    same widths, so the reported ``log q`` is exactly the probability used to sample. Integers also
    keep the table intact when the enclosing model is cast to bf16/fp16 with ``.to(dtype)``, which
    would silently coarsen a floating-point CDF.

    Args:
        num_items: ``N``, the number of real items.
        num_negatives: ``M``, negatives the objective draws per query.
        alpha: exponent applied to the smoothed counts.
        smoothing: added to every count before the exponent, so unseen items stay reachable.

    Raises:
        ValueError: if ``alpha`` is not finite, ``smoothing`` is negative or not finite, or on the
            conditions of :class:`Sampler`.

    Example:
        >>> sampler = PopularitySampler(num_items=4, num_negatives=2, alpha=1.0, smoothing=0.0)
        >>> sampler.update(torch.zeros(5, 8), torch.tensor([0, 1, 1, 2, 4]))
        >>> sampler.log_prob(torch.zeros(1, 8), torch.tensor([[1, 4]])).exp()
        tensor([[0.1250, 0.5000]])
    """

    query_independent = True

    def __init__(
        self, num_items: int, num_negatives: int = 100, alpha: float = 0.75, smoothing: float = 1.0
    ) -> None:
        super().__init__(num_items, num_negatives)
        if not math.isfinite(alpha):
            raise ValueError(f"alpha must be finite, got {alpha}")
        if not (math.isfinite(smoothing) and smoothing >= 0):
            raise ValueError(f"smoothing must be finite and >= 0, got {smoothing}")
        self.alpha = float(alpha)
        self.smoothing = float(smoothing)
        # cum_weights[k] = sum of the integer widths of ids < k, for k in 0..N+1; all zero until
        # update() runs.
        self.register_buffer("cum_weights", torch.zeros(num_items + 2, dtype=torch.int64))
        # Mirrors "update() has run" on the host, so sample() needs no device sync to check it.
        self._ready = False
        self.register_load_state_dict_post_hook(_refresh_ready)

    @torch.no_grad()
    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """Rebuild the distribution from item counts.

        Args:
            item_emb: ``[N+1, D]`` item table; only its number of rows is checked.
            item_counts: ``[N+1]`` non-negative counts (index ``0``, padding, is ignored).

        Raises:
            ValueError: if ``item_counts`` is ``None``, shapes do not match ``N``, counts are
                negative or not finite, or the resulting weights are not finite or all zero.
        """
        if item_counts is None:
            raise ValueError("PopularitySampler.update needs item_counts, got None")
        if item_emb.dim() != 2 or item_emb.shape[0] != self.num_items + 1:
            raise ValueError(
                f"item_emb must have shape [N+1, D] = [{self.num_items + 1}, D], "
                f"got {tuple(item_emb.shape)}"
            )
        # Built on the CPU in float64: runs rarely, and not every accelerator has float64.
        weights = popularity_weights(
            item_counts.to("cpu"), self.num_items, self.alpha, self.smoothing
        )
        self.cum_weights.copy_(_cumulative_widths(weights[1:]))
        self._ready = True

    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        points = random_int62((query.shape[0], num_samples), query.device, generator)
        # The id whose interval [cum[i], cum[i+1]) holds the point. Id 0 has an empty interval at
        # 0, so the search never lands on it; the clamp only guards the contract.
        ids = torch.searchsorted(self.cum_weights, points, right=True).sub_(1)
        ids.clamp_(1, self.num_items)
        return ids, self._log_prob(query, ids)

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        # index_select on the flattened ids: much faster on CPU than advanced indexing.
        flat = ids.reshape(-1).long()
        widths = self.cum_weights.index_select(0, flat + 1) - self.cum_weights.index_select(0, flat)
        return widths.double().log_().sub_(_LOG_RANGE).float().view(ids.shape)

    def _check_ready(self) -> None:
        if not self._ready:
            raise RuntimeError(
                "PopularitySampler has no distribution yet: "
                "call update(item_emb, item_counts) first"
            )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}, smoothing={self.smoothing}"


def popularity_weights(
    item_counts: Tensor, num_items: int, alpha: float, smoothing: float
) -> Tensor:
    """Popularity weights ``(count_i + smoothing) ** alpha`` in float64, ``0`` for padding.

    Args:
        item_counts: ``[N+1]`` non-negative interaction counts (index 0, padding, is ignored).
        num_items: ``N``.
        alpha: exponent (0: uniform, 1: proportional to counts).
        smoothing: added to every count, so that unseen items stay drawable when positive.

    Returns:
        ``[N+1]`` float64 weights on the device of ``item_counts``.

    Raises:
        ValueError: if counts are not ``[N+1]``, negative or not finite, or the weights are not
            finite or all zero.
    """
    if tuple(item_counts.shape) != (num_items + 1,):
        raise ValueError(
            f"item_counts must have shape [N+1] = [{num_items + 1}], got {tuple(item_counts.shape)}"
        )
    counts = item_counts.detach().to(torch.float64)
    if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
        raise ValueError("item_counts must be finite and non-negative")
    weights = (counts + smoothing).pow_(alpha)
    weights[0] = 0.0
    if not bool(torch.isfinite(weights).all()) or not float(weights.sum()) > 0:
        raise ValueError(
            f"weights (count + {smoothing}) ** {alpha} must be finite with a positive sum; "
            "use a positive smoothing when some counts are zero"
        )
    return weights


def _cumulative_widths(weights: Tensor) -> Tensor:
    """Integer cumulative table ``[N+2]`` for float64 ``weights`` ``[N]`` of ids ``1..N``.

    Widths are the weights rescaled to sum to ``RANDOM_RANGE`` and rounded; positive weights keep a
    width of at least 1, and the rounding residual (at most about ``N``, against a total of
    ``2**62``) goes to the heaviest item so the total is exactly ``RANDOM_RANGE``.
    """
    widths = torch.round(weights / weights.sum() * RANDOM_RANGE).to(torch.int64)
    widths = torch.where(weights > 0, widths.clamp(min=1), widths)
    widths[torch.argmax(weights)] += RANDOM_RANGE - int(widths.sum())
    return torch.cat([widths.new_zeros(2), torch.cumsum(widths, 0)])


def _refresh_ready(module: PopularitySampler, incompatible_keys: Any) -> None:
    """After ``load_state_dict``: the sampler is ready when the loaded table is non-empty."""
    module._ready = bool(module.cum_weights[-1] > 0)
