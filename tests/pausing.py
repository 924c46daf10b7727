"""A callback that freezes a training process at a chosen step, so a test can kill it there."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L


class PauseBeforeStep(L.Callback):
    """Blocks at the start of the batch after ``step`` optimiser steps and announces it.

    The checkpoints of earlier steps are on disk by then, and the process is mid-epoch however
    fast the machine is: a test that waits for ``marker`` and sends SIGKILL never races the run.

    Args:
        step: the global step at which to stop.
        marker: a file created once the process is blocked.
    """

    def __init__(self, step: int, marker: str) -> None:
        self.step = step
        self.marker = Path(marker)

    def on_train_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if trainer.global_step == self.step:
            self.marker.touch()
            while True:  # until killed
                time.sleep(1)
