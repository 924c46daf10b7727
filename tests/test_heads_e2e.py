"""End to end: every head (head=...) trains, validates and tests on both tasks, full and MIDX."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FEW_STEPS, TINY_RUN, TINY_XC_RUN, sampler_overrides

from recsys_midx.app.experiment import build, train
from recsys_midx.lit.table_optimizers import ROWWISE_ADAGRAD_LR

HEADS = {
    "dot": "DotHead",
    "sigsoftmax": "SigSoftmaxHead",
    "plif": "PLIFHead",
    "mos": "MoSHead",
    "mos_plif": "MoSPLIFHead",
    "moe": "MoEHead",
}
#: The shared few steps, with a small proposal diagnostic.
STEPS = (*FEW_STEPS, "callbacks.sampler_refresh.diagnostic_queries=16")
TASKS = {"seqrec": (TINY_RUN, "val/ndcg@10"), "xc": (TINY_XC_RUN, "val/p@1")}


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["full", "midx"])
@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("head", sorted(HEADS))
def test_every_head_trains_on_both_tasks(compose_config, tmp_path, head, task, sampler) -> None:
    base, monitor = TASKS[task]
    cfg = compose_config([*base, *sampler_overrides(sampler), *STEPS, f"head={head}"])
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["task"]["module"]["head"]["_target_"].endswith(HEADS[head])
    assert monitor in results["metrics"]
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    head_state = {k: v for k, v in state["state_dict"].items() if k.startswith("head.")}
    # Learned heads are part of the checkpoint; the dot product and sigsoftmax have no state.
    assert bool(head_state) == (head in ("plif", "mos", "mos_plif", "moe"))
    assert all(bool(value.isfinite().all()) for value in head_state.values())


@pytest.mark.slow
def test_plif_slopes_train_at_their_own_learning_rate(compose_config) -> None:
    cfg = compose_config(
        [
            *TINY_RUN,
            *sampler_overrides("uniform"),
            *STEPS,
            "head=plif",
            "head.lr=0.05",
            "head.num_knots=200",
            "head.bound=10",
        ]
    )
    experiment = build(cfg)
    optimizer = experiment.module.configure_optimizers()
    # The encoder's group, the slopes' group, then the item table's (row-wise AdaGrad's own).
    assert [group["lr"] for group in optimizer.param_groups] == [0.001, 0.05, ROWWISE_ADAGRAD_LR]
    slopes = experiment.module.head.raw_slopes
    before = slopes.detach().clone()
    experiment.trainer.fit(experiment.module, experiment.datamodule)
    assert not torch.equal(slopes.detach(), before), "the slopes must be trained"
