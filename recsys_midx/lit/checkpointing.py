"""Checkpoint files: atomic writes, weights-only reads with clear errors, and which one to resume.

Lightning (2.6) writes a checkpoint through an fsspec transaction: the bytes go to a file made by
``tempfile.mkstemp()`` in the system temporary folder, then ``shutil.move`` puts it in place.
That is a rename only when the temporary folder and the checkpoint folder share a file system;
otherwise it is a copy, and a run killed during the copy leaves a truncated ``last.ckpt`` in
place of the previous good one. :class:`AtomicCheckpointIO` writes next to the target instead,
flushes the file to disk and renames it over the target in one step.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

log = logging.getLogger(__name__)

#: ``resume`` value that continues from the run directory's last checkpoint, if there is one.
RESUME_AUTO = "auto"


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be loaded: truncated, corrupt, or holding objects that a
    weights-only load refuses to build.

    Args:
        path: the checkpoint file.
        reason: what is wrong with it.
    """

    def __init__(self, path: _PATH, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"cannot load checkpoint {self.path}: {reason}")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Saves checkpoints atomically and loads them with ``torch.load(weights_only=True)``.

    Saving writes a hidden temporary file beside the target, ``fsync``s it and renames it over
    the target with :func:`os.replace`, so the target is at every moment either the previous
    complete checkpoint or the new complete one, even if the process is killed mid-write.

    Loading never unpickles arbitrary objects, whatever the caller asks for: checkpoints hold
    only tensors, numbers, strings and containers, which a weights-only load restores. A file
    that cannot be loaded raises :class:`CheckpointError` naming it. Paths are local files (not
    fsspec URLs such as ``s3://``).

    Example:
        >>> trainer = L.Trainer(plugins=[AtomicCheckpointIO()])
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically.

        Args:
            checkpoint: the state Lightning collected.
            path: the target file; its folder is created if needed.
            storage_options: unsupported, as for Lightning's ``TorchCheckpointIO``.

        Raises:
            TypeError: if ``storage_options`` is given.
        """
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
        ) as handle:
            try:
                torch.save(checkpoint, handle)
                handle.flush()
                # The data must reach the disk before the rename makes it the checkpoint.
                os.fsync(handle.fileno())
            except BaseException:
                handle.close()
                os.unlink(handle.name)
                raise
        os.replace(handle.name, path)

    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = "cpu", weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Load a checkpoint with ``weights_only=True``.

        Args:
            path: the checkpoint file.
            map_location: where tensors go (as for :func:`torch.load`); host memory by default,
                as in Lightning (the strategy moves the restored state to its devices).
            weights_only: ignored: loads are always weights-only.

        Returns:
            The checkpoint's content.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            CheckpointError: the file is truncated or corrupt, or holds objects other than
                tensors, numbers, strings and containers.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            raise CheckpointError(path, _unpickling_reason(path)) from error
        except (RuntimeError, EOFError, OSError, ValueError) as error:
            raise CheckpointError(
                path,
                f"the file is truncated or corrupt ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else 'no detail'})",
            ) from error


def _unpickling_reason(path: Path) -> str:
    """Why a weights-only load refused ``path``: the types it would have to build, if any."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not even a readable archive: corrupt rather than unsafe
        names = []
    if names:
        return (
            f"it holds objects of type {', '.join(names)}, which a weights-only load refuses to "
            "build (loading them would run code from the file)"
        )
    return "the file is truncated or corrupt (it does not unpickle)"


class StepCheckpoint(ModelCheckpoint):
    """A :class:`~lightning.pytorch.callbacks.ModelCheckpoint` that keeps ``last.ckpt`` current:
    written every N training steps and after every validation, never on the last batch of an
    epoch.

    Lightning's own ``save_last`` writes ``last.ckpt`` only when a top-k checkpoint is saved in
    the same step, so after epochs that do not improve the monitored metric it would still hold
    the best epoch, and a resumed run would repeat every epoch since. Saving after validation
    (whatever the metric did) fixes that; it also covers the end of an epoch, where a step save
    is skipped: Lightning resumes a checkpoint taken after an epoch's last batch (but before its
    validation) at the next epoch, so that epoch's validation, its early-stopping update and its
    best-checkpoint candidate would be lost.

    Args:
        **kwargs: passed to :class:`~lightning.pytorch.callbacks.ModelCheckpoint`
            (``every_n_train_steps``, ``save_last``, ...).

    Example:
        ```python
        StepCheckpoint(dirpath="run/checkpoints", every_n_train_steps=1000, save_top_k=0,
                       save_last=True)
        ```
    """

    @override
    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        # Not during sanity checks, nor twice for one step.
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


def resume_checkpoint(resume: str | None, trainer: L.Trainer) -> Path | None:
    """The checkpoint a run continues from, chosen by the ``resume`` setting.

    Args:
        resume: ``None`` (or empty): start fresh; ``"auto"``: the newest ``last.ckpt`` of the
            trainer's checkpoint callbacks (the run directory's ``checkpoints/``), or a fresh
            start if there is none; any other value: the path of a checkpoint file.
        trainer: the trainer whose :class:`~lightning.pytorch.callbacks.ModelCheckpoint`
            callbacks say where checkpoints are written.

    Returns:
        The checkpoint to pass as ``trainer.fit(..., ckpt_path=...)``, or ``None``.

    Raises:
        FileNotFoundError: ``resume`` names a file that does not exist.

    Example:
        ```python
        trainer.fit(module, datamodule, ckpt_path=resume_checkpoint("auto", trainer))
        ```
    """
    if not resume:
        return None
    if resume != RESUME_AUTO:
        path = Path(resume)
        if not path.is_file():
            raise FileNotFoundError(f"resume={resume}: no such checkpoint file")
        log.info("Resuming from %s", path)
        return path
    callbacks = [
        cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath
    ]
    candidates = [
        Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}" for cb in callbacks
    ]
    found = [path for path in candidates if path.is_file()]
    if not found:
        folders = sorted({str(path.parent) for path in candidates}) or ["(no checkpoint folder)"]
        log.info("resume=auto: no last checkpoint in %s; starting a fresh run", ", ".join(folders))
        return None
    path = max(found, key=lambda candidate: candidate.stat().st_mtime_ns)
    log.info("resume=auto: resuming from %s", path)
    return path
