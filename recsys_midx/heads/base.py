"""The head protocol: what sits between the encoder's query vectors and the catalog softmax.

A head changes the model's distribution over items ``p(i | h)`` for a context vector ``h`` in
one or both of two ways, which is all the objectives and the evaluation need to know:

* :meth:`Head.queries` maps ``h`` ``[Q, D]`` to the vectors that are scored against the item
  table: either one query ``[Q, D]`` (a projection such as the mixture of experts) or ``K``
  component queries ``[Q, K, D]`` with the log-weights ``log pi`` ``[Q, K]`` of a mixture of
  softmaxes;
* :meth:`Head.transform` deforms the scaled scores ``s = z . v / temperature`` pointwise (an
  increasing function such as sigsoftmax or PLIF), before the logQ correction of a sampled loss.

The head also defines the score function ``s(z, v) = z . v / temperature``: calling it
(:meth:`Head.forward`) gives a :class:`HeadOutput` whose queries are already divided by its
``temperature``, which is what the objectives, the samplers and the evaluation all see.

With scores ``f(s_k(i))`` of component ``k`` the model is
``log p(i | h) = logsumexp_k(log pi_k + f(s_k(i)) - log sum_j exp f(s_k(j)))``; a single query
means ``K = 1`` and ``log pi = 0``. The base class is the identity on both sides, which is the
plain dot-product softmax; subclasses override one side or both (MoS with PLIF, whose transform
then changes the ranking: :func:`~recsys_midx.scoring.ranking_queries`).

A head may train at its own learning rate (``lr``): :func:`optimizer_param_groups` puts its
parameters in their own optimiser parameter group.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from torch import Tensor, nn


class HeadOutput(NamedTuple):
    """What a head gives the objective for a batch of contexts.

    Attributes:
        queries: scaled queries ``z = q / temperature``: ``[Q, D]`` (one per context) or
            ``[Q, K, D]`` (``K`` mixture components per context).
        log_prior: ``[Q, K]`` normalised mixture log-weights, ``None`` for one query per context.
        transform: the pointwise transform of the scaled scores, ``None`` for the identity (the
            objectives then take their plain dot-product paths).
    """

    queries: Tensor
    log_prior: Tensor | None
    transform: Callable[[Tensor], Tensor] | None


class Head(nn.Module):
    """Base of the output heads; on its own it is the identity (plain dot-product softmax).

    Args:
        lr: learning rate of the head's own parameters; ``None`` trains them at the optimiser's
            learning rate, with the rest of the model.
        temperature: divides the queries once; scores become ``z . v / temperature``.

    Raises:
        ValueError: if ``lr`` is given and not finite and positive, or ``temperature`` is not
            finite and positive.

    Example:
        >>> import torch
        >>> head = Head(temperature=0.5)
        >>> query = torch.randn(4, 8)
        >>> head.queries(query)[0] is query, head.transform(query) is query
        (True, True)
        >>> torch.equal(head(query).queries, query / 0.5)
        True
    """

    #: The head's name in messages, as the ``head`` config group spells it.
    name: ClassVar[str] = "dot"
    #: True when :meth:`transform` is not the identity (the objectives then leave the plain
    #: dot-product fast path).
    transforms_logits: ClassVar[bool] = False

    def __init__(self, lr: float | None = None, temperature: float = 1.0) -> None:
        super().__init__()
        if lr is not None and not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be finite and > 0 (or None), got {lr}")
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {temperature}")
        self.lr = None if lr is None else float(lr)
        self.temperature = float(temperature)

    def forward(self, query: Tensor) -> HeadOutput:
        """The scaled queries, prior and transform the objective scores contexts ``query`` with.

        Args:
            query: ``[Q, D]`` encoder outputs.

        Returns:
            :class:`HeadOutput` with queries divided by the temperature.
        """
        queries, log_prior = self.queries(query)
        return HeadOutput(
            queries / self.temperature,
            log_prior,
            self.transform if self.transforms_logits else None,
        )

    def sampler_queries(self, query: Tensor) -> Tensor:
        """The scaled queries a sampler sees for contexts ``query`` ``[Q, D]``: ``[Q, D]``, or
        ``[Q*K, D]`` (context major) for a head with ``K`` queries per context."""
        queries = self(query).queries
        return queries.reshape(-1, queries.shape[-1])

    def queries(self, query: Tensor) -> tuple[Tensor, Tensor | None]:
        """The vectors scored against the item table for contexts ``query``.

        Args:
            query: ``[Q, D]`` encoder outputs (before the temperature).

        Returns:
            ``(queries, log_prior)``: either ``[Q, D]`` and ``None`` (one query per context), or
            ``[Q, K, D]`` component queries and ``[Q, K]`` normalised mixture log-weights.
        """
        return query, None

    def transform(self, scores: Tensor) -> Tensor:
        """Pointwise increasing transform of scaled scores (any shape); the identity here."""
        return scores

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}" + ("" if self.lr is None else f", lr={self.lr}")


def check_dim(dim: int) -> int:
    """Return ``dim`` if it is a positive int, for heads with projections of the query.

    Raises:
        ValueError: if ``dim`` is not a positive integer.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive int, got {dim!r}")
    return dim


def optimizer_param_groups(module: nn.Module) -> list[dict[str, Any]]:
    """Optimiser parameter groups: one group per head with its own ``lr``, one for the rest.

    Heads without ``lr`` leave their parameters in the first (default) group, so a model
    without such a head gets exactly one group holding ``module.parameters()`` in order.

    Args:
        module: the model (for instance a LightningModule whose objective owns a head).

    Returns:
        ``[{"params": [...]}, {"params": [...], "lr": head.lr}, ...]`` for
        ``torch.optim.Optimizer``.

    Example:
        >>> from recsys_midx.heads import PLIFHead
        >>> model = nn.ModuleDict({"encoder": nn.Linear(4, 4), "head": PLIFHead(lr=0.1)})
        >>> groups = optimizer_param_groups(model)
        >>> [len(group["params"]) for group in groups], groups[1]["lr"]
        ([2, 1], 0.1)
    """
    own_groups = []
    claimed: set[int] = set()
    for sub in module.modules():
        if isinstance(sub, Head) and sub.lr is not None:
            params = [p for p in sub.parameters() if id(p) not in claimed]
            claimed.update(id(p) for p in params)
            if params:
                own_groups.append({"params": params, "lr": sub.lr})
    rest = [p for p in module.parameters() if id(p) not in claimed]
    return [{"params": rest}, *own_groups]
