"""Run folders recorded before negatives were a config group of their own still load: their
configs are read in today's settings (``recsys_midx.app.recorded_configs``)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from omegaconf import OmegaConf

from recsys_midx.app.experiment import build_module
from recsys_midx.app.recorded_configs import in_current_settings

#: The frontier sweep's runs, recorded with the loss holding how negatives were drawn.
RUNS = sorted((ROOT / "docs" / "results" / "frontier-seqrec" / "runs").glob("*/results.json"))


def _strategy(label: str) -> str:
    if label in ("full", "sce"):
        return "NoNegatives"
    return "SharedByBatch" if label.endswith("-shared") else "PerQuery"


@pytest.mark.parametrize("path", RUNS, ids=lambda path: path.parent.name)
def test_a_recorded_run_builds_with_the_strategy_it_drew_with(path) -> None:
    recorded = OmegaConf.create(json.loads(path.read_text())["config"])
    assert "negatives" not in recorded
    cfg = in_current_settings(recorded)
    label = path.parent.name
    assert cfg.negatives._target_.endswith(_strategy(label)), label
    module = build_module(cfg, {"num_items": 5_000}, 5_000)
    assert type(module.negatives).__name__ == _strategy(label)
    assert (module.sampler is None) == (label in ("full", "sce"))
    assert in_current_settings(cfg) == cfg  # today's settings are left as they are


def test_recorded_window_softmax_and_exact_positives_move_to_the_negatives() -> None:
    loss = {"_target_": "recsys_midx.losses.WindowSoftmaxLoss", "negatives": "proposal"}
    sampler = {"_target_": "recsys_midx.samplers.MIDXSampler", "last_stage": "exact"}
    cfg = in_current_settings(OmegaConf.create({"sampler": sampler, "loss": loss}))
    assert cfg.negatives._target_.endswith("PerSequence")
    assert cfg.loss == {"_target_": "recsys_midx.losses.SoftmaxLoss"}
    assert cfg.sampler.last_stage == "residual"
    uniform = {"_target_": "recsys_midx.samplers.UniformSampler", "num_negatives": 3000}
    outside = {"_target_": "recsys_midx.losses.WindowSoftmaxLoss", "negatives": "outside"}
    cfg = in_current_settings(OmegaConf.create({"sampler": uniform, "loss": outside}))
    assert cfg.negatives == {
        "_target_": "recsys_midx.negatives.OutsideWindow",
        "num_negatives": 3000,
    }
    exact = {
        "_target_": "recsys_midx.losses.BCELoss",
        "exact_positives": True,
        "exclude_window": True,
    }
    cfg = in_current_settings(OmegaConf.create({"sampler": uniform, "loss": exact}))
    assert cfg.negatives.correct_positive is False and cfg.negatives.exclude_window is True
    # EDRep's own exact_positives stays with it.
    edrep = {"_target_": "recsys_midx.losses.EDRepLoss", "exact_positives": True}
    cfg = in_current_settings(OmegaConf.create({"sampler": uniform, "loss": edrep}))
    assert cfg.loss.exact_positives is True and cfg.negatives._target_.endswith("NoNegatives")
