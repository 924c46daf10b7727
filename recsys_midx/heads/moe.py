"""Mixture-of-experts projection (Orhan, 2018) between the encoder and the query."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from .base import Head, check_dim

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "identity": lambda x: x,
    "tanh": torch.tanh,
    "relu": torch.relu,
}
_GATES = ("softmax", "constant")


class MoEHead(Head):
    """Replaces the query ``x`` by ``y = sum_k g_k(x) f(W_k x + c_k)``.

    A dense layer's Jacobian can be badly conditioned (saturated units give near-zero singular
    values); summing several experts, each weighted by an input-dependent gate, makes the layer
    better conditioned. The gate is ``softmax(G x + b)`` (``gate="softmax"``) or the constant
    ``1 / K`` (``gate="constant"``); with one expert either gate is 1 and the head is the dense
    layer ``f(W x + c)``. The softmax over the catalog that follows is the plain dot product of
    ``y``, so rankings (and evaluation) use ``y`` as the query.

    Args:
        dim: ``D``, the size of the query (input and output).
        num_experts: ``K``, the number of experts.
        activation: ``f``: ``"identity"``, ``"tanh"`` or ``"relu"``.
        gate: ``"softmax"`` (learned, input-dependent) or ``"constant"``.
        lr: learning rate of the head's parameters; ``None`` uses the optimiser's.
        temperature: divides the projected query once; scores become ``y . v / temperature``.

    Raises:
        ValueError: on a non-positive ``dim``/``num_experts``, an unknown activation or gate,
            or a bad ``lr`` or ``temperature``.

    Example:
        >>> head = MoEHead(dim=8, num_experts=3, activation="tanh")
        >>> query, log_prior = head.queries(torch.randn(5, 8))
        >>> query.shape, log_prior
        (torch.Size([5, 8]), None)
    """

    name = "moe"

    def __init__(
        self,
        dim: int,
        num_experts: int = 4,
        activation: str = "identity",
        gate: str = "softmax",
        lr: float | None = None,
        temperature: float = 1.0,
    ) -> None:
        super().__init__(lr=lr, temperature=temperature)
        self.dim = check_dim(dim)
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        if gate not in _GATES:
            raise ValueError(f"gate must be one of {list(_GATES)}, got {gate!r}")
        self.num_experts = num_experts
        self.activation = activation
        self.gate_kind = gate
        self.experts = nn.Linear(dim, num_experts * dim)
        self.gate = nn.Linear(dim, num_experts) if gate == "softmax" else None

    def gates(self, query: Tensor) -> Tensor:
        """``[Q, K]`` expert weights ``g_k(x)``, summing to 1."""
        if self.gate is None:
            return query.new_full((*query.shape[:-1], self.num_experts), 1.0 / self.num_experts)
        return torch.softmax(self.gate(query), dim=-1)

    def queries(self, query: Tensor) -> tuple[Tensor, None]:
        """The projected query ``[Q, D]``."""
        outputs = _ACTIVATIONS[self.activation](self.experts(query))
        outputs = outputs.unflatten(-1, (self.num_experts, self.dim))
        return (self.gates(query).unsqueeze(-1).to(outputs.dtype) * outputs).sum(dim=-2), None

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_experts={self.num_experts}, activation={self.activation!r}, "
            f"gate={self.gate_kind!r}, {super().extra_repr()}"
        )
