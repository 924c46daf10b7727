"""Top-k softmax inference over a trained model's item table, exact or with AdaptiveSoftmax."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from recsys_midx.inference.adaptive_softmax import AdaptiveSoftmax
from recsys_midx.inference.exact import exact_softmax_topk
from recsys_midx.inference.result import TopKResult

if TYPE_CHECKING:
    # Only the type: a trained module comes with Lightning, the top-k algorithms do not need it.
    from recsys_midx.lit.base import CatalogModule

__all__ = ["ItemTableTopK"]


class ItemTableTopK:
    """Top-k items of ``softmax(z . v_i)`` over a trained module's item table rows ``1..N``.

    ``z`` is the module's scaled query (``query / head temperature``, as the sampler sees it), so
    the probabilities are those of the trained softmax; returned ids are item ids (``1..N``,
    padding row 0 excluded).

    Args:
        module: a trained :class:`~recsys_midx.lit.base.CatalogModule` (e.g. from
            :func:`recsys_midx.app.trained.load_run`).
        eps: multiplicative error of the adaptive probabilities.
        delta: failure probability of the adaptive algorithm.
        init_pulls: coordinates per item in the adaptive pilot.
        variance_scale: multiplies every variance estimate of the adaptive algorithm.

    Raises:
        ValueError: if the model's output head transforms its logits (sigsoftmax, PLIF).

    Example:
        ```python
        head = ItemTableTopK(load_run("outputs/run").module)
        z = head.queries(batch)
        head.adaptive_topk(z[0], k=10).ids
        ```
    """

    def __init__(
        self,
        module: CatalogModule,
        eps: float = 0.3,
        delta: float = 0.1,
        *,
        init_pulls: int = 32,
        variance_scale: float = 1.0,
    ) -> None:
        if module.head.transforms_logits:
            raise ValueError(
                f"the model's head={module.head.name} transforms its logits: its softmax is not "
                "softmax(z . v_i), which AdaptiveSoftmax estimates"
            )
        self.module = module
        table = module.encoder.item_table.detach().float()[1:]
        self.adaptive = AdaptiveSoftmax(
            table, eps, delta, init_pulls=init_pulls, variance_scale=variance_scale
        )

    @property
    def table(self) -> Tensor:
        """``[N, D]`` the item table without its padding row."""
        return self.adaptive.A

    def queries(self, batch: dict[str, Any]) -> Tensor:
        """``[B, D]`` scaled float32 queries of an evaluation batch.

        Raises:
            ValueError: if the model has several queries per point (a mixture head).
        """
        queries = self.module.proposal_queries(batch)
        if queries.dim() != 2:
            raise ValueError(
                f"expected one query per point ([B, D]), got shape {tuple(queries.shape)}: "
                "mixture heads have no single softmax(z . v_i)"
            )
        return queries.to(self.table.device)

    def adaptive_topk(
        self, z: Tensor, k: int = 10, generator: torch.Generator | None = None
    ) -> TopKResult:
        """AdaptiveSoftmax top-``k`` items of one scaled query ``z`` ``[D]`` (ids in ``1..N``)."""
        return _shift_ids(self.adaptive.topk(z, k, generator=generator))

    def exact_topk(self, z: Tensor, k: int = 10) -> TopKResult:
        """Exact top-``k`` items of one scaled query ``z`` ``[D]`` (ids in ``1..N``)."""
        return _shift_ids(exact_softmax_topk(self.table, z, k))


def _shift_ids(result: TopKResult) -> TopKResult:
    """Row ``r`` of the table without padding is item ``r + 1``."""
    return dataclasses.replace(result, ids=result.ids + 1)
