"""Evaluating a trained checkpoint reproduces the training run's validation and test metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONF_DIR, ROOT
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from trained_runs import TINY_CUSTOM_RUN, train_custom_run

from recsys_midx.app.evaluate import evaluate


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_custom_run(tmp_path_factory.mktemp("evaluate"))


def eval_config(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("eval", overrides=overrides)


def training_results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_nothing_to_evaluate_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="set run_dir=RUN_FOLDER .* or ckpt_path=CHECKPOINT"):
        evaluate(eval_config([f"paths.output_dir={tmp_path}"]))


@pytest.mark.slow
def test_evaluating_the_best_checkpoint_gives_the_training_metrics(
    run_dir: Path, tmp_path: Path
) -> None:
    trained = training_results(run_dir)
    results = evaluate(eval_config([f"run_dir={run_dir}", f"paths.output_dir={tmp_path}"]))
    assert results["metrics"] == trained["metrics"]
    assert {name.split("/")[0] for name in results["metrics"]} == {"val", "test"}
    assert set(results) == set(trained) | {"evaluated_run"}
    assert results["train_wall_seconds"] is None and results["best_epoch"] is None
    assert results["best_checkpoint"] == trained["best_checkpoint"]
    assert results["dataset"] == trained["dataset"]
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["metrics"] == trained["metrics"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.slow
def test_a_checkpoint_with_the_training_overrides_gives_the_test_metrics(
    run_dir: Path, tmp_path: Path
) -> None:
    root = run_dir.parent
    trained = training_results(run_dir)
    cfg = eval_config(
        [
            f"ckpt_path={trained['best_checkpoint']}",
            f"paths.output_dir={tmp_path}",
            f"paths.data_dir={root / 'data'}",
            "dataset=custom",
            f"dataset.path={root / 'interactions.csv'}",
            "dataset.columns.user=uid",
            "dataset.columns.item=sku",
            "dataset.columns.time=ts",
            *TINY_CUSTOM_RUN,
            "sampler=uniform",
            "sampler.num_negatives=20",
        ]
    )
    results = evaluate(cfg)
    test = {name: value for name, value in trained["metrics"].items() if name.startswith("test/")}
    assert {name: results["metrics"][name] for name in test} == test


@pytest.mark.slow
def test_eval_script_writes_results(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval-run"
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    completed = subprocess.run(
        [sys.executable, str(ROOT / "eval.py"), f"run_dir={run_dir}", f"hydra.run.dir={out}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["metrics"] == training_results(run_dir)["metrics"]
