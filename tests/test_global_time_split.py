"""Global temporal split: cut-offs, who is trained and evaluated on what, and the config."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import TINY_RUN, sampler_overrides
from hydra.utils import instantiate
from omegaconf import DictConfig

from recsys_midx.app.experiment import RESULTS_FILE, train
from recsys_midx.data.datamodule import SeqRecDataModule
from recsys_midx.data.pipeline import PreparedDataset
from recsys_midx.data.time_split import GlobalTime, GlobalTimeSplit

# (user, item, timestamp), sorted by user then time as in the processed Parquet. With cut-offs
# 6 (validation) and 8 (test):
#   user 1: trains on [1, 2]; validation 2 -> 3; test [1, 2, 3] -> 4 (5 at t=9 is never served)
#   user 2: trains on [1, 3]; validation [1, 3] -> 2; nothing after 8: not tested
#   user 3: trains on [4, 5]; nothing after 6: neither validated nor tested
#   user 4: nothing before 8: not served at all
#   user 5: nothing before 6: not trained on or validated; test [5] -> 1
ROWS = [
    (1, 1, 1),
    (1, 2, 3),
    (1, 3, 6),
    (1, 4, 8),
    (1, 5, 9),
    (2, 1, 0),
    (2, 3, 2),
    (2, 2, 7),
    (3, 4, 4),
    (3, 5, 5),
    (4, 1, 10),
    (4, 2, 11),
    (5, 5, 7),
    (5, 1, 9),
]
NUM_ITEMS = 5


def _dataset(rows: list[tuple[int, int, int]], stats: dict | None = None) -> PreparedDataset:
    frame = pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp"])
    return PreparedDataset(
        name="toy",
        directory=Path("."),
        interactions=frame,
        num_users=int(frame["user_id"].max()),
        num_items=NUM_ITEMS,
        stats=stats or {},
    )


def _slices(split: GlobalTimeSplit, stage: str) -> list[list[int]]:
    spans = split.spans(stage)
    return [split.items[s:e].tolist() for s, e in zip(spans.starts, spans.ends)]


def _targets(split: GlobalTimeSplit, stage: str) -> list[int]:
    return split.items[split.spans(stage).ends].tolist()


def test_cutoffs_by_quantile_and_by_timestamp() -> None:
    # 14 timestamps: position floor(0.65 * 14) = 9 holds 8, position floor(0.45 * 14) = 6 holds 6.
    by_quantile = GlobalTime(quantile=0.65, val_quantile=0.45).build(_dataset(ROWS))
    by_timestamp = GlobalTime(timestamp=8, val_timestamp=6).build(_dataset(ROWS))
    assert (by_quantile.val_cutoff, by_quantile.test_cutoff) == (6, 8)
    assert (by_timestamp.val_cutoff, by_timestamp.test_cutoff) == (6, 8)
    for stage in ("train", "val", "test"):
        assert _slices(by_quantile, stage) == _slices(by_timestamp, stage)
        assert _targets(by_quantile, stage) == _targets(by_timestamp, stage)
    # A timestamp replaces the quantile; ISO dates are read as UTC seconds.
    assert GlobalTime(quantile=0.5, timestamp="1970-01-01T00:00:08").timestamp == 8


def test_targets_are_the_first_interactions_after_the_cutoffs() -> None:
    split = GlobalTime(timestamp=8, val_timestamp=6).build(_dataset(ROWS))
    assert _slices(split, "train") == [[1, 2], [1, 3], [4, 5]]
    assert _slices(split, "val") == [[1, 2], [1, 3]]
    assert _targets(split, "val") == [3, 2]
    assert _slices(split, "test") == [[1, 2, 3], [5]]
    assert _targets(split, "test") == [4, 1]
    # Only training sequences are counted: items 1, 2, 1, 3, 4, 5.
    assert split.train_item_counts().tolist() == [0, 2, 1, 1, 1, 1]


def test_users_without_history_before_the_cutoff_are_not_evaluated() -> None:
    split = GlobalTime(timestamp=8, val_timestamp=6).build(_dataset(ROWS))
    # User 4 has nothing before either cut-off, user 5 nothing before the validation one.
    assert 4 not in split.user_ids.tolist()
    served = {
        stage: split.user_ids[
            np.searchsorted(split.offsets, split.spans(stage).starts, side="right") - 1
        ].tolist()
        for stage in ("train", "val", "test")
    }
    assert served == {"train": [1, 2, 3], "val": [1, 2], "test": [1, 5]}


def _reference(rows, val_cutoff: int, test_cutoff: int) -> dict[str, list]:
    """A loop-based statement of the protocol: (history, target) per evaluated user."""
    by_user: dict[int, list[tuple[int, int]]] = {}
    for user, item, time in rows:
        by_user.setdefault(user, []).append((time, item))
    out: dict[str, list] = {"train": [], "val": [], "test": []}
    for user in sorted(by_user):
        events = by_user[user]
        before_val = [item for time, item in events if time < val_cutoff]
        between = [item for time, item in events if val_cutoff <= time < test_cutoff]
        before_test = [item for time, item in events if time < test_cutoff]
        after_test = [item for time, item in events if time >= test_cutoff]
        if before_val:
            out["train"].append(before_val)
        if before_val and between:
            out["val"].append((before_val, between[0]))
        if before_test and after_test:
            out["test"].append((before_test, after_test[0]))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_random_interactions_follow_the_protocol(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_rows = 400
    frame = pd.DataFrame(
        {
            "user_id": rng.integers(1, 40, num_rows),
            "item_id": rng.integers(1, NUM_ITEMS + 1, num_rows),
            "timestamp": rng.integers(0, 100, num_rows),  # ties included
        }
    ).sort_values(["user_id", "timestamp"], kind="stable")
    rows = list(frame.itertuples(index=False, name=None))
    split = GlobalTime(quantile=0.85, val_quantile=0.7).build(_dataset(rows))
    times = np.sort(frame["timestamp"].to_numpy())
    assert split.test_cutoff == times[int(0.85 * num_rows)]
    assert split.val_cutoff == times[int(0.7 * num_rows)]
    expected = _reference(rows, split.val_cutoff, split.test_cutoff)
    # No training interaction at or after the validation cut-off, and none left out before it.
    assert _slices(split, "train") == expected["train"]
    for stage in ("val", "test"):
        assert list(zip(_slices(split, stage), _targets(split, stage))) == expected[stage]
    trained = [item for sequence in expected["train"] for item in sequence]
    assert (
        split.train_item_counts().tolist() == np.bincount(trained, minlength=NUM_ITEMS + 1).tolist()
    )


def test_row_order_is_the_time_without_a_time_column(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="recsys_midx.data.time_split"):
        GlobalTime(timestamp=8, val_timestamp=6).build(
            _dataset(ROWS, stats={"timestamp": "row position"})
        )
    assert "row order is taken as time" in caplog.text


def test_cutoff_settings_are_checked() -> None:
    for bad in (0, 1, 1.5, -0.1, "half"):
        with pytest.raises(ValueError, match=r"^split\.quantile must be a number in \(0, 1\)"):
            GlobalTime(quantile=bad)
    with pytest.raises(ValueError, match=r"split\.val_quantile=0\.9 must be below split\.quantile"):
        GlobalTime(quantile=0.8, val_quantile=0.9)
    with pytest.raises(ValueError, match=r"split\.val_quantile or split\.val_timestamp"):
        GlobalTime(val_quantile=None)
    with pytest.raises(ValueError, match=r"split\.timestamp must be seconds"):
        GlobalTime(timestamp="next tuesday")
    # Cut-offs that only meet on the data, and stages left without users.
    with pytest.raises(ValueError, match="not before the test cut-off"):
        GlobalTime(quantile=0.5, val_timestamp=100).build(_dataset(ROWS))
    with pytest.raises(ValueError, match="no user has interactions both before and after the test"):
        GlobalTime(timestamp=50, val_timestamp=6).build(_dataset(ROWS))


def test_bad_quantile_fails_before_any_data_is_read(
    compose_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = compose_config([*TINY_RUN, "split=global_time", "split.quantile=1.5"])
    with pytest.raises(Exception, match=r"split\.quantile must be a number in \(0, 1\), got 1\.5"):
        train(cfg)
    assert not (tmp_path / "data").exists()


def test_split_config_builds_the_data_module(compose_config: Callable[..., DictConfig]) -> None:
    default = instantiate(compose_config([*TINY_RUN]).task.datamodule)
    chosen = instantiate(
        compose_config([*TINY_RUN, "split=global_time", "split.timestamp=1000"]).task.datamodule
    )
    assert isinstance(default, SeqRecDataModule) and isinstance(chosen, SeqRecDataModule)
    assert type(default.splitter).__name__ == "LeaveOneOut"
    assert chosen.splitter == GlobalTime(quantile=0.9, timestamp=1000, val_quantile=0.8)


def test_training_with_a_global_time_split_writes_test_metrics(
    compose_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = compose_config(
        [
            *TINY_RUN,
            *sampler_overrides("midx"),
            "split=global_time",
            "split.quantile=0.9",
            "split.val_quantile=0.8",
        ]
    )
    results = train(cfg)
    assert 0.0 <= results["metrics"]["test/ndcg@10"] <= 1.0
    written = json.loads((tmp_path / "run" / RESULTS_FILE).read_text())
    assert "test/hr@10" in written["metrics"]
    assert written["config"]["split"]["_target_"] == "recsys_midx.data.time_split.GlobalTime"
