"""Resuming: a run killed mid-epoch and resumed with ``resume=auto`` ends exactly where an
uninterrupted run ends; the pieces that make it so (replayable training order, random states,
no checkpoint after an epoch's last batch) each do their part."""

from __future__ import annotations

import csv
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from conftest import CONF_DIR, ROOT, TINY_RUN, sampler_overrides
from hydra import compose, initialize_config_dir

from recsys_midx.app.experiment import build, train
from recsys_midx.data.resumable import EpochShuffle, ResumableLoader
from recsys_midx.lit.checkpointing import resume_checkpoint
from recsys_midx.lit.reliability import capture_random_state, restore_random_state

#: 120 users in batches of 32: 4 training batches (steps) per epoch. A checkpoint every step and
#: MIDX rebuilt every 3 steps, so a resumed run must restore the proposal mid-epoch as well.
RUN = (
    *TINY_RUN,
    *sampler_overrides("midx"),
    "trainer.max_epochs=2",
    "callbacks.step_checkpoint.every_n_train_steps=1",
    "callbacks.sampler_refresh.every_n_steps=3",
)
STEPS_PER_EPOCH = 4


def _config(output_dir: Path, data_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                f"paths.output_dir={output_dir}",
                f"paths.data_dir={data_dir}",
                *RUN,
                *overrides,
            ],
        )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The data folder and the results of an uninterrupted run of ``RUN``."""
    root = tmp_path_factory.mktemp("reference")
    return root / "data", train(_config(root / "run", root / "data"))


#: Both optimizers' states (the dense one's and the item table's) must come back on resume.
SPARSE = ("task.module.table_optimizer=sparse_adam",)


@pytest.fixture(scope="module")
def sparse_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The data folder and the results of an uninterrupted run of ``RUN`` with ``SPARSE``."""
    root = tmp_path_factory.mktemp("sparse_reference")
    return root / "data", train(_config(root / "run", root / "data", *SPARSE))


def _checkpoint_step(path: Path) -> int:
    """The global step of a checkpoint, or -1 while there is none."""
    try:
        return int(torch.load(path, weights_only=True)["global_step"])
    except FileNotFoundError:
        return -1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "overrides"), [("reference", ()), ("sparse_reference", SPARSE)]
)
def test_killed_run_resumes_to_the_metrics_of_an_uninterrupted_run(
    tmp_path, request, fixture, overrides
):
    data_dir, reference = request.getfixturevalue(fixture)

    # Kill train.py with SIGKILL while it is blocked inside the second epoch (tests/pausing.py),
    # after its step checkpoints up to that point are on disk.
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    errors = tmp_path / "train.err"
    paused = tmp_path / "paused"
    kill_at = STEPS_PER_EPOCH + 1
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    with errors.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "train.py",
                *RUN,
                *overrides,
                f"paths.data_dir={data_dir}",
                f"hydra.run.dir={run_dir}",
                "+callbacks.pause._target_=pausing.PauseBeforeStep",
                f"+callbacks.pause.step={kill_at}",
                f"+callbacks.pause.marker={paused}",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=environment,
        )
        deadline = time.monotonic() + 240
        while not paused.exists():
            assert process.poll() is None, f"train.py ended: {errors.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "train.py never reached the second epoch"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (run_dir / "results.json").exists()
    assert _checkpoint_step(last) == kill_at  # mid-epoch: STEPS_PER_EPOCH < kill_at < 2 * ...

    resumed = train(_config(run_dir, data_dir, "resume=auto", *overrides))

    assert resumed["metrics"] == pytest.approx(reference["metrics"], abs=1e-6, rel=0)
    assert resumed["best_epoch"] == reference["best_epoch"]
    assert resumed["epochs_run"] == reference["epochs_run"] == 2
    saved = json.loads((run_dir / "results.json").read_text())
    assert saved["metrics"] == pytest.approx(reference["metrics"], abs=1e-6, rel=0)
    # The interrupted epoch's mean training loss covers its batches before and after the kill.
    assert _losses(run_dir) == _losses(Path(reference["output_dir"]))


def _best_checkpoint_named_in(checkpoint: Path) -> Path:
    """The best checkpoint that ``checkpoint``'s monitoring ModelCheckpoint state names."""
    states = torch.load(checkpoint, weights_only=True)["callbacks"]
    (best,) = [
        state["best_model_path"]
        for key, state in states.items()
        if key.startswith("ModelCheckpoint{'monitor': 'val/")
    ]
    return Path(best)


def _losses(run_dir: Path) -> list[float]:
    with (run_dir / "epochs.csv").open() as handle:
        return [float(row["train/loss"]) for row in csv.DictReader(handle)]


class _Crash(Exception):
    pass


class _CrashInValidation(L.Callback):
    """Fails at the start of an epoch's validation: after its last batch, before its save."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch:
            raise _Crash


@pytest.mark.slow
def test_run_stopped_during_validation_resumes_exactly(tmp_path, reference):
    data_dir, reference = reference
    run_dir = tmp_path / "run"
    experiment = build(_config(run_dir, data_dir))
    experiment.trainer.callbacks.append(_CrashInValidation(epoch=0))
    with pytest.raises(_Crash):
        experiment.trainer.fit(experiment.module, experiment.datamodule)
    # The step checkpoints skip an epoch's last batch: resuming from one taken after it would
    # skip that epoch's validation (Lightning resumes at the next epoch).
    assert _checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == STEPS_PER_EPOCH - 1

    resumed = train(_config(run_dir, data_dir, "resume=auto"))
    assert resumed["metrics"] == pytest.approx(reference["metrics"], abs=1e-6, rel=0)
    assert resumed["epochs_run"] == 2


@pytest.mark.slow
def test_run_continued_from_its_last_validation_ends_as_an_uninterrupted_run(tmp_path, reference):
    # A run stopped after its first epoch (as by a time limit), continued with more epochs:
    # last.ckpt is the save after that epoch's validation, whatever the metric did, and the
    # continued run neither repeats the epoch nor trips early stopping at its end.
    data_dir, reference = reference
    run_dir = tmp_path / "run"
    train(_config(run_dir, data_dir, "trainer.max_epochs=1"))
    assert _checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == STEPS_PER_EPOCH
    # last.ckpt follows the epoch's best checkpoint: had it been written first, it would name
    # the previous best (here none), and a continued run that never improves would test a
    # deleted file, or its best checkpoint would go to a worse epoch.
    assert _best_checkpoint_named_in(run_dir / "checkpoints" / "last.ckpt") == (
        run_dir / "checkpoints" / "best-000.ckpt"
    )

    resumed = train(_config(run_dir, data_dir, "resume=auto"))
    assert resumed["metrics"] == pytest.approx(reference["metrics"], abs=1e-6, rel=0)
    assert resumed["epochs_run"] == 2
    assert _losses(run_dir) == _losses(Path(reference["output_dir"]))


class _CrashBeforeStep(L.Callback):
    """Fails before optimiser step ``step``, after the checkpoints of the steps before it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise _Crash


@pytest.mark.slow
def test_a_run_validating_inside_epochs_resumes_to_the_same_rows(tmp_path, reference):
    # Validation after every two of an epoch's four batches; the run fails between the
    # validations of its second epoch and resumes from the step checkpoint before the failure.
    data_dir, _ = reference
    inside = ("trainer.val_check_interval=2",)
    uninterrupted = train(_config(tmp_path / "uninterrupted", data_dir, *inside))
    run_dir = tmp_path / "run"
    experiment = build(_config(run_dir, data_dir, *inside))
    experiment.trainer.callbacks.append(_CrashBeforeStep(STEPS_PER_EPOCH + 3))
    with pytest.raises(_Crash):
        experiment.trainer.fit(experiment.module, experiment.datamodule)

    resumed = train(_config(run_dir, data_dir, "resume=auto", *inside))
    assert resumed["metrics"] == pytest.approx(uninterrupted["metrics"], abs=1e-6, rel=0)
    assert len(_losses(run_dir)) == 4
    assert _losses(run_dir) == _losses(tmp_path / "uninterrupted")


class _SlowFirstStep(L.Callback):
    """Sleeps before the first training step: a first segment of known minimum length."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 0:
            time.sleep(self.seconds)


@pytest.mark.slow
def test_a_resumed_run_counts_the_training_time_before_its_checkpoint(tmp_path, reference):
    # The first epoch runs (and is checkpointed) in one process, the second after a resume:
    # train_wall_seconds is the training time of both, not of the last segment only.
    data_dir, _ = reference
    run_dir = tmp_path / "run"
    pause = 3.0
    experiment = build(_config(run_dir, data_dir, "trainer.max_epochs=1"))
    experiment.trainer.callbacks.append(_SlowFirstStep(pause))
    started = time.perf_counter()
    experiment.trainer.fit(experiment.module, experiment.datamodule)
    first_segment = time.perf_counter() - started

    started = time.perf_counter()
    resumed = train(_config(run_dir, data_dir, "resume=auto"))
    second_segment = time.perf_counter() - started

    assert resumed["epochs_run"] == 2
    assert pause < resumed["train_wall_seconds"] < first_segment + second_segment


def test_resume_auto_without_a_checkpoint_starts_fresh(tmp_path, caplog):
    config = _config(tmp_path / "run", tmp_path / "data", "trainer.max_epochs=1")
    experiment = build(config)
    with caplog.at_level(logging.INFO, logger="recsys_midx.lit.checkpointing"):
        assert resume_checkpoint("auto", experiment.trainer) is None
    assert "no last checkpoint" in caplog.text and "starting a fresh run" in caplog.text
    assert str(tmp_path / "run" / "checkpoints") in caplog.text


def test_resume_from_a_path_takes_it_and_names_a_missing_one(tmp_path):
    trainer = L.Trainer(logger=False)
    given = tmp_path / "epoch-3.ckpt"
    given.write_bytes(b"")
    assert resume_checkpoint(str(given), trainer) == given
    with pytest.raises(FileNotFoundError, match="resume=.*nope.ckpt: no such checkpoint"):
        resume_checkpoint(str(tmp_path / "nope.ckpt"), trainer)


def test_epoch_order_depends_only_on_seed_and_epoch():
    sampler = EpochShuffle(range(50), seed=3)
    orders = []
    for epoch in (0, 1, 0):
        sampler.set_epoch(epoch)
        torch.manual_seed(epoch)  # the global state must not matter
        orders.append(list(sampler))
    assert orders[0] == orders[2] != orders[1]
    assert sorted(orders[1]) == list(range(50))
    assert list(EpochShuffle(range(50), seed=4)) != orders[0]


def test_loader_resumes_mid_epoch_and_starts_the_next_epoch_after_a_full_one():
    torch.manual_seed(0)
    loader = ResumableLoader(range(10), batch_size=3, shuffle=True)
    epochs = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        epochs.append([batch.tolist() for batch in loader])

    torch.manual_seed(0)
    resumed = ResumableLoader(range(10), batch_size=3, shuffle=True)
    resumed.load_state_dict({"epoch": 1, "batches_yielded": 2})
    rest = [batch.tolist() for batch in resumed]
    assert rest == epochs[1][2:]
    assert resumed.state_dict() == {"epoch": 1, "batches_yielded": 4}

    complete = ResumableLoader(range(10), batch_size=3, shuffle=True)
    complete.load_state_dict({"epoch": 0, "batches_yielded": 4})  # nothing to skip
    assert len([batch for batch in complete]) == 4


def test_loader_never_draws_from_the_global_random_state():
    loader = ResumableLoader(range(10), batch_size=3, shuffle=True, num_workers=0)
    before = torch.get_rng_state()
    for _ in loader:
        pass
    assert torch.equal(torch.get_rng_state(), before)


def test_random_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    torch.save(capture_random_state(), tmp_path / "state.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(2)
    np.random.seed(2)
    random.seed(2)
    restore_random_state(torch.load(tmp_path / "state.pt", weights_only=True))
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]
