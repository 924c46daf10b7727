"""LightningModule for next-item prediction: encoder + head + sampler + negatives + softmax loss,
full-ranking eval."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from recsys_midx.heads import Head
from recsys_midx.lit.base import CatalogModule, OptimizerFactory
from recsys_midx.metrics import RankingMetrics, target_ranks
from recsys_midx.models import SequenceEncoder
from recsys_midx.protocols import NegativeSampler, NegativesStrategy, Objective


class SeqRecModule(CatalogModule):
    """Trains a sequence encoder with a (sampled) softmax over its own item table.

    Every non-padded position of a training sequence is a next-item query (the last one only
    when a batch's ``targets`` has one column, as ``train_samples=prefixes`` makes). An encoder
    that trains by cloze (``encoder.masked_training``, BERT4Rec) instead masks items of each
    window's last ``L`` items (``targets``) with ``encoder.cloze``; its queries are the masked
    positions, and ``train_samples=prefixes`` is refused. Validation and test rank each user's
    held-out item against the whole catalog and report HR, NDCG and MRR at ``ks``, logged as
    ``val/ndcg@10``, ``test/hr@20``, ...

    Args:
        encoder: turns item sequences into query vectors and owns the item table.
        head: the output head (``DotHead()`` for the plain softmax).
        sampler: the proposal negatives are drawn from; ``None`` for the exact softmax.
        loss: the objective (one target per query); it must accept ``head`` and the
            strategy's negatives.
        optimizer: a callable building the optimiser from parameters (e.g. a partial
            ``torch.optim.Adam``).
        exclude_seen: remove each user's history items from the evaluation ranking.
        ks: cut-offs of the ranking metrics.
        eval_chunk_size: items scored at a time during evaluation (bounds memory).
        table_optimizer: ``None`` (dense), ``"sparse_adam"`` or ``"rowwise_adagrad"``: see
            :class:`~recsys_midx.lit.base.CatalogModule`.
        table_lr: the table optimizer's learning rate; ``None``:
            :func:`~recsys_midx.lit.table_optimizers.default_table_lr`.
        negatives: the strategy drawing each batch's negatives (``None``: per query with a
            sampler, none without); per-sequence strategies get each batch's sequences.

    Raises:
        TypeError: if ``loss`` does not accept ``head``.
        ValueError: if ``loss`` does not score the strategy's negatives (see
            :class:`~recsys_midx.lit.base.CatalogModule`).

    Example:
        ```python
        module = SeqRecModule(SASRec(num_items=1000), DotHead(), UniformSampler(1000),
                              SoftmaxLoss(), functools.partial(torch.optim.Adam, lr=1e-3))
        ```
    """

    reads_windows = True

    def __init__(
        self,
        encoder: SequenceEncoder,
        head: Head,
        sampler: NegativeSampler | None,
        loss: Objective,
        optimizer: OptimizerFactory,
        exclude_seen: bool = True,
        ks: Sequence[int] = (10, 20),
        eval_chunk_size: int = 65536,
        table_optimizer: str | None = None,
        table_lr: float | None = None,
        *,
        negatives: NegativesStrategy | None = None,
    ) -> None:
        super().__init__(
            encoder,
            head,
            sampler,
            loss,
            optimizer,
            RankingMetrics(ks),
            table_optimizer,
            table_lr,
            negatives=negatives,
        )
        self.exclude_seen = exclude_seen
        self.eval_chunk_size = eval_chunk_size

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        query, targets, windows, positions = self.training_batch(batch)
        loss = self.objective(query, targets, windows, positions)
        self.log(
            "train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(targets)
        )
        return loss

    def training_batch(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """What :meth:`objective` (and :meth:`draw_negatives`) take for a training batch.

        Args:
            batch: as for :meth:`_training_queries`.

        Returns:
            ``(query, targets, windows, positions)``: the ``[Q, D]`` training queries, their
            ``[Q]`` targets, the batch's ``[B, W]`` sequences and the ``[B, P]`` mask of where
            the queries sit in them.
        """
        queries, targets, is_query = self._training_queries(batch)
        # Each sequence's items and where its queries sit, for a strategy that draws per
        # sequence or leaves each sequence's items out (negatives.exclude_window).
        windows = torch.cat([batch["inputs"], batch["targets"]], dim=1)
        return queries[is_query], targets[is_query], windows, is_query

    def _training_queries(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """The training queries of a batch, their targets and where they sit.

        Args:
            batch: ``inputs`` ``[B, L]`` and ``targets`` ``[B, L]`` (windows) or ``[B, 1]``
                (prefixes).

        Returns:
            ``(queries, targets, is_query)``: ``[B, P, D]`` query vectors, ``[B, P]`` target ids
            and the ``[B, P]`` boolean mask of the positions that train.

        Raises:
            ValueError: if a cloze encoder gets prefixes (``targets`` of one column).
        """
        inputs, targets = batch["inputs"], batch["targets"]
        if self.encoder.masked_training:
            if targets.shape[1] == 1:
                raise ValueError(
                    f"{type(self.encoder).__name__} trains on whole windows: give batches of "
                    "train_samples=last_window or windows, not prefixes"
                )
            # The window's last L items (targets = window[1:]) with some of them hidden: only
            # the masked positions are queries, each for the item it hides.
            masked, targets = self.encoder.cloze(targets)
            return self.encoder(masked), targets, targets > 0
        if targets.shape[1] == 1:  # one sample per target (prefixes): only the last position
            queries, inputs = self.encoder.encode_last(inputs)[:, None], inputs[:, -1:]
        else:
            queries = self.encoder(inputs)
        # A position trains only when it has both a real input item and a real next item.
        return queries, targets, (targets > 0) & (inputs > 0)

    def encode(self, batch: dict[str, Tensor]) -> Tensor:
        """The query for the item after each user's last input item: ``[B, D]``."""
        if self.encoder.masked_training:
            # A cloze encoder asks for the next item at a mask it appends to the history.
            return self.encoder.encode_last(batch["inputs"])
        # Next-item encoders keep the last position of the full pass: SASRec's cheaper
        # encode_last agrees with it only up to float rounding, and the evaluation stays
        # bit-for-bit what it has been.
        return self.encoder(batch["inputs"])[:, -1]

    def update_metrics(self, metrics: RankingMetrics, batch: dict[str, Tensor]) -> None:
        """Rank each user's target against the whole catalog (history excluded if asked), by
        the model's scores (:meth:`ranking_queries`)."""
        queries, log_weights, transform = self.ranking_queries(
            self.encode(batch), self.eval_chunk_size
        )
        ranks = target_ranks(
            queries,
            self.encoder.item_table,
            batch["targets"],
            batch["history"] if self.exclude_seen else None,
            chunk_size=self.eval_chunk_size,
            log_weights=log_weights,
            transform=transform,
        )
        metrics.update(ranks)
