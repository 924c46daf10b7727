"""``sampler=auto``: the exact softmax up to a catalog size per device, MIDX beyond it."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_CATALOG, TINY_RUN, sampler_overrides
from hydra.utils import instantiate

from recsys_midx.app import preflight
from recsys_midx.app.auto_sampler import as_trained, choose_sampler, device_kind
from recsys_midx.app.experiment import sampler_lines, train
from recsys_midx.app.summarize import load_runs
from recsys_midx.errors import ConfigError
from recsys_midx.samplers import MIDXSampler


@pytest.mark.parametrize(
    ("items", "chosen", "strategy"),
    [(20_000, "full", "NoNegatives"), (20_001, "midx", "PerQuery")],
)
def test_the_catalog_size_chooses_against_the_devices_limit(
    compose_config, items, chosen, strategy
):
    cfg = compose_config(["sampler=auto", "trainer.accelerator=cpu"])
    run_cfg, choice = choose_sampler(cfg, items)

    assert (choice.sampler, choice.items, choice.exact_up_to_items, choice.device) == (
        chosen,
        items,
        20_000,
        "cpu",
    )
    assert run_cfg.negatives._target_.endswith(strategy)
    assert "exact_up_to_items" in cfg.sampler  # the composed config is left as it was
    if chosen == "midx":
        assert "exact_up_to_items" not in run_cfg.sampler
        assert isinstance(instantiate(run_cfg.sampler, num_items=items), MIDXSampler)
    else:
        assert "_target_" not in run_cfg.sampler


def test_other_samplers_are_left_as_configured(compose_config):
    cfg = compose_config(["sampler=uniform"])
    assert choose_sampler(cfg, 10) == (cfg, None)


def test_the_window_exclusion_carries_over_to_the_exact_softmax(compose_config):
    cfg = compose_config(["sampler=auto", "negatives.exclude_window=true"])
    run_cfg, _ = choose_sampler(cfg, 100)
    assert run_cfg.negatives.exclude_window is True


@pytest.mark.parametrize(
    ("accelerator", "kind"), [("cpu", "cpu"), ("gpu", "cuda"), ("cuda", "cuda"), ("mps", "cpu")]
)
def test_the_device_kind_is_read_from_the_trainer(compose_config, accelerator, kind):
    assert device_kind(compose_config([f"trainer.accelerator={accelerator}"])) == kind


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["sampler.exact_up_to_items.cpu=-1"],
            r"sampler\.exact_up_to_items\.cpu=-1: give the largest catalog",
        ),
        (["loss=bce"], r"sampler=auto chooses between the exact softmax and MIDX: loss=bce"),
        (["negatives=none"], r"sampler=auto chooses .* negatives=none draws none from it"),
        (
            ["task.module.table_optimizer=rowwise_adagrad"],
            r"sampler=auto with task\.module\.table_optimizer=rowwise_adagrad",
        ),
    ],
    ids=["negative-limit", "bce", "no-negatives", "sparse-table"],
)
def test_settings_that_cannot_work_stop_before_any_data(compose_config, overrides, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        preflight.check(compose_config(["sampler=auto", *overrides]))


@pytest.mark.parametrize("overrides", [[], ["negatives=shared"], ["task=xc"]])
def test_working_setups_pass_the_checks(compose_config, overrides):
    preflight.check(compose_config(["sampler=auto", *overrides]))


@pytest.mark.parametrize(
    ("limit", "chosen", "strategy"), [(TINY_CATALOG, "full", "none"), (0, "midx", "per_query")]
)
def test_a_run_trains_and_records_what_it_chose(compose_config, tmp_path, limit, chosen, strategy):
    cfg = compose_config(
        [*TINY_RUN, *sampler_overrides("auto"), f"sampler.exact_up_to_items.cpu={limit}"]
    )
    train(cfg)

    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["negatives"] == strategy
    assert results["sampler"]["auto"] == {
        "sampler": chosen,
        "items": results["dataset"]["items"],
        "exact_up_to_items": limit,
        "device": "cpu",
    }
    assert sampler_lines(results)[0].startswith(f"sampler=auto: {chosen} for ")
    # Reports name the run by what it trained.
    assert "exact_up_to_items" in results["config"]["sampler"]
    assert ("_target_" not in as_trained(results)["sampler"]) == (chosen == "full")
    assert load_runs([tmp_path / "run"])["family"].tolist() == [chosen]
