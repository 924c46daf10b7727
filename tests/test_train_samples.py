"""Training samples (``task.datamodule.train_samples``): what each construction trains on, that
no held-out target enters training, exact mid-epoch resumption and disjoint distributed shards.

The hand-made splits give every interaction its own item id (its position + 1), so a target's
item says which interaction it is.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY_RUN, exact_softmax_module, run_train, sampler_overrides
from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
from lightning.pytorch.utilities.data import _update_dataloader
from omegaconf import DictConfig

from recsys_midx.app.experiment import train
from recsys_midx.data.datamodule import SeqRecDataModule
from recsys_midx.data.pipeline import PreparedDataset
from recsys_midx.data.splits import LeaveOneOutSplit, SequenceSplit
from recsys_midx.data.time_split import GlobalTimeSplit
from recsys_midx.data.train_samples import SAMPLE_KINDS, TrainSamples
from recsys_midx.errors import ConfigError
from recsys_midx.models import SASRec

MAX_LEN = 4
#: Interactions per user: training parts of 1, 2, 2, 3, 7, 13 and 21 items under leave-one-out,
#: 49 - 7 = 42 training targets.
LENGTHS = (3, 4, 4, 5, 9, 15, 23)


def _frame(lengths: tuple[int, ...] = LENGTHS) -> pd.DataFrame:
    """One row per interaction, item id = position + 1; timestamps spread over 0..99 per user."""
    users = np.repeat(np.arange(len(lengths)), lengths)
    times = np.concatenate([np.linspace(0, 99, n).round() for n in lengths]).astype(np.int64)
    return pd.DataFrame(
        {"user_id": users, "item_id": np.arange(1, len(users) + 1), "timestamp": times}
    )


def _leave_one_out() -> LeaveOneOutSplit:
    frame = _frame()
    return LeaveOneOutSplit.from_interactions(frame, len(frame))


def _global_time() -> GlobalTimeSplit:
    frame = _frame()
    return GlobalTimeSplit.from_interactions(frame, len(frame), val_cutoff=60, test_cutoff=80)


SPLITS: dict[str, Callable[[], SequenceSplit]] = {
    "leave_one_out": _leave_one_out,
    "global_time": _global_time,
}


def _training_targets(split: SequenceSplit) -> list[int]:
    """Items of every training interaction but each training sequence's first: the targets."""
    spans = split.spans("train")
    return [
        int(split.items[p])
        for start, end in zip(spans.starts, spans.ends)
        for p in range(start + 1, end)
    ]


def _queries(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions a training step learns from (real input and real target), as it picks them:
    the last ``targets.shape[1]`` input positions."""
    inputs = batch["inputs"][:, -batch["targets"].shape[1] :]
    is_query = (batch["targets"] > 0) & (inputs > 0)
    return is_query, batch["targets"][is_query]


def _all(samples: TrainSamples) -> dict[str, torch.Tensor]:
    return samples.batch(np.arange(len(samples)))


@pytest.mark.parametrize("stride", [1, 2, 3, MAX_LEN])
def test_windows_cover_every_training_target_with_windows_stride_apart(stride: int) -> None:
    split = _leave_one_out()
    samples = TrainSamples(split.items, split.spans("train"), MAX_LEN, "windows", stride)
    batch = _all(samples)
    is_query, targets = _queries(batch)
    assert set(targets.tolist()) == set(_training_targets(split))
    # Every position of a window is a query: each target follows its input item.
    assert batch["targets"].shape == batch["inputs"].shape
    assert torch.equal(batch["inputs"][is_query] + 1, targets)
    # A window holds at most max_len + 1 items, the last one the target of the last position.
    lengths = (batch["inputs"] > 0).sum(1) + 1
    assert int(lengths.max()) <= MAX_LEN + 1
    rows, ends = samples.locate(np.arange(len(samples)))
    for row in np.unique(rows):
        assert (np.diff(ends[rows == row]) == -stride).all()


def test_windows_with_the_default_stride_are_max_len_apart() -> None:
    split = _leave_one_out()
    samples = TrainSamples(split.items, split.spans("train"), MAX_LEN, "windows")
    assert samples.stride == MAX_LEN
    # Training parts of 1, 2, 2, 3, 7, 13, 21 items: 1 + ceil(max(L - 5, 0) / 4) windows each.
    assert len(samples) == 1 + 1 + 1 + 1 + 2 + 3 + 5


def test_prefixes_give_one_sample_per_training_target() -> None:
    split = _leave_one_out()
    samples = TrainSamples(split.items, split.spans("train"), MAX_LEN, "prefixes")
    # One per training item but each user's first (which has no input before it).
    assert len(samples) == sum(length - 2 - 1 for length in LENGTHS) == 42
    batch = _all(samples)
    is_query, targets = _queries(batch)
    # One target per sample, after its last input position.
    assert batch["targets"].shape == (42, 1) and bool(is_query.all())
    assert Counter(targets.tolist()) == Counter(_training_targets(split))
    spans = split.spans("train")
    for inputs, target in zip(batch["inputs"].tolist(), targets.tolist()):
        position = target - 1
        start = int(spans.starts[np.searchsorted(spans.starts, position, side="right") - 1])
        before = split.items[max(start, position - MAX_LEN) : position].tolist()
        assert inputs == [0] * (MAX_LEN - len(before)) + before


def test_a_prefix_batch_trains_the_last_query_as_the_full_encoder_would() -> None:
    split = _leave_one_out()
    batch = _all(TrainSamples(split.items, split.spans("train"), MAX_LEN, "prefixes"))
    torch.manual_seed(0)
    encoder = SASRec(num_items=int(split.items.max()), dim=8, num_heads=2, max_len=MAX_LEN)
    module = exact_softmax_module(encoder)
    expected = module.objective(encoder(batch["inputs"])[:, -1], batch["targets"][:, 0])
    torch.testing.assert_close(module.training_step(batch, 0), expected)


def test_last_window_is_each_users_last_max_len_plus_one_items() -> None:
    split = _leave_one_out()
    samples = TrainSamples(split.items, split.spans("train"), MAX_LEN, "last_window")
    assert len(samples) == len(LENGTHS)
    _, targets = _queries(_all(samples))
    spans = split.spans("train")
    expected = [
        int(split.items[p])
        for start, end in zip(spans.starts, spans.ends)
        for p in range(max(start + 1, end - MAX_LEN), end)
    ]
    assert sorted(targets.tolist()) == sorted(expected)


@pytest.mark.parametrize("split_name", sorted(SPLITS))
@pytest.mark.parametrize("kind", SAMPLE_KINDS)
def test_no_validation_or_test_target_is_trained_on(split_name: str, kind: str) -> None:
    split = SPLITS[split_name]()
    samples = TrainSamples(split.items, split.spans("train"), MAX_LEN, kind, stride=3)
    batch = _all(samples)
    trained = set(_training_targets(split))
    held_out = {
        int(split.items[end]) for stage in ("val", "test") for end in split.spans(stage).ends
    }
    assert held_out and not held_out & trained
    seen = set(batch["inputs"].flatten().tolist()) | set(batch["targets"].flatten().tolist())
    assert not seen & held_out, "a held-out target entered a training window"
    _, targets = _queries(batch)
    assert set(targets.tolist()) <= trained
    if kind != "last_window":
        assert set(targets.tolist()) == trained


class _Prepared:
    """A source stand-in whose prepare() returns the hand-made interactions."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.dataset = PreparedDataset(
            name="fixed",
            directory=Path("."),
            interactions=frame,
            num_users=int(frame["user_id"].nunique()),
            num_items=len(frame),
            stats={},
        )

    def prepare(self, data_dir: str | Path) -> PreparedDataset:
        return self.dataset


def _datamodule(kind: str, batch_size: int = 4) -> SeqRecDataModule:
    module = SeqRecDataModule(
        _Prepared(_frame()),
        "unused",
        max_len=MAX_LEN,
        batch_size=batch_size,
        train_samples=kind,
        window_stride=2,
    )
    module.setup("fit")
    return module


@pytest.mark.parametrize("kind", SAMPLE_KINDS)
def test_resuming_mid_epoch_replays_the_remaining_batches(kind: str) -> None:
    module = _datamodule(kind, batch_size=2)
    torch.manual_seed(0)
    loader = module.train_dataloader()
    loader.sampler.set_epoch(1)
    epoch = list(loader)
    assert len(epoch) == math.ceil(len(module.sample_index) / 2) >= 3

    torch.manual_seed(0)
    resumed = module.train_dataloader()
    resumed.load_state_dict({"epoch": 1, "batches_yielded": 2})
    rest = list(resumed)
    assert len(rest) == len(epoch) - 2
    for expected, batch in zip(epoch[2:], rest):
        assert batch.keys() == expected.keys()
        assert all(torch.equal(batch[key], expected[key]) for key in batch)


@pytest.mark.parametrize("kind", ["windows", "prefixes"])
def test_distributed_shards_are_disjoint_and_cover_the_epochs_samples(kind: str) -> None:
    module = _datamodule(kind)
    num_samples = len(module.sample_index)
    assert num_samples > len(LENGTHS)  # shards of samples, not of users
    shards = []
    for rank in range(2):
        # Lightning's own replacement of a shuffled loader's sampler in a 2-process run.
        loader = module.train_dataloader()
        sampler = _get_distributed_sampler(
            loader, shuffle=True, overfit_batches=0, num_replicas=2, rank=rank, seed=0
        )
        sampler.set_epoch(1)
        shards.append(list(sampler))
        batches = list(_update_dataloader(loader, sampler))
        assert sum(len(batch["inputs"]) for batch in batches) == len(shards[-1])
    # An even count (42 prefixes, 20 windows with stride 2), so the sampler repeats no sample to
    # even the shards out: every sample is on exactly one rank.
    assert num_samples % 2 == 0 and len(shards[0]) == len(shards[1])
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(num_samples))


def test_unknown_construction_or_stride_is_one_line_naming_the_setting() -> None:
    class Unread:
        def prepare(self, data_dir: str | Path) -> PreparedDataset:
            raise AssertionError("the data was read")

    with pytest.raises(ConfigError) as error:
        SeqRecDataModule(Unread(), "unused", max_len=MAX_LEN, train_samples="all")
    message = str(error.value)
    assert message.startswith("task.datamodule.train_samples=all") and "\n" not in message
    assert "last_window, windows, prefixes" in message
    for stride in (0, MAX_LEN + 1):
        with pytest.raises(ConfigError, match=rf"^task\.datamodule\.window_stride={stride}:"):
            SeqRecDataModule(
                Unread(), "unused", max_len=MAX_LEN, train_samples="windows", window_stride=stride
            )


@pytest.mark.slow
def test_unknown_construction_stops_train_py_with_one_line(tmp_path: Path) -> None:
    done = run_train(
        *TINY_RUN,
        "task.datamodule.train_samples=every",
        f"paths.data_dir={tmp_path / 'data'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: task.datamodule.train_samples=every: give one of last_window, windows, prefixes"
    )
    assert not (tmp_path / "data").exists()


def test_windows_are_the_default(compose_config: Callable[..., DictConfig]) -> None:
    datamodule = compose_config([]).task.datamodule
    assert (datamodule.train_samples, datamodule.batch_size) == ("windows", 128)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["uniform", "midx"])
@pytest.mark.parametrize("kind", SAMPLE_KINDS)
def test_training_runs_with_each_construction(
    compose_config: Callable[..., DictConfig], kind: str, sampler: str
) -> None:
    cfg = compose_config(
        [
            *TINY_RUN,
            *sampler_overrides(sampler),
            "trainer.max_epochs=1",
            f"task.datamodule.train_samples={kind}",
        ]
    )
    results = train(cfg)
    assert 0.0 <= results["metrics"]["test/ndcg@10"] <= 1.0
    assert results["config"]["task"]["datamodule"]["train_samples"] == kind


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["windows", "prefixes"])
def test_training_runs_with_a_global_time_split(
    compose_config: Callable[..., DictConfig], kind: str
) -> None:
    cfg = compose_config(
        [
            *TINY_RUN,
            *sampler_overrides("midx"),
            "trainer.max_epochs=1",
            "split=global_time",
            f"task.datamodule.train_samples={kind}",
            "task.datamodule.window_stride=5",
        ]
    )
    results = train(cfg)
    assert 0.0 <= results["metrics"]["test/ndcg@10"] <= 1.0
