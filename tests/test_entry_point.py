"""The training command's entry point returns and prints the config's ``optimized_metric``."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from recsys_midx.app import train as cli

#: Extreme classification data small enough for a run of a few seconds.
TINY_XC_DATA = (
    "dataset.num_labels=80",
    "dataset.num_features=300",
    "dataset.num_train=300",
    "dataset.num_test=100",
    "dataset.num_topics=8",
)

#: Sequential data small enough for a run of a few seconds.
TINY_SEQREC_DATA = ("dataset.num_users=120", "dataset.num_items=80")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "data", "monitor"),
    [("seqrec", TINY_SEQREC_DATA, "val/ndcg@10"), ("xc", TINY_XC_DATA, "val/p@1")],
)
def test_main_returns_and_prints_the_monitored_metric_of_the_best_epoch(
    compose_config, tmp_path: Path, capsys, task: str, data: tuple[str, ...], monitor: str
) -> None:
    cfg = compose_config(
        [
            f"task={task}",
            "debug=default",
            *data,
            "trainer.max_epochs=2",
            "sampler=uniform",
            "sampler.num_negatives=20",
        ]
    )
    assert cfg.optimized_metric == cfg.task.monitor == monitor

    value = cli.main(cfg)

    with (tmp_path / "run" / "epochs.csv").open() as handle:
        best = max(float(row[monitor]) for row in csv.DictReader(handle))
    assert isinstance(value, float) and value == pytest.approx(best)
    assert f"optimized_metric {monitor} = {value:.4f}" in capsys.readouterr().out.splitlines()


def test_optimized_metric_names_the_missing_metric_and_may_be_off(compose_config) -> None:
    results = {"metrics": {"val/ndcg@10": 0.5, "test/ndcg@10": 0.4}}
    assert cli.optimized_metric(compose_config(["optimized_metric=test/ndcg@10"]), results) == 0.4
    assert cli.optimized_metric(compose_config(["optimized_metric=null"]), results) is None
    with pytest.raises(KeyError, match="optimized_metric=val/p@1 is not among"):
        cli.optimized_metric(compose_config(["task=xc"]), results)
