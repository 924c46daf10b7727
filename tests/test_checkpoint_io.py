"""Checkpoint files: atomic writes survive kills and failures, loads are weights-only, a file
that cannot be loaded is named in a clear error, and ``last.ckpt`` follows every epoch."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import ROOT, TINY_RUN, sampler_overrides
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from recsys_midx.app.experiment import train
from recsys_midx.lit.checkpointing import AtomicCheckpointIO, CheckpointError, StepCheckpoint


def _leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.endswith(".tmp"))


def test_save_replaces_the_file_and_leaves_no_temporary(tmp_path):
    io, path = AtomicCheckpointIO(), tmp_path / "sub" / "last.ckpt"
    io.save_checkpoint({"step": torch.tensor(1)}, path)
    io.save_checkpoint({"step": torch.tensor(2)}, path)
    assert io.load_checkpoint(path)["step"] == 2
    assert _leftovers(path.parent) == []


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"step": torch.tensor(1)}, path)

    def write_half_then_fail(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04 partial checkpoint bytes")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", write_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"step": torch.tensor(2)}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path)["step"] == 1
    assert _leftovers(tmp_path) == []


_SAVE_FOREVER = textwrap.dedent("""
    import sys, torch
    from recsys_midx.lit.checkpointing import AtomicCheckpointIO
    io, step = AtomicCheckpointIO(), 0
    while True:
        step += 1
        io.save_checkpoint({"step": torch.tensor(step), "weights": torch.full((4_000_000,), step)},
                           sys.argv[1])
        print(step, flush=True)
""")


@pytest.mark.slow
def test_kill_during_a_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    process = subprocess.Popen(
        [sys.executable, "-c", _SAVE_FOREVER, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "1"  # a first checkpoint is complete
    # SIGKILL while a later checkpoint is being written (its temporary file exists).
    deadline = time.monotonic() + 60
    while not _leftovers(tmp_path):
        assert time.monotonic() < deadline, "no checkpoint write was seen in progress"
        time.sleep(0.001)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    process.stdout.close()
    checkpoint = AtomicCheckpointIO().load_checkpoint(path)
    assert torch.equal(checkpoint["weights"], torch.full((4_000_000,), int(checkpoint["step"])))


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_unreadable_checkpoint_is_named_in_a_clear_error(tmp_path, damage):
    path = tmp_path / "last.ckpt"
    torch.save({"weights": torch.ones(10_000)}, path)
    content = path.read_bytes()
    path.write_bytes(
        {"truncated": content[: len(content) // 2], "empty": b"", "garbage": bytes(range(256)) * 4}[
            damage
        ]
    )
    with pytest.raises(CheckpointError, match="truncated or corrupt") as error:
        AtomicCheckpointIO().load_checkpoint(path)
    assert str(path) in str(error.value)


class _RunsCode:
    """Unpickling this would call ``Path.touch`` on the marker: code execution."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_checkpoint_that_would_run_code_is_refused(tmp_path):
    path, marker = tmp_path / "evil.ckpt", tmp_path / "code-ran"
    torch.save({"state_dict": {}, "payload": _RunsCode(marker)}, path)
    with pytest.raises(CheckpointError, match="weights-only load refuses") as error:
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)  # asks for unsafe: ignored
    assert "builtins.getattr" in str(error.value) and str(path) in str(error.value)
    assert not marker.exists()


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.ckpt does not exist"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "nope.ckpt")


@pytest.mark.slow
def test_resuming_from_a_truncated_checkpoint_names_it_and_writes_no_results(
    compose_config, tmp_path
):
    path = tmp_path / "truncated.ckpt"
    torch.save({"weights": torch.ones(10_000)}, path)
    path.write_bytes(path.read_bytes()[:5000])
    config = compose_config(
        [*TINY_RUN, *sampler_overrides("uniform"), "trainer.max_epochs=1", f"resume={path}"]
    )
    with pytest.raises(CheckpointError, match=f"cannot load checkpoint {path}: .*truncated"):
        train(config)
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.parametrize("best_saves_last", [False, True])
def test_last_checkpoint_follows_epochs_that_do_not_improve(tmp_path, best_saves_last):
    """Lightning's ``save_last`` alone leaves ``last.ckpt`` at the best epoch (the first, with a
    constant metric) until training ends, so a run killed later would resume from there;
    :class:`StepCheckpoint` rewrites it after every validation, whether or not the best
    checkpoint's callback writes ``last.ckpt`` too."""
    folder = tmp_path / "checkpoints"
    seen = _LastCheckpointEpochs(folder / "last.ckpt")
    trainer = L.Trainer(
        max_epochs=3,
        limit_train_batches=2,
        limit_val_batches=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[
            seen,
            ModelCheckpoint(
                dirpath=folder,
                filename="best",
                monitor="score",
                mode="max",
                save_top_k=1,
                save_last=best_saves_last,
                enable_version_counter=False,
            ),
            StepCheckpoint(
                dirpath=folder,
                every_n_train_steps=1000,
                save_top_k=0,
                save_last=True,
                enable_version_counter=False,
            ),
        ],
    )

    trainer.fit(_ConstantScore())

    assert torch.load(folder / "best.ckpt", weights_only=True)["epoch"] == 0
    # (epoch, step) of last.ckpt as epochs 1 and 2 start: the epoch before, 2 steps each.
    assert seen.epochs == [(0, 2), (1, 4)]


class _ConstantScore(BoringModel):
    """Logs the same validation score every epoch: only the first epoch is ever the best."""

    def validation_step(self, batch, batch_idx):
        self.log("score", 1.0)


class _LastCheckpointEpochs(L.Callback):
    """Records ``(epoch, global_step)`` of ``last.ckpt`` as each epoch after the first starts."""

    def __init__(self, path: Path) -> None:
        self.path, self.epochs = path, []

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch:
            state = torch.load(self.path, weights_only=True)
            self.epochs.append((state["epoch"], state["global_step"]))
