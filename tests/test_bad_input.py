"""Bad input gives a clear error that names the problem, and leaves no partial output: no
results.json, no checkpoint, no half-written processed dataset."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN, sampler_overrides
from hydra.errors import InstantiationException, MissingConfigException

from recsys_midx.app.experiment import train
from recsys_midx.data.errors import DataError
from recsys_midx.data.xc import XCFormatError
from recsys_midx.lit.reliability import NonFiniteLossError
from recsys_midx.lit.seqrec import SeqRecModule


def _assert_no_output(tmp_path: Path) -> None:
    """Nothing of the run, and no processed dataset or temporary folder, was left behind."""
    run = tmp_path / "run"
    assert not (run / "results.json").exists()
    assert not (run / "checkpoints").exists()
    processed = tmp_path / "data" / "processed"
    leftovers = sorted(p.name for p in processed.iterdir()) if processed.exists() else []
    assert leftovers == [], leftovers


@pytest.mark.parametrize("group", ["sampler", "model", "dataset"])
def test_unknown_option_lists_the_valid_ones(compose_config, group):
    with pytest.raises(MissingConfigException) as error:
        compose_config([f"{group}=nope"])
    message = str(error.value)
    assert f"Could not find '{group}/nope'" in message
    expected = {
        "sampler": ["uniform", "midx"],
        "model": ["sasrec", "gru4rec"],
        "dataset": ["synthetic", "ml-1m"],
    }[group]
    assert all(option in message for option in expected)


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        (
            ["sampler=uniform", "sampler.num_negatives=0"],
            "sampler",
            r"num_negatives must be in 1\.\.79 for a catalog of 80 items, got 0",
        ),
        (
            ["sampler=uniform", "sampler.num_negatives=80"],
            "sampler",
            r"num_negatives must be in 1\.\.79 for a catalog of 80 items, got 80",
        ),
        (
            ["sampler=midx", "sampler.num_negatives=20", "sampler.num_codewords=100"],
            "sampler",
            "num_codewords=100 exceeds the number of items 80",
        ),
        (["sampler=uniform", "model.max_len=0"], "task.datamodule", "max_len must be > 0, got 0"),
    ],
    ids=["no-negatives", "negatives-cover-catalog", "midx-k-above-catalog", "max-len-0"],
)
def test_invalid_setting_is_named_before_training(
    compose_config, tmp_path, overrides, key, message
):
    # Hydra reports the failing config key and the component's own ValueError.
    with pytest.raises(InstantiationException, match=f"ValueError.*{message}") as error:
        train(compose_config([*TINY_RUN, *overrides]))
    assert f"full_key: {key}" in str(error.value)
    assert isinstance(error.value.__cause__, ValueError)
    assert not (tmp_path / "run" / "results.json").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_dimension_not_divisible_by_pq_subspaces_is_named(compose_config, tmp_path):
    config = compose_config([*TINY_RUN, *sampler_overrides("midx"), "sampler.num_codebooks=3"])
    with pytest.raises(ValueError, match="splits D=16 into num_codebooks=3 equal subspaces"):
        train(config)
    assert not (tmp_path / "run" / "results.json").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_malformed_ratings_line_names_the_file_and_value(compose_config, tmp_path):
    raw = tmp_path / "ml-100k"
    raw.mkdir()
    lines = [
        f"{user}\t{item}\t3\t{881250949 + user * 100 + item}"
        for user in range(1, 30)
        for item in range(1, 20)
    ]
    lines.insert(40, "12\tabc\t3\t881250949")
    (raw / "u.data").write_text("\n".join(lines) + "\n")
    config = compose_config(
        ["dataset=ml-100k", f"dataset.raw_dir={raw}", *sampler_overrides("uniform")]
    )
    with pytest.raises(DataError, match=f"cannot parse {raw / 'u.data'}: .*'abc'"):
        train(config)
    _assert_no_output(tmp_path)


def test_xc_file_whose_header_disagrees_is_named(compose_config, tmp_path):
    raw = tmp_path / "eurlex"
    raw.mkdir()
    points = "0,2 1:0.5 3:1.0\n1 0:2.0\n"
    (raw / "eurlex_train.txt").write_text("3 10 5\n" + points)  # declares 3 points, holds 2
    (raw / "eurlex_test.txt").write_text("2 10 5\n" + points)
    config = compose_config(
        ["task=xc", "dataset=xc-eurlex-4k", f"dataset.raw_dir={raw}", *sampler_overrides("uniform")]
    )
    with pytest.raises(
        XCFormatError, match="eurlex_train.txt: the header declares 3 points, the file holds 2"
    ):
        train(config)
    _assert_no_output(tmp_path)


@pytest.mark.slow
def test_non_finite_loss_stops_at_its_step_and_keeps_the_last_checkpoint(
    compose_config, tmp_path, monkeypatch
):
    bad_step = 5  # epoch 1, batch 1 (4 batches per epoch)
    training_step = SeqRecModule.training_step

    def diverging_step(self, batch, batch_idx):
        loss = training_step(self, batch, batch_idx)
        return loss * math.nan if self.trainer.global_step == bad_step else loss

    monkeypatch.setattr(SeqRecModule, "training_step", diverging_step)
    config = compose_config(
        [
            *TINY_RUN,
            *sampler_overrides("uniform"),
            "callbacks.step_checkpoint.every_n_train_steps=1",
        ]
    )
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(
        NonFiniteLossError,
        match=(
            f"non-finite training loss \\(nan\\) at global step {bad_step} \\(epoch 1, batch 1\\).*"
            f"last good checkpoint is kept: {last}"
        ),
    ):
        train(config)
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == bad_step
    assert all(
        torch.isfinite(value).all()
        for value in checkpoint["state_dict"].values()
        if value.is_floating_point()
    )
    assert not (tmp_path / "run" / "results.json").exists()
