"""The frontier sweep's runs compose with the real configs, and its dry run lists them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, load_script
from hydra.utils import instantiate

frontier = load_script("frontier")


@pytest.mark.parametrize("task", sorted(frontier.EXPERIMENTS))
def test_every_frontier_run_builds_its_sampler_and_loss(compose_config, task):
    runs = frontier.configurations(task)
    assert (set(frontier.OBJECTIVES) <= set(runs)) == (task == "seqrec")
    for label, overrides in runs.items():
        cfg = compose_config([f"experiment={frontier.EXPERIMENTS[task]}", *overrides])
        negatives = instantiate(cfg.negatives)
        if not negatives.uses_sampler:  # the exact softmax, or an objective drawing nothing
            assert label in ("full", "sce"), label
            continue
        sampler = instantiate(cfg.sampler, num_items=5_000)
        loss = instantiate(cfg.loss)
        assert cfg.task.monitor == {"seqrec": "val/ndcg@10", "xc": "val/p@1"}[task]
        if label in frontier.OBJECTIVES:  # named by the objective, not the sampler
            expected = {"gbce": "GBCELoss", "sce": "ScalableCrossEntropyLoss"}
            assert type(loss).__name__ == expected[label.split("-")[0]], label
            continue
        assert type(sampler).__name__.lower().startswith(label.split("-")[0].split("_")[0]), label
        assert (negatives.name == "shared") == label.endswith("-shared"), label


def test_dry_run_prints_one_command_per_chosen_run(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "frontier.py"),
            "--task",
            "xc",
            "--dry-run",
            "--out",
            str(tmp_path),
            "--max-minutes",
            "90",
            "--only",
            "full",
            "uniform-256-shared",
            "--overrides",
            "task.module.table_optimizer=null",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert "experiment=xc-synthetic-100k sampler=full " in lines[0]
    assert "+trainer.max_time=00:01:30:00" in lines[0]
    assert f"hydra.run.dir={tmp_path / 'xc' / 'uniform-256-shared'}" in lines[1]
    assert "negatives=shared" in lines[1]
    assert all(" task.module.table_optimizer=null " in line for line in lines)
    assert not any(tmp_path.iterdir())
