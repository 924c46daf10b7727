"""The first run, ``python train.py``: a short demo on the synthetic default that leaves every
other dataset's training settings alone, and says what the sampled softmax cost."""

from __future__ import annotations

import pytest

from recsys_midx.app.experiment import sampler_lines


def test_the_default_run_is_a_short_demo_on_the_synthetic_dataset(compose_config) -> None:
    demo = compose_config([])
    assert demo.dataset.name == "synthetic" and demo.trainer.max_epochs == 3
    # The training settings a user's own data gets are the same apart from the epoch cap.
    own = compose_config(["dataset=custom", "dataset.path=orders.csv"])
    assert own.trainer.max_epochs == 200
    assert own.task.datamodule.train_samples == demo.task.datamodule.train_samples == "windows"
    assert own.callbacks.early_stopping.patience == demo.callbacks.early_stopping.patience


@pytest.mark.parametrize(
    ("overrides", "max_epochs"),
    [
        (["dataset=ml-1m"], 200),
        (["task=xc"], 200),
        (["experiment=synthetic-100k"], 30),
        (["debug=default"], 1),
        (["trainer.max_epochs=200"], 200),
    ],
)
def test_the_demo_cap_yields_to_other_datasets_experiments_and_the_command_line(
    compose_config, overrides: list[str], max_epochs: int
) -> None:
    assert compose_config(overrides).trainer.max_epochs == max_epochs


def test_the_summary_says_what_a_sampled_softmax_scored_and_how_close_its_proposal_came() -> None:
    results = {
        "config": {
            "sampler": {"_target_": "recsys_midx.samplers.MIDXSampler", "num_negatives": 100}
        },
        "dataset": {"items": 12_345},
        "negatives": "per_query",
        "sampler": {"kl_last": 0.5, "kl_uniform_last": 2.25, "sizing": {"exact_top_codewords": 6}},
    }
    assert sampler_lines(results) == [
        "sampled softmax: 100 negatives from MIDXSampler and its exact top cells per query, "
        "of 12,345 items",
        "proposal: KL(softmax || q) = 0.50 nats at the last refresh; uniform: 2.25",
    ]
    shared = {**results, "negatives": "shared"}
    assert sampler_lines(shared)[0].endswith("cells shared by each batch, of 12,345 items")
    exact = {**results, "negatives": "none", "config": {"sampler": {"num_negatives": None}}}
    assert sampler_lines(exact) == ["exact softmax: every training query scores all 12,345 items"]
    assert sampler_lines({"config": {}, "dataset": {}}) == []
    bce = {"_target_": "recsys_midx.losses.BCELoss"}
    assert sampler_lines({**results, "config": {**results["config"], "loss": bce}}) == []
