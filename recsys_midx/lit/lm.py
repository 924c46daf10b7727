"""LightningModule for language modelling: a token stream's next token, with the state carried
across batches, and perplexity from the exact softmax."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from recsys_midx.heads import Head
from recsys_midx.lit.base import CatalogModule, OptimizerFactory
from recsys_midx.metrics import Perplexity
from recsys_midx.models import LSTMLanguageModel, SequenceEncoder
from recsys_midx.protocols import NegativeSampler, NegativesStrategy, Objective
from recsys_midx.scoring import log_probs

#: Builds the learning-rate schedule from the optimiser (a partial ``ReduceLROnPlateau``).
SchedulerFactory = Callable[[Optimizer], ReduceLROnPlateau]


class LMModule(CatalogModule):
    """Trains a language model with a (sampled) softmax over its vocabulary.

    Every position of a stretch ``[B, T]`` is a next-token query. A recurrent model
    (:class:`~recsys_midx.models.LSTMLanguageModel`) carries its state from one stretch to the
    next (truncated backpropagation through time: the state is detached between them) and
    starts every epoch of each stage from zeros; a causal transformer (any
    :class:`~recsys_midx.models.SequenceEncoder`, e.g. ``model=sasrec``) reads each stretch as its
    whole context. Validation and test always score with the exact softmax of the head over the
    whole vocabulary, whatever the training objective, and log ``val/ppl`` and ``val/nll`` (and
    ``test/...``).

    Batches are ``{"inputs": [B, T], "targets": [B, T]}`` as served in order by
    :class:`~recsys_midx.data.lm.LMDataModule`.

    Args:
        encoder: the language model; it owns the token table the objective scores.
        head: the output head (``DotHead()`` for the plain softmax, or PLIF, MoS, ...).
        sampler: the proposal negatives are drawn from; ``None`` for the exact softmax.
        loss: the objective (one target per query); it must accept ``head``.
        optimizer: a callable building the optimiser from parameters (e.g. a partial
            ``torch.optim.SGD``).
        lr_scheduler: a callable building a ``ReduceLROnPlateau`` on ``val/ppl`` from the
            optimiser (the literature's annealing: divide the rate when validation stops
            improving), or ``None``.
        eval_chunk_size: tokens scored at a time for the exact normalisers.
        table_optimizer: ``None`` (dense), ``"sparse_adam"`` or ``"rowwise_adagrad"``: see
            :class:`~recsys_midx.lit.base.CatalogModule`.
        table_lr: the table optimizer's learning rate.
        negatives: per query or shared by the batch (``None``: per query with a sampler, none
            without).

    Raises:
        ValueError: if ``negatives`` reads training sequences (per-sequence draws,
            ``exclude_window``), which a token stream does not have; see
            :class:`~recsys_midx.lit.base.CatalogModule` for the rest.

    Example:
        ```python
        module = LMModule(LSTMLanguageModel(10000, dim=200), DotHead(), None, SoftmaxLoss(),
                          functools.partial(torch.optim.SGD, lr=20.0))
        ```
    """

    def __init__(
        self,
        encoder: LSTMLanguageModel | SequenceEncoder,
        head: Head,
        sampler: NegativeSampler | None,
        loss: Objective,
        optimizer: OptimizerFactory,
        lr_scheduler: SchedulerFactory | None = None,
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
            Perplexity(),
            table_optimizer,
            table_lr,
            negatives=negatives,
        )
        self.lr_scheduler = lr_scheduler
        self.eval_chunk_size = eval_chunk_size
        # Each stage's state after its last stretch (recurrent models only).
        self._states: dict[str, Any] = {}

    def _queries(self, tokens: Tensor, stage: str | None) -> Tensor:
        """``[B, T, D]`` queries of a stretch, continuing ``stage``'s state (``None``: from
        zeros, keeping no state)."""
        if isinstance(self.encoder, SequenceEncoder):
            return self.encoder(tokens)
        queries, state = self.encoder(tokens, self._states.get(stage) if stage else None)
        if stage is not None:
            self._states[stage] = self.encoder.detach_state(state)
        return queries

    def on_train_epoch_start(self) -> None:
        self._states.pop("train", None)

    def on_validation_epoch_start(self) -> None:
        self._states.pop("val", None)

    def on_test_epoch_start(self) -> None:
        self._states.pop("test", None)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        queries = self._queries(batch["inputs"], "train")
        targets = batch["targets"].reshape(-1)
        loss = self.objective(queries.reshape(len(targets), -1), targets)
        self.log(
            "train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(targets)
        )
        return loss

    def encode(self, batch: dict[str, Tensor]) -> Tensor:
        """The query of every position of a stretch, ``[B*T, D]``, from a zero state (what the
        sampler's diagnostics read; the metrics carry the state instead)."""
        queries = self._queries(batch["inputs"], None)
        return queries.reshape(-1, queries.shape[-1])

    def update_metrics(self, metrics: Perplexity, batch: dict[str, Tensor]) -> None:
        """Add the exact negative log-likelihood of every target token of a stretch, the state
        carried from the stage's previous stretch."""
        stage = "test" if metrics is self.test_metrics else "val"
        queries = self._queries(batch["inputs"], stage)
        targets = batch["targets"].reshape(-1, 1)
        log_p = log_probs(
            self.head,
            queries.reshape(len(targets), -1).float(),
            self.encoder.item_table,
            targets,
            self.eval_chunk_size,
        )
        metrics.update(-log_p[:, 0])

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        if self.lr_scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self.lr_scheduler(optimizer), "monitor": "val/ppl"},
        }
