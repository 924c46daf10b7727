"""Topic diagnostics of synthetic runs: the generator's topics, the negatives' share in the
target's topic (against its known value for a uniform proposal), and rankings that agree with
the run's own evaluation."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import load_script
from omegaconf import OmegaConf
from trained_runs import train_synthetic_run

from recsys_midx import load_run
from recsys_midx.analysis import topic_shares
from recsys_midx.analysis.topics import internal_item_topics, negative_ids_per_query
from recsys_midx.data import Synthetic
from recsys_midx.negatives import Negatives, SequenceWindows


def test_item_topics_are_the_topics_the_walks_stay_in() -> None:
    source = Synthetic(num_users=300, num_items=120, num_topics=6, topic_switch_prob=0.05, seed=3)
    topics = source.item_topics()
    frame = source.generate()
    items = frame["item"].to_numpy()
    same_user = frame["user"].to_numpy()[1:] == frame["user"].to_numpy()[:-1]
    stays = topics[items[1:] - 1] == topics[items[:-1] - 1]
    # A step leaves its topic only on a switch (5%) to another topic (5 in 6): ~96% stay; a
    # topic map that is not the generator's would give about 1 in 6.
    assert 0.94 < stays[same_user].mean() < 0.98
    assert np.bincount(topics).tolist() == [20] * 6


def test_negative_ids_per_query_gives_every_query_its_columns() -> None:
    query = Negatives(
        "query",
        torch.tensor([[1, 2], [3, 4]]),
        excluded=torch.tensor([[False, True], [False, False]]),
    )
    assert negative_ids_per_query(query, 2).tolist() == [[1, 0], [3, 4]]
    batch = Negatives(
        "batch", torch.tensor([5, 6]), excluded=torch.tensor([[True, False], [False, False]])
    )
    assert negative_ids_per_query(batch, 2).tolist() == [[0, 6], [5, 6]]
    # Two sequences; the second has two query positions, so its row serves two queries.
    sequences = SequenceWindows.of_batch(
        torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[True, False], [True, True]])
    )
    sequence = Negatives(
        "sequence",
        torch.tensor([[7, 8], [9, 10]]),
        excluded=torch.tensor([[False, True], [False, False]]),
        sequences=sequences,
    )
    assert negative_ids_per_query(sequence, 3).tolist() == [[7, 0], [9, 10], [9, 10]]
    assert negative_ids_per_query(Negatives("catalog"), 3).shape == (3, 0)


def test_a_run_without_topics_is_refused_in_one_line() -> None:
    run = SimpleNamespace(
        datamodule=SimpleNamespace(source=object()),
        config=OmegaConf.create({"dataset": {"name": "ml-1m"}}),
    )
    with pytest.raises(ValueError, match="only for dataset=synthetic runs, not dataset=ml-1m$"):
        internal_item_topics(run)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny synthetic run with uniform negatives and one with the exact softmax."""
    root = tmp_path_factory.mktemp("topics")
    return {
        sampler: train_synthetic_run(root / sampler, root / "data", sampler)
        for sampler in ("uniform", "full")
    }


@pytest.mark.slow
def test_uniform_negatives_fall_in_the_topic_as_often_as_its_size_says(runs) -> None:
    run = load_run(runs["uniform"])
    topics = internal_item_topics(run)
    num_items = len(topics) - 1
    sizes = torch.bincount(topics[1:])
    assert num_items == 80 and sizes.tolist() == [4] * 20  # the tiny runs' 80 items, 20 topics
    shares = topic_shares(run, num_batches=100, max_users=10)
    # A uniform draw other than the positive is one of its topic's 3 other items w.p. 3 / 79.
    # About 26,000 draws: a standard error of 0.0012; counting the positive itself would give
    # 4 / 80 = 0.05, a map of internal ids to the wrong raw ids a topic size that is not 4.
    assert shares.negatives_per_query == pytest.approx(20, abs=0.5)
    assert shares.negatives_in_topic == pytest.approx(3 / 79, abs=0.005)


@pytest.mark.slow
def test_the_rankings_agree_with_the_runs_own_evaluation(runs) -> None:
    run = load_run(runs["full"])
    metrics = run.module.val_metrics.clone()
    with torch.no_grad():
        for batch in run.datamodule.val_dataloader():
            run.module.update_metrics(metrics, batch)
    evaluated = float(metrics.compute()["ndcg@10"])
    shares = topic_shares(run, max_users=10_000)
    assert shares.ndcg == pytest.approx(evaluated, abs=1e-6)
    # Ranked among its topic's items only, a target can only rise.
    assert evaluated <= shares.ndcg_within_topic <= 1
    assert 0 <= shares.top_in_topic <= 1
    # The exact softmax draws nothing.
    assert shares.negatives_per_query == 0 and math.isnan(shares.negatives_in_topic)


@pytest.mark.slow
def test_the_script_prints_a_table_and_writes_one_row_per_run(runs, tmp_path, capsys) -> None:
    out = tmp_path / "shares.csv"
    rows = load_script("topic_shares").main(
        [str(runs["uniform"]), str(runs["full"]), "--out", str(out), "--users", "20"]
    )
    printed = capsys.readouterr().out
    assert "| uniform | 20 |" in printed and "| full | 0 |" in printed
    with out.open() as handle:
        written = list(csv.DictReader(handle))
    assert [row["label"] for row in written] == ["uniform", "full"] == [r.label for r in rows]
