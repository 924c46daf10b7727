"""What every LightningModule of the toolkit shares: an encoder that owns the item table, a
sampler rebuilt from that table, a softmax objective, the optimiser, and metric logging."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import Any

import lightning as L
import torch
import torchmetrics
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor, nn

from recsys_midx.distributed import broadcast_module_state, raise_on_every_rank
from recsys_midx.heads import optimizer_param_groups
from recsys_midx.losses import CatalogSoftmax
from recsys_midx.samplers import Sampler

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


class CatalogModule(L.LightningModule, abc.ABC):
    """Base of the modules that train an encoder with a (sampled) softmax over its item table.

    It builds the sampler from the live item table when fitting starts (not when a run resumes:
    the checkpoint holds the proposal the interrupted run used), exposes :meth:`refresh_sampler`
    and :meth:`proposal_queries` for :class:`~recsys_midx.lit.callbacks.SamplerRefresh`, builds
    the optimiser, and runs validation and test through :meth:`update_metrics`, logging each
    accumulator's results as ``val/NAME`` and ``test/NAME`` at the end of the epoch.

    Subclasses implement :meth:`training_step`, :meth:`encode` and :meth:`update_metrics`.

    Args:
        encoder: turns a batch into query vectors and owns the item table (``item_table``).
        sampler: proposal of negatives (``exhaustive`` samplers mean the exact softmax).
        loss: the softmax objective; its ``temperature`` scales the queries samplers see.
        optimizer: a callable building the optimiser from parameters (e.g. a partial
            ``torch.optim.Adam``).
        metrics: the evaluation accumulator; validation uses it, test a fresh copy.

    Example:
        >>> class PointModule(CatalogModule):
        ...     def encode(self, batch):
        ...         return self.encoder(batch["x"])
        ...     def training_step(self, batch, batch_idx):
        ...         return self.loss(self.encode(batch), batch["y"], self.encoder.item_table,
        ...                          self.sampler)
        ...     def update_metrics(self, metrics, batch):
        ...         metrics.update(target_ranks(self.encode(batch), self.encoder.item_table,
        ...                                     batch["y"]))
    """

    def __init__(
        self,
        encoder: nn.Module,
        sampler: Sampler,
        loss: CatalogSoftmax,
        optimizer: OptimizerFactory,
        metrics: torchmetrics.Metric,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.sampler = sampler
        self.loss = loss
        self.optimizer_factory = optimizer
        self.val_metrics = metrics
        self.test_metrics = metrics.clone()

    def on_fit_start(self) -> None:
        # A resumed run restores the sampler from its checkpoint: rebuilding it here would give
        # a different proposal from the one the interrupted run was using.
        if self.trainer.ckpt_path is None:
            self.refresh_sampler()

    @torch.no_grad()
    def refresh_sampler(self) -> None:
        """Rebuild the sampler (and a loss with an ``update`` method) from the live item table
        and the training item counts.

        In a multi-process run rank 0 builds the index and broadcasts it, so every rank draws
        from one proposal even where index building is not bit-reproducible (threaded or GPU
        k-means); the other ranks skip the build. The counts cover the whole training set on
        every rank: the data module holds the full split and only its loaders shard.
        """
        # A loss built from the item table too (EDRep's cluster statistics) follows the
        # sampler's schedule: it has the sampler's ``update`` signature.
        rebuilt = [self.sampler]
        if callable(getattr(self.loss, "update", None)):
            rebuilt.append(self.loss)
        error: Exception | None = None
        if self.trainer.is_global_zero:
            counts = getattr(self.trainer.datamodule, "item_counts", None)
            try:
                for module in rebuilt:
                    module.update(
                        self.encoder.item_table.detach().float(),
                        None if counts is None else counts.to(self.device),
                    )
            except Exception as exc:  # re-raised below, on every rank
                error = exc
        raise_on_every_rank(error)
        for module in rebuilt:
            broadcast_module_state(module, src=0)

    @abc.abstractmethod
    def encode(self, batch: dict[str, Any]) -> Tensor:
        """The query vector ``[B, D]`` of each evaluation point of ``batch`` (unscaled)."""

    @abc.abstractmethod
    def update_metrics(self, metrics: torchmetrics.Metric, batch: dict[str, Any]) -> None:
        """Score an evaluation batch against the whole catalog and add it to ``metrics``."""

    @torch.no_grad()
    def proposal_queries(self, batch: dict[str, Any]) -> Tensor:
        """The scaled queries ``z`` the sampler sees for an evaluation batch (dropout off).

        Args:
            batch: an evaluation batch, on any device.

        Returns:
            ``[B, D]`` float32 queries divided by the loss temperature, on the module's device.
        """
        batch = move_data_to_device(batch, self.device)
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            queries = self.encode(batch)
        finally:
            self.encoder.train(was_training)
        sampler_queries = getattr(self.loss, "sampler_queries", None)
        if sampler_queries is None:  # an objective without an output head
            return queries.float() / self.loss.temperature
        # Through the head: MoE's projected query, or MoS's K component queries per point.
        return sampler_queries(queries.float())

    @torch.no_grad()
    def ranking_queries(self, query: Tensor, chunk_size: int) -> tuple[Tensor, Tensor | None]:
        """Queries (and mixture log-weights) that rank the catalog as the model does.

        The objective's head decides (:meth:`~recsys_midx.losses.CatalogSoftmax.ranking_queries`):
        the query itself for the dot product and for increasing logit transforms, the projected
        query for MoE, component queries and log-weights for MoS; objectives without a head rank
        by the query itself.

        Args:
            query: ``[B, D]`` encoder outputs.
            chunk_size: items scored at once where the head needs catalog normalisers.

        Returns:
            ``(queries, log_weights)`` for :func:`~recsys_midx.metrics.target_ranks` and
            :func:`~recsys_midx.metrics.top_labels`.
        """
        head_queries = getattr(self.loss, "ranking_queries", None)
        if head_queries is None:
            return query, None
        return head_queries(query, self.encoder.item_table, chunk_size)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.update_metrics(self.val_metrics, batch)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.update_metrics(self.test_metrics, batch)

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_metrics)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Heads with their own learning rate (PLIF's slopes) get their own parameter group.
        return self.optimizer_factory(optimizer_param_groups(self))

    def _log_metrics(self, prefix: str, metrics: torchmetrics.Metric) -> None:
        self.log_dict({f"{prefix}/{name}": value for name, value in metrics.compute().items()},
                      prog_bar=prefix == "val")
        metrics.reset()
