"""What ended a run's training, as results.json records it (``stopped_by``)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, Timer

from recsys_midx.app.experiment import stopped_by


class _Flat(L.LightningModule):
    """A module whose validation metric never improves after its first value."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/metric", 1.0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(tmp_path, patience: int, **trainer_args) -> L.Trainer:
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 2)))
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        callbacks=[EarlyStopping("val/metric", patience=patience, mode="max"), Timer()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        **trainer_args,
    )
    trainer.fit(_Flat(), data, data)
    return trainer


@pytest.mark.parametrize("val_check_interval", [5, 1.0], ids=["within-the-first-epoch", "epochs"])
def test_early_stopping_is_named_even_in_the_first_epoch(tmp_path, val_check_interval):
    trainer = _fit(tmp_path, patience=2, max_epochs=10, val_check_interval=val_check_interval)
    assert trainer.current_epoch < 9
    assert stopped_by(trainer) == "early stopping"


def test_a_run_that_used_its_epochs_says_so(tmp_path):
    assert stopped_by(_fit(tmp_path, patience=50, max_epochs=2)) == "max_epochs"


def test_a_run_that_used_its_steps_says_so(tmp_path):
    assert stopped_by(_fit(tmp_path, patience=50, max_steps=7, val_check_interval=5)) == "max_steps"
