"""Callbacks of a run: one CSV row per epoch with timings, loss and validation metrics, and the
schedule that rebuilds the sampler (and a refreshable objective) from the live item table."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from recsys_midx.lit.base import CatalogModule
from recsys_midx.samplers import proposal_divergence


class EpochLog(Callback):
    """Writes ``epochs.csv``: per epoch, training and validation seconds, mean loss, val metrics.

    The file is rewritten after every epoch, so it is complete up to the last finished epoch even
    if the run is interrupted. Its rows, and the running epoch's loss sums and elapsed time, are
    part of the callback's state, so a resumed run keeps the rows of the epochs before the
    interruption and completes the interrupted epoch's row.

    Args:
        path: the CSV file to write.

    Example:
        >>> trainer = L.Trainer(callbacks=[EpochLog("outputs/run/epochs.csv")])
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, float]] = []
        self._epoch_start = 0.0
        self._train_seconds: float | None = None
        self._loss_sum = 0.0
        self._loss_count = 0

    @staticmethod
    def best_row(
        rows: list[dict[str, float]], monitor: str, mode: str = "max"
    ) -> dict[str, float] | None:
        """The first row with the best ``monitor`` value, the highest (``mode="max"``) or the
        lowest (``"min"``): how checkpointing picks the best."""
        scored = [row for row in rows if monitor in row]
        if not scored:
            return None
        sign = -1.0 if mode == "min" else 1.0
        return max(scored, key=lambda row: sign * row[monitor])

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        self._train_seconds = None
        self._loss_sum, self._loss_count = 0.0, 0

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._loss_sum += float(loss.detach())
            self._loss_count += 1

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._train_seconds = time.perf_counter() - self._epoch_start

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning runs checkpoint callbacks after the others, so the row is recorded before a
        # checkpoint of this epoch is saved and a run resumed from it keeps the row.
        if not trainer.sanity_checking and self._train_seconds is not None:
            self._record(
                trainer, val_seconds=time.perf_counter() - self._epoch_start - self._train_seconds
            )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._train_seconds is None:  # an epoch without validation
            self._train_seconds = time.perf_counter() - self._epoch_start
            self._record(trainer, val_seconds=0.0)

    def _record(self, trainer: L.Trainer, val_seconds: float) -> None:
        row = {
            "epoch": float(trainer.current_epoch),
            "train_seconds": self._train_seconds,
            "val_seconds": val_seconds,
            "train/loss": self._loss_sum / max(self._loss_count, 1),
        }
        row.update(
            {
                name: float(value)
                for name, value in trainer.callback_metrics.items()
                if name.startswith("val/")
            }
        )
        self.rows.append(row)
        if trainer.is_global_zero:
            self._write()

    def _write(self) -> None:
        columns = list(dict.fromkeys(name for row in self.rows for name in row))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)

    def state_dict(self) -> dict[str, Any]:
        # The running epoch's loss sums and elapsed time too: a run resumed mid-epoch then
        # reports the whole epoch's mean loss and (about) its training time. Its training
        # seconds are set once its validation has started: a run resumed from the checkpoint
        # written after validation has recorded the epoch's row already.
        return {
            "rows": self.rows,
            "loss_sum": self._loss_sum,
            "loss_count": self._loss_count,
            "epoch_seconds": time.perf_counter() - self._epoch_start,
            "train_seconds": self._train_seconds,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = list(state_dict["rows"])
        self._loss_sum = state_dict.get("loss_sum", 0.0)
        self._loss_count = state_dict.get("loss_count", 0)
        self._epoch_start = time.perf_counter() - state_dict.get("epoch_seconds", 0.0)
        self._train_seconds = state_dict.get("train_seconds")


class SamplerRefresh(Callback):
    """Rebuilds everything the module builds from the live item table, on a schedule.

    The module's :attr:`~recsys_midx.lit.base.CatalogModule.indexes` (the sampler, and the
    objective when it is refreshable, like EDRep's cluster statistics) are built when fitting
    starts, then rebuilt at the start of every ``every_n_epochs``-th epoch and of every
    ``every_n_steps``-th optimiser step (where both fall together, the step's rebuild follows
    the epoch's: each is counted on its own schedule). A sampler whose
    proposal does not follow the item table (uniform, popularity) rebuilds to the same proposal
    without drawing random numbers, so the schedule does not change its training.
    Each rebuild is timed, and the proposal (of a sampler that samples) is compared with the
    softmax it approximates (KL and effective sample size, see
    :func:`~recsys_midx.samplers.proposal_divergence`) on a fixed set of validation queries.
    Metrics go to the loggers as ``sampler/refresh_seconds``, ``sampler/kl``,
    ``sampler/ess_fraction`` and ``sampler/kl_uniform`` (a uniform proposal's KL on the same
    queries, for scale); :attr:`history` keeps them for the run's results.

    Refreshes happen at the start of an epoch or a step, never at its end, so a run resumed from
    a checkpoint taken at the end of an epoch rebuilds at the same points as an uninterrupted one.

    Args:
        every_n_epochs: rebuild at the start of every this many epochs (0: not by epochs).
        every_n_steps: rebuild at the start of every this many optimiser steps (0: not by
            steps).
        diagnostic_queries: validation queries the proposal is compared on (0 disables the
            comparison, which costs a full pass over the catalog for those queries).

    Raises:
        ValueError: if ``every_n_epochs``, ``every_n_steps`` or ``diagnostic_queries`` is
            negative.

    Example:
        >>> refresh = SamplerRefresh(every_n_epochs=1, every_n_steps=500, diagnostic_queries=256)
        >>> trainer = L.Trainer(callbacks=[refresh])
    """

    def __init__(
        self, every_n_epochs: int = 1, every_n_steps: int = 0, diagnostic_queries: int = 256
    ) -> None:
        for name, value in (
            ("every_n_epochs", every_n_epochs),
            ("every_n_steps", every_n_steps),
            ("diagnostic_queries", diagnostic_queries),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.every_n_epochs = int(every_n_epochs)
        self.every_n_steps = int(every_n_steps)
        self.diagnostic_queries = diagnostic_queries
        self.history: list[dict[str, float]] = []
        self._batch: dict[str, Tensor] | None = None

    @staticmethod
    def _fires(every: int, count: int) -> bool:
        """Whether a schedule of ``every`` (0: none) rebuilds at epoch or step ``count`` (never
        at 0: fitting starts with a build)."""
        return every > 0 and count > 0 and count % every == 0

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: CatalogModule) -> None:
        if self.diagnostic_queries and trainer.datamodule is not None:
            batch = next(iter(trainer.datamodule.val_dataloader()))
            self._batch = {name: value[: self.diagnostic_queries] for name, value in batch.items()}
        if not self.history:  # the build done when fitting started
            self._diagnose(trainer, pl_module, refresh_seconds=None)

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: CatalogModule) -> None:
        if self._fires(self.every_n_epochs, trainer.current_epoch):
            self._refresh(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: CatalogModule, batch: Any, batch_idx: int
    ) -> None:
        if self._fires(self.every_n_steps, trainer.global_step):
            self._refresh(trainer, pl_module)

    def _refresh(self, trainer: L.Trainer, pl_module: CatalogModule) -> None:
        start = time.perf_counter()
        pl_module.refresh_sampler()
        self._diagnose(trainer, pl_module, refresh_seconds=time.perf_counter() - start)

    def _diagnose(
        self, trainer: L.Trainer, pl_module: CatalogModule, refresh_seconds: float | None
    ) -> None:
        metrics = {"step": float(trainer.global_step), "epoch": float(trainer.current_epoch)}
        if refresh_seconds is not None:
            metrics["sampler/refresh_seconds"] = refresh_seconds
        if self._batch is not None and pl_module.sampler is not None:
            divergence = proposal_divergence(
                pl_module.sampler,
                pl_module.proposal_queries(self._batch),
                pl_module.encoder.item_table.detach().float(),
            )
            metrics["sampler/kl"] = divergence["kl"]
            metrics["sampler/ess_fraction"] = divergence["ess_fraction"]
            metrics["sampler/kl_uniform"] = divergence["kl_uniform"]
        self.history.append(metrics)
        for logger in trainer.loggers:
            logger.log_metrics(
                {k: v for k, v in metrics.items() if k.startswith("sampler/")},
                step=trainer.global_step,
            )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict["history"])
