"""Hyper-parameter search (conf/hparams_search): the Optuna preset composes and a tiny search
runs its trials and writes the best parameters and value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import CONF_DIR, ROOT, TINY_RUN
from hydra import compose, initialize_config_dir

SEARCHED = ("task.module.optimizer.lr", "model.dim", "sampler.num_negatives")


def test_optuna_preset_composes() -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hparams_search=optuna"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper")
    assert sweeper.direction == "maximize"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert sweeper.sampler.seed is not None
    assert sweeper.n_trials > 0
    assert tuple(sweeper.params) == SEARCHED
    assert sweeper.params["task.module.optimizer.lr"].startswith("tag(log, interval(")


@pytest.mark.slow
def test_tiny_search_writes_the_best_trial(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    # The catalog has 80 items: sizes chosen on the command line replace the preset's choices.
    tiny = [override for override in TINY_RUN if not override.startswith("model.dim=")]
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "hparams_search=optuna",
            "hydra.sweeper.n_trials=2",
            "model.dim=choice(8,16)",
            "sampler.num_negatives=choice(10,20)",
            "sampler.num_codewords=8",
            *tiny,
            f"paths.data_dir={tmp_path / 'data'}",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == set(SEARCHED)
    trials = [json.loads(path.read_text()) for path in sorted(sweep_dir.glob("*/results.json"))]
    assert len(trials) == 2
    # The study maximises the metric train.py returns (optimized_metric).
    returned = [
        trial["metrics"][trial["config"].get("optimized_metric", "test/ndcg@10")]
        for trial in trials
    ]
    assert best["best_value"] == pytest.approx(max(returned))
    for trial in trials:
        config = trial["config"]
        assert 1e-4 <= config["task"]["module"]["optimizer"]["lr"] <= 1e-2
        assert config["model"]["dim"] in (8, 16)
        assert config["sampler"]["num_negatives"] in (10, 20)
