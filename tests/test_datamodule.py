"""SeqRecDataModule: training windows, leave-one-out evaluation batches, item counts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from recsys_midx.data.datamodule import SeqRecDataModule
from recsys_midx.data.pipeline import PreparedDataset
from recsys_midx.errors import ConfigError


class _Prepared:
    """A source stand-in whose prepare() returns fixed interactions."""

    def __init__(self, sequences: dict[int, list[int]], num_items: int) -> None:
        rows = [(user, item) for user, items in sequences.items() for item in items]
        frame = pd.DataFrame(rows, columns=["user_id", "item_id"])
        self.dataset = PreparedDataset(
            name="fixed",
            directory=Path("."),
            interactions=frame,
            num_users=len(sequences),
            num_items=num_items,
            stats={"users": len(sequences)},
        )

    def prepare(self, data_dir: str | Path) -> PreparedDataset:
        return self.dataset


@pytest.fixture
def datamodule() -> SeqRecDataModule:
    source = _Prepared({1: [1, 2, 3, 4, 5, 6], 2: [7, 8, 9], 3: [2, 2, 9, 3, 1]}, num_items=9)
    module = SeqRecDataModule(
        source, "unused", max_len=3, batch_size=8, eval_batch_size=8, train_samples="last_window"
    )
    module.prepare_data()
    module.setup("fit")
    return module


def _only_batch(loader: torch.utils.data.DataLoader) -> dict[str, torch.Tensor]:
    batches = list(loader)
    assert len(batches) == 1
    return batches[0]


def test_last_window_batch_holds_every_next_item_target(datamodule: SeqRecDataModule) -> None:
    torch.manual_seed(0)
    batch = _only_batch(datamodule.train_dataloader())
    rows = {tuple(t.tolist()): tuple(i.tolist()) for i, t in zip(batch["inputs"], batch["targets"])}
    # Training parts: [1, 2, 3, 4], [7], [2, 2, 9]; the last max_len + 1 = 4 items, left-padded.
    assert rows == {(2, 3, 4): (1, 2, 3), (0, 0, 7): (0, 0, 0), (2, 2, 9): (0, 2, 2)}


def test_validation_and_test_batches_hold_out_the_last_items(datamodule: SeqRecDataModule) -> None:
    val = _only_batch(datamodule.val_dataloader())
    assert val["targets"].tolist() == [5, 8, 3]
    assert val["inputs"].tolist() == [[2, 3, 4], [0, 0, 7], [2, 2, 9]]
    assert val["history"].tolist() == [[1, 2, 3, 4], [0, 0, 0, 7], [0, 2, 2, 9]]
    test = _only_batch(datamodule.test_dataloader())
    assert test["targets"].tolist() == [6, 9, 1]
    assert test["inputs"].tolist() == [[3, 4, 5], [0, 7, 8], [2, 9, 3]]
    assert test["history"].tolist() == [[1, 2, 3, 4, 5], [0, 0, 0, 7, 8], [0, 2, 2, 9, 3]]


def test_item_counts_cover_training_parts_only(datamodule: SeqRecDataModule) -> None:
    assert datamodule.num_items == 9
    assert datamodule.item_counts.tolist() == [0, 1, 3, 1, 1, 0, 0, 1, 0, 1]


def test_use_before_setup_and_bad_sizes_are_errors() -> None:
    source = _Prepared({1: [1, 2, 3]}, num_items=3)
    with pytest.raises(RuntimeError, match="setup"):
        _ = SeqRecDataModule(source, "unused", max_len=3).num_items
    with pytest.raises(ValueError, match="max_len"):
        SeqRecDataModule(source, "unused", max_len=0)


def test_evaluation_user_samples_are_fixed_subsets_independent_of_the_run() -> None:
    sequences = {user: [user, user + 1, user + 2, user + 3] for user in range(1, 41)}
    source = _Prepared(sequences, num_items=44)

    def targets(stage: str, **users: int | None) -> list[int]:
        module = SeqRecDataModule(source, "unused", max_len=3, eval_batch_size=64, **users)
        module.setup("fit")
        torch.manual_seed(123)  # the run's seed must not move the sample
        return _only_batch(getattr(module, f"{stage}_dataloader")())["targets"].tolist()

    every_val, every_test = targets("val"), targets("test")
    assert len(every_val) == 40
    sampled = targets("val", val_users=7)
    assert len(set(sampled)) == 7 and set(sampled) <= set(every_val)
    assert sampled == sorted(sampled)  # rows keep the split's order
    assert targets("val", val_users=7) == sampled
    assert targets("test", val_users=7) == every_test  # the test is not sampled unless asked
    # The same users are tested as validated: each test target follows its validation target.
    assert [t - 1 for t in targets("test", test_users=7)] == sampled
    assert targets("val", val_users=1000) == every_val


@pytest.mark.parametrize("setting", ["val_users", "test_users"])
def test_evaluation_user_samples_must_be_positive(setting: str) -> None:
    source = _Prepared({1: [1, 2, 3]}, num_items=3)
    with pytest.raises(ConfigError, match=f"task.datamodule.{setting}"):
        SeqRecDataModule(source, "unused", max_len=3, **{setting: 0})
