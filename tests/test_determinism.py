"""Two CPU runs with the same seed write identical results; another seed changes them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import CONF_DIR, TINY_RUN, sampler_overrides
from hydra import compose, initialize_config_dir

from recsys_midx.app.experiment import train

pytestmark = pytest.mark.slow

# MIDX exercises every source of randomness: training order, dropout, k-means and the draws.
RUN = (*TINY_RUN, *sampler_overrides("midx"), "callbacks.sampler_refresh.every_n_steps=3")


def _run(root: Path, name: str, seed: int, *overrides: str) -> tuple[dict, list[str]]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        config = compose(
            "config",
            overrides=[
                f"paths.output_dir={root / name}",
                f"paths.data_dir={root / 'data'}",
                *RUN,
                f"seed={seed}",
                *overrides,
            ],
        )
    train(config)
    results = json.loads((root / name / "results.json").read_text())
    with (root / name / "epochs.csv").open() as handle:
        losses = [row["train/loss"] for row in csv.DictReader(handle)]
    return results, losses


def test_same_seed_gives_identical_results_on_cpu(tmp_path):
    first, first_losses = _run(tmp_path, "first", seed=0)
    second, second_losses = _run(tmp_path, "second", seed=0)
    assert first["metrics"] == second["metrics"]  # exactly, not approximately
    assert first_losses == second_losses
    assert first["sampler"]["kl_last"] == second["sampler"]["kl_last"]

    _, other_losses = _run(tmp_path, "other", 1, "trainer.max_epochs=1")
    assert other_losses[0] != first_losses[0]
