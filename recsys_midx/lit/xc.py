"""LightningModule for extreme multi-label classification: sparse features -> labels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from recsys_midx.data.xc import XCDataModule
from recsys_midx.heads import Head
from recsys_midx.lit.base import CatalogModule, OptimizerFactory
from recsys_midx.losses import EDRepLoss, MultiLabelSoftmaxLoss
from recsys_midx.metrics import XCMetrics, inverse_propensities, top_labels
from recsys_midx.models import XCEncoder
from recsys_midx.protocols import NegativeSampler, NegativesStrategy


class XCModule(CatalogModule):
    """Trains an :class:`~recsys_midx.models.XCEncoder` with a multi-label (sampled) softmax.

    Each training point is one query whose positives share its negatives
    (:class:`~recsys_midx.losses.MultiLabelSoftmaxLoss`). Validation and test predict the top
    labels of each point over the whole label set (in chunks) and report P@k, nDCG@k and PSP@k,
    logged as ``val/p@1``, ``test/psp@5``, ... PSP weighs labels by their inverse propensities,
    computed from the data module's training label counts when the trainer sets the module up;
    without a data module every label weighs 1.

    Batches are ``{"features": SparseFeatures, "labels": [B, P]}`` as served by
    :class:`~recsys_midx.data.xc.XCDataModule`.

    Args:
        encoder: sparse features -> query vectors; owns the label table.
        head: the output head (``DotHead()`` for the plain softmax).
        sampler: the proposal negatives are drawn from; ``None`` for the exact softmax.
        loss: the multi-label objective; it must accept ``head``.
        optimizer: a callable building the optimiser from parameters (e.g. a partial
            ``torch.optim.Adam``).
        ks: cut-offs of the metrics.
        eval_chunk_size: labels scored at a time during evaluation (bounds memory).
        table_optimizer: ``None`` (dense), ``"sparse_adam"`` or ``"rowwise_adagrad"``: see
            :class:`~recsys_midx.lit.base.CatalogModule`.
        table_lr: the table optimizer's learning rate; ``None``:
            :func:`~recsys_midx.lit.table_optimizers.default_table_lr`.
        negatives: the strategy drawing each batch's negatives, per point or shared by the
            batch (``None``: per point with a sampler, none without).

    Raises:
        TypeError: if ``loss`` is neither a :class:`~recsys_midx.losses.MultiLabelSoftmaxLoss`
            nor an :class:`~recsys_midx.losses.EDRepLoss`, or if it does not accept ``head``.
        ValueError: if ``negatives`` reads training sequences (per-sequence draws,
            ``exclude_window``), which points do not have.

    Example:
        ```python
        module = XCModule(XCEncoder(5000, 1000), DotHead(), UniformSampler(1000),
                          MultiLabelSoftmaxLoss(), functools.partial(torch.optim.Adam, lr=1e-3))
        ```
    """

    inv_propensity: Tensor

    def __init__(
        self,
        encoder: XCEncoder,
        head: Head,
        sampler: NegativeSampler | None,
        loss: MultiLabelSoftmaxLoss | EDRepLoss,
        optimizer: OptimizerFactory,
        ks: Sequence[int] = (1, 3, 5),
        eval_chunk_size: int = 65536,
        table_optimizer: str | None = None,
        table_lr: float | None = None,
        *,
        negatives: NegativesStrategy | None = None,
    ) -> None:
        # EDRepLoss takes [Q, P] positives as well as [Q] targets.
        if not isinstance(loss, (MultiLabelSoftmaxLoss, EDRepLoss)):
            raise TypeError(
                f"XCModule needs a MultiLabelSoftmaxLoss (loss=multilabel_softmax) or an "
                f"EDRepLoss (loss=edrep), got {type(loss).__name__}"
            )
        super().__init__(
            encoder,
            head,
            sampler,
            loss,
            optimizer,
            XCMetrics(ks),
            table_optimizer,
            table_lr,
            negatives=negatives,
        )
        self.eval_chunk_size = eval_chunk_size
        weights = torch.ones(encoder.num_labels + 1)
        weights[0] = 0.0
        # Derived from the training data, not learned: not part of checkpoints.
        self.register_buffer("inv_propensity", weights, persistent=False)

    def setup(self, stage: str) -> None:
        """Weigh PSP@k's labels by their inverse propensities, from the training label counts
        of the trainer's data module and its source's propensity constants.

        Raises:
            TypeError: if the trainer's data module is not an
                :class:`~recsys_midx.data.xc.XCDataModule`.
        """
        datamodule = self.trainer.datamodule
        if datamodule is None:  # driven without a data module: every label keeps weight 1
            return
        if not isinstance(datamodule, XCDataModule):
            raise TypeError(f"XCModule needs an XCDataModule, got {type(datamodule).__name__}")
        weights = inverse_propensities(
            datamodule.item_counts,
            datamodule.num_train_points,
            datamodule.source.propensity_a,
            datamodule.source.propensity_b,
        )
        self.inv_propensity = weights.to(self.inv_propensity)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        labels = batch["labels"]
        loss = self.objective(self.encode(batch), labels)
        self.log(
            "train/loss",
            loss,
            prog_bar=True,
            on_step=True,
            on_epoch=True,
            batch_size=labels.shape[0],
        )
        return loss

    def encode(self, batch: dict[str, Any]) -> Tensor:
        """The query vector of each point: ``[B, D]``."""
        features = batch["features"]
        return self.encoder(features.indices, features.offsets, features.weights)

    def update_metrics(self, metrics: XCMetrics, batch: dict[str, Any]) -> None:
        """Predict each point's top labels over the whole label set, by the model's scores
        (:meth:`ranking_queries`), and score them."""
        queries, log_weights, transform = self.ranking_queries(
            self.encode(batch), self.eval_chunk_size
        )
        _, top_ids = top_labels(
            queries,
            self.encoder.item_table,
            metrics.max_k,
            self.eval_chunk_size,
            log_weights,
            transform,
        )
        metrics.update(top_ids, batch["labels"], self.inv_propensity)
