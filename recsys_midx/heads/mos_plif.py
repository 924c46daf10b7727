"""A mixture of softmaxes whose components each soften their scores by PLIF (Ganea et al., 2019).

The PLIF paper's strongest language model: MoS lifts the rank bound by mixing ``K`` softmaxes,
and PLIF deforms each component's scores by one learnable increasing function shared by all
components.
"""

from __future__ import annotations

from torch import Tensor

from .mos import MoSHead
from .plif import PLIFHead


class MoSPLIFHead(MoSHead):
    """:class:`~recsys_midx.heads.MoSHead`'s queries and prior, each component's scaled scores
    passed through :class:`~recsys_midx.heads.PLIFHead`'s function:
    ``log p(y | h) = logsumexp_k(log pi_k + f(s_k(y)) - log sum_j exp f(s_k(j)))``.

    The function starts as the identity, so training starts from the plain mixture. Unlike PLIF
    alone, the transform changes rankings here (it acts inside the mixture's log-sum-exp):
    evaluation ranks by the transformed mixture (:func:`~recsys_midx.scoring.ranking_queries`).

    Args:
        dim: ``D``, the size of the context and item vectors.
        num_components: ``K``, softmaxes in the mixture (at least 1).
        num_knots: PLIF's number of bins on ``[-bound, bound]``.
        bound: PLIF's ``T``: bins cover ``[-T, T]``, scores outside extend the edge bins.
        lr: learning rate of every parameter of the head (projections, prior and slopes);
            ``None`` uses the optimiser's.
        temperature: divides the component queries once; scores become
            ``z_k . v / temperature``.

    Raises:
        ValueError: on a bad argument of either part (see :class:`~recsys_midx.heads.MoSHead`
            and :class:`~recsys_midx.heads.PLIFHead`).

    Example:
        >>> import torch
        >>> head = MoSPLIFHead(dim=8, num_components=3, num_knots=100, bound=5.0)
        >>> output = head(torch.randn(5, 8))
        >>> output.queries.shape, output.log_prior.shape, output.transform is not None
        (torch.Size([5, 3, 8]), torch.Size([5, 3]), True)
    """

    name = "mos_plif"
    transforms_logits = True

    def __init__(
        self,
        dim: int,
        num_components: int = 4,
        num_knots: int = 10_000,
        bound: float = 20.0,
        lr: float | None = None,
        temperature: float = 1.0,
    ) -> None:
        super().__init__(dim, num_components, lr=lr, temperature=temperature)
        # The slopes train with the rest of this head (its lr), not in a group of their own.
        self.plif = PLIFHead(num_knots=num_knots, bound=bound)

    def transform(self, scores: Tensor) -> Tensor:
        """PLIF's ``f(scores)`` elementwise, in at least float32."""
        return self.plif.transform(scores)
