"""Callbacks of a run: one CSV row per epoch (or per validation) with timings, loss and
validation metrics, and the schedule that rebuilds the sampler (and a refreshable objective)
from the live item table."""

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
    """Writes ``epochs.csv``: a row at every validation, and at the end of every epoch that did
    not end with one, holding the epoch, the training and validation seconds since the previous
    row, the mean training loss of the batches since then and the validation metrics.

    With validation at the end of every epoch (the default) a row is an epoch. With validation
    inside epochs (``trainer.val_check_interval`` as a number of batches or a duration such as
    ``00:00:05:00``) a row is the stretch of training before each validation, so the cumulative
    seconds of the rows still place every validation on the run's clock.

    The file is rewritten after every row, so it is complete up to the last one even if the run
    is interrupted. Its rows, and the running stretch's loss sums and elapsed time, are part of
    the callback's state, so a resumed run keeps the rows before the interruption and completes
    the interrupted stretch's row.

    Args:
        path: the CSV file to write.

    Example:
        >>> trainer = L.Trainer(callbacks=[EpochLog("outputs/run/epochs.csv")])
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, float]] = []
        self._stretch_start = 0.0
        self._train_seconds: float | None = None
        self._batches = 0
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

    @staticmethod
    def epoch_train_seconds(rows: list[dict[str, float]]) -> list[float]:
        """Training seconds of each epoch, its rows summed (an epoch cut short counts as run).

        Example:
            >>> EpochLog.epoch_train_seconds([{"epoch": 0.0, "train_seconds": 2.0},
            ...     {"epoch": 0.0, "train_seconds": 3.0}, {"epoch": 1.0, "train_seconds": 4.0}])
            [5.0, 4.0]
        """
        seconds: dict[float, float] = {}
        for row in rows:
            seconds[row["epoch"]] = seconds.get(row["epoch"], 0.0) + row["train_seconds"]
        return list(seconds.values())

    def _start_stretch(self) -> None:
        self._stretch_start = time.perf_counter()
        self._train_seconds = None
        self._batches, self._loss_sum, self._loss_count = 0, 0.0, 0

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_stretch()

    @override
    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._batches += 1
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._loss_sum += float(loss.detach())
            self._loss_count += 1

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._train_seconds = time.perf_counter() - self._stretch_start

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning runs checkpoint callbacks after the others, so the row is recorded (and the
        # next stretch started) before a checkpoint of this validation is saved: a run resumed
        # from it keeps the row and does not write it again.
        if not trainer.sanity_checking and self._train_seconds is not None:
            self._record(
                trainer,
                val_seconds=time.perf_counter() - self._stretch_start - self._train_seconds,
                validated=True,
            )
            self._start_stretch()

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._batches:  # trained since the last row: the epoch did not end with validation
            self._train_seconds = time.perf_counter() - self._stretch_start
            self._record(trainer, val_seconds=0.0, validated=False)
            self._start_stretch()

    def _record(self, trainer: L.Trainer, val_seconds: float, validated: bool) -> None:
        # The trainer keeps the last validation's metrics: only a row that ends with a
        # validation carries them.
        row = {
            "epoch": float(trainer.current_epoch),
            "train_seconds": self._train_seconds,
            "val_seconds": val_seconds,
            "train/loss": self._loss_sum / max(self._loss_count, 1),
        }
        if validated:
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

    @override
    def state_dict(self) -> dict[str, Any]:
        # The running stretch's batches, loss sums and elapsed time too: a run resumed inside
        # it then reports the whole stretch's mean loss and (about) its training time. Its
        # training seconds are set once its validation has started.
        return {
            "rows": self.rows,
            "batches": self._batches,
            "loss_sum": self._loss_sum,
            "loss_count": self._loss_count,
            "stretch_seconds": time.perf_counter() - self._stretch_start,
            "train_seconds": self._train_seconds,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = list(state_dict["rows"])
        self._batches = state_dict.get("batches", 0)
        self._loss_sum = state_dict.get("loss_sum", 0.0)
        self._loss_count = state_dict.get("loss_count", 0)
        self._stretch_start = time.perf_counter() - state_dict.get("stretch_seconds", 0.0)
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
