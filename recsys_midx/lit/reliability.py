"""Callbacks that make training resumable and fail safely: random states in checkpoints, and a
stop on the first non-finite loss that keeps the last good checkpoint."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import Tensor


def capture_random_state() -> dict[str, Any]:
    """The global random states of torch (CPU and every initialised CUDA device), numpy and
    Python, in a form a weights-only ``torch.load`` restores (tensors, numbers, tuples).

    Returns:
        ``{"torch", "cuda", "numpy", "python"}``; see :func:`restore_random_state`.
    """
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": (
            name,
            torch.from_numpy(keys.astype(np.int64)),
            int(position),
            int(has_gauss),
            float(cached_gaussian),
        ),
        "python": random.getstate(),
    }


def restore_random_state(state: dict[str, Any]) -> None:
    """Set the global random states captured by :func:`capture_random_state`.

    CUDA states are restored for as many devices as both the capture and this process have.

    Args:
        state: what :func:`capture_random_state` returned.
    """
    torch.set_rng_state(state["torch"])
    cuda_states = state["cuda"][: torch.cuda.device_count()] if torch.cuda.is_available() else []
    for device, cuda_state in enumerate(cuda_states):
        torch.cuda.set_rng_state(cuda_state, device)
    name, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state(
        (name, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian)
    )
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


class RandomStateCheckpoint(Callback):
    """Saves the global random states in every checkpoint and restores them when a run resumes.

    Dropout and negative sampling draw from torch's global generator, so a resumed run
    continues the interrupted one exactly only if that generator continues too. The state saved
    is the one at the moment of the checkpoint. It is restored just before the first training
    batch of the resumed run, not when the checkpoint is loaded: between the two, Lightning's
    sanity check and the set-up hooks draw random numbers that the uninterrupted run never drew
    at that point (each new data-loader iterator draws a seed, for instance). Nothing between a
    checkpoint and the next training batch draws from the global generators in an uninterrupted
    run (the training order has its own generator, see
    :class:`~recsys_midx.data.resumable.ResumableLoader`), so the resumed run draws the same
    numbers from there on.

    In a multi-process run the checkpoint holds rank 0's states, which every rank restores: a
    resumed multi-process run is not bit-identical to an uninterrupted one.

    Example:
        >>> trainer = L.Trainer(callbacks=[RandomStateCheckpoint()])
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return capture_random_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._pending is not None:
            restore_random_state(self._pending)
            self._pending = None


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or infinite loss.

    Args:
        value: the loss.
        step: the global step (optimiser steps done before this batch).
        epoch: the epoch.
        batch: the batch index within the epoch.
        checkpoint: the last checkpoint on disk, kept as it was, or ``None``.
    """

    def __init__(
        self, value: float, step: int, epoch: int, batch: int, checkpoint: Path | None
    ) -> None:
        self.value = value
        self.step = step
        self.epoch = epoch
        self.batch = batch
        self.checkpoint = checkpoint
        kept = (
            f"the last good checkpoint is kept: {checkpoint}"
            if checkpoint is not None
            else "no checkpoint had been saved yet"
        )
        super().__init__(
            f"non-finite training loss ({value}) at global step {step} (epoch {epoch}, batch "
            f"{batch}); training stopped before this step's update, {kept}. Lower the learning "
            "rate, clip gradients (trainer.gradient_clip_val) or check the inputs, then resume "
            "with resume=auto."
        )


class StopOnNonFiniteLoss(Callback):
    """Stops training at the first NaN or infinite loss, before it reaches the weights.

    The check runs before the backward pass, so the step that produced the loss never updates
    the model, and no checkpoint is written afterwards: the last checkpoint on disk is the last
    good state, and ``resume=auto`` continues from it. It costs one host synchronisation per
    step (the loss is read back), which Lightning's step logging already pays.

    Raises:
        NonFiniteLossError: from the training loop, naming the step, epoch and batch.

    Example:
        >>> trainer = L.Trainer(callbacks=[StopOnNonFiniteLoss()])
    """

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor
    ) -> None:
        value = float(loss.detach())
        if math.isfinite(value):
            return
        raise NonFiniteLossError(
            value,
            trainer.global_step,
            trainer.current_epoch,
            trainer.fit_loop.epoch_loop.batch_idx,
            _last_checkpoint(trainer),
        )


def _last_checkpoint(trainer: L.Trainer) -> Path | None:
    """The most recently written checkpoint of the trainer's checkpoint callbacks."""
    paths = {
        Path(path)
        for cb in trainer.checkpoint_callbacks
        if isinstance(cb, ModelCheckpoint)
        for path in (cb.last_model_path, cb.best_model_path)
        if path
    }
    existing = [path for path in paths if path.is_file()]
    return max(existing, key=lambda path: path.stat().st_mtime_ns) if existing else None
