"""Callbacks that record a run: one CSV row per epoch with timings, loss and validation metrics."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class EpochLog(Callback):
    """Writes ``epochs.csv``: per epoch, training and validation seconds, mean loss, val metrics.

    The file is rewritten after every epoch, so it is complete up to the last finished epoch even
    if the run is interrupted. Its rows are part of the callback's state, so a resumed run keeps
    the rows of the epochs before the interruption.

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
    def best_row(rows: list[dict[str, float]], monitor: str) -> dict[str, float] | None:
        """The first row with the highest ``monitor`` value (how checkpointing picks the best)."""
        scored = [row for row in rows if monitor in row]
        return max(scored, key=lambda row: row[monitor]) if scored else None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        self._train_seconds = None
        self._loss_sum, self._loss_count = 0.0, 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
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
            self._record(trainer, val_seconds=time.perf_counter() - self._epoch_start
                         - self._train_seconds)

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
            {name: float(value) for name, value in trainer.callback_metrics.items()
             if name.startswith("val/")}
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
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = list(state_dict["rows"])
