"""Mixture of softmaxes (Yang et al., 2018): ``K`` component queries and a prior per context."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Head, check_dim


class MoSHead(Head):
    """Turns a context ``h`` into ``K`` queries ``tanh(P_k h + b_k)`` and a prior
    ``pi = softmax(U h + c)``; ``log p(y | h) = logsumexp_k(log pi_k + log softmax_k(y))``.

    Each component is a full softmax over the catalog with its own normaliser; the mixture of
    their log-probabilities is not a log-linear model, so its log-probability matrix is not
    bound to rank ``D + 1``. The mixture changes rankings, so evaluation scores the catalog with
    the mixture (:func:`~recsys_midx.scoring.ranking_queries`). With a sampler,
    all components share one set of negatives (see
    :func:`~recsys_midx.losses.draw_mixture_negatives`).

    Args:
        dim: ``D``, the size of the context and item vectors.
        num_components: ``K``, softmaxes in the mixture (at least 1).
        lr: learning rate of the head's parameters; ``None`` uses the optimiser's.
        temperature: divides the component queries once; scores become
            ``z_k . v / temperature``.

    Raises:
        ValueError: if ``dim`` or ``num_components`` is not a positive int, or ``lr`` or
            ``temperature`` is bad.

    Example:
        >>> queries, log_prior = MoSHead(dim=8, num_components=3).queries(torch.randn(5, 8))
        >>> queries.shape, log_prior.shape
        (torch.Size([5, 3, 8]), torch.Size([5, 3]))
    """

    name = "mos"

    def __init__(
        self,
        dim: int,
        num_components: int = 4,
        lr: float | None = None,
        temperature: float = 1.0,
    ) -> None:
        super().__init__(lr=lr, temperature=temperature)
        self.dim = check_dim(dim)
        if (
            isinstance(num_components, bool)
            or not isinstance(num_components, int)
            or num_components < 1
        ):
            raise ValueError(f"num_components must be a positive int, got {num_components!r}")
        self.num_components = num_components
        self.projection = nn.Linear(dim, num_components * dim)
        self.prior = nn.Linear(dim, num_components)

    def queries(self, query: Tensor) -> tuple[Tensor, Tensor]:
        """``[Q, K, D]`` component queries and ``[Q, K]`` prior log-weights."""
        components = torch.tanh(self.projection(query)).unflatten(-1, (self.num_components, -1))
        log_prior = torch.log_softmax(self.prior(query).float(), dim=-1)
        return components, log_prior

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_components={self.num_components}, {super().extra_repr()}"
