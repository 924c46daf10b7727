"""End to end: ``task=xc`` composed through Hydra trains, tests and writes results."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from conftest import TINY_XC_RUN, sampler_overrides
from hydra.errors import InstantiationException

from recsys_midx.app.experiment import build, train
from recsys_midx.heads import DotHead
from recsys_midx.lit import XCModule
from recsys_midx.losses import MultiLabelSoftmaxLoss
from recsys_midx.models import XCEncoder
from recsys_midx.negatives import PerQuery, PerSequence
from recsys_midx.samplers import UniformSampler

#: The sampler each ``sampler=`` config builds (``full`` builds none: the exact softmax).
SAMPLERS = {"full": None, "uniform": "UniformSampler", "midx": "MIDXSampler"}


def test_task_xc_selects_its_dataset_model_and_loss(compose_config) -> None:
    cfg = compose_config(["task=xc"])
    assert cfg.dataset.name == "xc-synthetic"
    assert cfg.model._target_.endswith("XCEncoder")
    assert cfg.loss._target_.endswith("MultiLabelSoftmaxLoss")
    assert cfg.sampler._target_.endswith("MIDXSampler")
    assert cfg.task.monitor == "val/p@1"
    repository = compose_config(["task=xc", "dataset=xc-amazon-670k"])
    files = {"train": "amazon_train.txt", "test": "amazon_test.txt"}
    assert dict(repository.dataset.files) == files
    assert (repository.dataset.propensity_a, repository.dataset.propensity_b) == (0.6, 2.6)
    seqrec = compose_config([])
    assert seqrec.dataset.name == "synthetic" and seqrec.task.monitor == "val/ndcg@10"
    assert seqrec.loss._target_.endswith(".SoftmaxLoss")


@pytest.mark.slow
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_xc_trains_and_tests_with_every_sampler_kind(compose_config, tmp_path, sampler) -> None:
    cfg = compose_config([*TINY_XC_RUN, *sampler_overrides(sampler)])
    results = train(cfg)

    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["metrics"] == pytest.approx(results["metrics"])
    for split in ("val", "test"):
        for metric in ("p", "ndcg", "psp"):
            for k in (1, 3, 5):
                assert 0.0 <= saved["metrics"][f"{split}/{metric}@{k}"] <= 1.0
    if SAMPLERS[sampler] is None:
        assert saved["negatives"] == "none" and "_target_" not in saved["config"]["sampler"]
    else:
        assert saved["config"]["sampler"]["_target_"].endswith(SAMPLERS[sampler])
    assert saved["epochs_run"] == 2 and saved["best_epoch"] in (0, 1)
    assert saved["dataset"]["labels"] == 80 and saved["dataset"]["splits"]["test"] == 100
    if sampler != "full":  # the proposal is compared with the softmax on validation queries
        assert saved["sampler"]["kl_last"] is not None and saved["sampler"]["kl_last"] >= 0


def test_xc_rejects_a_single_label_loss(compose_config) -> None:
    cfg = compose_config([*TINY_XC_RUN, *sampler_overrides("uniform"), "loss=softmax"])
    with pytest.raises(InstantiationException, match="needs a MultiLabelSoftmaxLoss"):
        build(cfg)


@pytest.mark.parametrize("strategy", [PerSequence(), PerQuery(exclude_window=True)])
def test_xc_refuses_a_strategy_reading_training_sequences(strategy) -> None:
    with pytest.raises(ValueError, match=r"reads each batch's training sequences: it needs task"):
        XCModule(
            XCEncoder(num_features=20, num_labels=10, dim=4),
            DotHead(),
            UniformSampler(10, 3),
            MultiLabelSoftmaxLoss(),
            functools.partial(torch.optim.Adam),
            negatives=strategy,
        )
