"""LightningModule for next-item prediction: encoder + sampler + softmax loss, full-ranking eval."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import lightning as L
import torch
from torch import Tensor

from recsys_midx.losses import SoftmaxLoss
from recsys_midx.metrics import RankingMetrics, target_ranks
from recsys_midx.models import SequenceEncoder
from recsys_midx.samplers import Sampler

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


class SeqRecModule(L.LightningModule):
    """Trains a sequence encoder with a (sampled) softmax over its own item table.

    Every non-padded position of a training sequence is a next-item query. Validation and test
    rank each user's held-out item against the whole catalog and report HR, NDCG and MRR at
    ``ks``, logged as ``val/ndcg@10``, ``test/hr@20``, ...

    Args:
        encoder: turns item sequences into query vectors and owns the item table.
        sampler: proposal of negatives (``exhaustive`` samplers mean the exact softmax).
        loss: the softmax objective.
        optimizer: a callable building the optimiser from parameters (e.g. a partial
            ``torch.optim.Adam``).
        exclude_seen: remove each user's history items from the evaluation ranking.
        ks: cut-offs of the ranking metrics.
        eval_chunk_size: items scored at a time during evaluation (bounds memory).

    Example:
        >>> module = SeqRecModule(SASRec(num_items=1000), UniformSampler(1000), SoftmaxLoss(),
        ...                       functools.partial(torch.optim.Adam, lr=1e-3))
    """

    def __init__(
        self,
        encoder: SequenceEncoder,
        sampler: Sampler,
        loss: SoftmaxLoss,
        optimizer: OptimizerFactory,
        exclude_seen: bool = True,
        ks: Sequence[int] = (10, 20),
        eval_chunk_size: int = 65536,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.sampler = sampler
        self.loss = loss
        self.optimizer_factory = optimizer
        self.exclude_seen = exclude_seen
        self.eval_chunk_size = eval_chunk_size
        self.val_metrics = RankingMetrics(ks)
        self.test_metrics = RankingMetrics(ks)

    def on_fit_start(self) -> None:
        # A resumed run restores the sampler from its checkpoint: rebuilding it here would give
        # a different proposal from the one the interrupted run was using.
        if self.trainer.ckpt_path is None:
            self.refresh_sampler()

    @torch.no_grad()
    def refresh_sampler(self) -> None:
        """Rebuild the sampler from the live item table and the training item counts."""
        counts = getattr(self.trainer.datamodule, "item_counts", None)
        self.sampler.update(
            self.encoder.item_table.detach().float(),
            None if counts is None else counts.to(self.device),
        )

    @torch.no_grad()
    def proposal_queries(self, batch: dict[str, Tensor]) -> Tensor:
        """The scaled queries ``z`` the sampler sees for an evaluation batch (dropout off)."""
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            queries = self.encoder(batch["inputs"].to(self.device))[:, -1]
        finally:
            self.encoder.train(was_training)
        return queries.float() / self.loss.temperature

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        inputs, targets = batch["inputs"], batch["targets"]
        queries = self.encoder(inputs)
        # A position trains only when it has both a real input item and a real next item.
        is_query = (targets > 0) & (inputs > 0)
        loss = self.loss(queries[is_query], targets[is_query], self.encoder.item_table, self.sampler)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True,
                 batch_size=int(is_query.sum()))
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.val_metrics.update(self._ranks(batch))

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.test_metrics.update(self._ranks(batch))

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_metrics)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(self.parameters())

    def _ranks(self, batch: dict[str, Tensor]) -> Tensor:
        queries = self.encoder(batch["inputs"])[:, -1]
        return target_ranks(
            queries,
            self.encoder.item_table,
            batch["targets"],
            batch["history"] if self.exclude_seen else None,
            chunk_size=self.eval_chunk_size,
        )

    def _log_metrics(self, prefix: str, metrics: RankingMetrics) -> None:
        self.log_dict({f"{prefix}/{name}": value for name, value in metrics.compute().items()},
                      prog_bar=prefix == "val")
        metrics.reset()
