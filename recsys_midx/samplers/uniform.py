"""Uniform sampler over the catalog, and the unbiased random-integer source it shares with the
popularity sampler."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Sampler

#: Random integers are drawn from ``[0, 2**62)``. ``torch.randint`` reduces its random words modulo
#: the requested range, which biases ranges that do not divide ``2**32`` (or ``2**64``); a
#: power-of-two range is exact, and reducing it further modulo ``N`` leaves a bias of at most
#: ``N / 2**62`` instead of ``N / 2**32`` (already 0.1% at five million items).
RANDOM_RANGE = 1 << 62


def random_int62(
    shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """Independent uniform int64 integers in ``[0, RANDOM_RANGE)``.

    Args:
        shape: output shape.
        device: device of the output.
        generator: optional random generator (on ``device``) for reproducible draws.

    Returns:
        An int64 tensor of ``shape``.
    """
    return torch.randint(0, RANDOM_RANGE, shape, device=device, generator=generator)


def uniform_log_prob(ids: Tensor, num_items: int) -> Tensor:
    """``log q`` of the uniform distribution over ``1..N``: ``-log N``, and ``-inf`` for padding.

    Args:
        ids: integer tensor of ids in ``0..N``.
        num_items: ``N``.

    Returns:
        float32 tensor shaped like ``ids``.
    """
    log_q = torch.full(ids.shape, -math.log(num_items), dtype=torch.float32, device=ids.device)
    return log_q.masked_fill_(ids == 0, float("-inf"))


class UniformSampler(Sampler):
    """Draws negatives uniformly from ``1..N``, independently of the query: ``q(i) = 1/N``.

    Args:
        num_items: ``N``, the number of real items.
        num_negatives: ``M``, negatives the objective draws per query.

    Raises:
        ValueError: see :class:`Sampler`.

    Example:
        >>> sampler = UniformSampler(num_items=1000, num_negatives=20)
        >>> ids, log_q = sampler.sample(torch.randn(8, 16), 20)
        >>> ids.shape, bool((log_q == -math.log(1000)).all())
        (torch.Size([8, 20]), True)
    """

    query_independent = True

    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        words = random_int62((query.shape[0], num_samples), query.device, generator)
        ids = words.remainder_(self.num_items).add_(1)
        return ids, uniform_log_prob(ids, self.num_items)

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        return uniform_log_prob(ids, self.num_items)
