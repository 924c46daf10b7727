"""The debug modes of ``recsys_midx/conf/debug``: each composes with every task and runs end to
end."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from recsys_midx.app.experiment import train


@pytest.mark.parametrize("task", ["seqrec", "xc"])
def test_debug_modes_compose_with_every_task(compose_config, task: str) -> None:
    default = compose_config([f"task={task}", "debug=default"])
    assert default.trainer.max_epochs == 1
    assert all(default.trainer[f"limit_{split}_batches"] > 0 for split in ("train", "val", "test"))
    assert default.callbacks.progress_bar.refresh_rate == 0
    assert default.task.datamodule.num_workers == 0

    fdr = compose_config([f"task={task}", "debug=fdr"])
    assert fdr.trainer.fast_dev_run is True

    overfit = compose_config([f"task={task}", "debug=overfit"])
    assert overfit.trainer.overfit_batches == 1 and overfit.trainer.max_epochs > 1
    assert overfit.callbacks.early_stopping.patience >= overfit.trainer.max_epochs


def test_debug_wins_over_an_experiment(compose_config) -> None:
    cfg = compose_config(["experiment=synthetic-100k", "debug=default"])
    assert cfg.trainer.max_epochs == 1 and cfg.dataset.num_items == 100_000


@pytest.mark.slow
def test_debug_default_runs_end_to_end_in_seconds(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "train.py",
            "debug=default",
            f"hydra.run.dir={tmp_path / 'run'}",
            f"paths.data_dir={tmp_path / 'data'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["epochs_run"] == 1 and "test/ndcg@10" in results["metrics"]
    assert "optimized_metric val/ndcg@10 = " in completed.stdout
    # The few batches themselves; the process start (imports) is not the debug mode's to cut.
    # Generous so that a busy machine does not fail it.
    assert results["train_wall_seconds"] < 30


def test_debug_fdr_tests_the_final_weights_without_checkpoints(compose_config, tmp_path) -> None:
    results = train(compose_config(["debug=fdr"]))

    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["best_checkpoint"] is None
    assert not list((tmp_path / "run").rglob("best-*.ckpt"))
    assert saved["metrics"] == pytest.approx(results["metrics"])
    assert {"val/ndcg@10", "test/ndcg@10"} <= set(saved["metrics"])


@pytest.mark.slow
@pytest.mark.parametrize("task", ["seqrec", "xc"])
def test_debug_overfit_drives_the_training_loss_down(compose_config, task: str) -> None:
    results = train(
        compose_config(
            [f"task={task}", "debug=overfit", "sampler=full", "task.module.optimizer.lr=0.01"]
        )
    )

    assert results["epochs_run"] == results["config"]["trainer"]["max_epochs"]
    losses = [row["train/loss"] for row in _epoch_rows(results)]
    assert losses[-1] < 0.5 * losses[0]


def _epoch_rows(results: dict) -> list[dict[str, float]]:
    with (Path(results["output_dir"]) / "epochs.csv").open() as handle:
        return [
            {key: float(value) for key, value in row.items() if value}
            for row in csv.DictReader(handle)
        ]
