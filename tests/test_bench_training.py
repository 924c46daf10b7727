"""The training-step benchmark builds its runs as training does and times their own step."""

from __future__ import annotations

import argparse

import pytest
from conftest import load_script

from recsys_midx.lit import SeqRecModule

bench_training = load_script("bench_training")

#: A measurement in a second: a small catalog, model and batch.
TINY = argparse.Namespace(
    users=60,
    batch_size=8,
    max_len=10,
    dim=16,
    negatives=20,
    steps=2,
    seed=0,
    memory_limit_gib=1.0,
    timeout=60.0,
    shared_negatives=False,
    train_samples="last_window",
    device="cpu",
    precision="32",
)


def test_a_run_is_the_training_config_with_the_benchmarks_sizes() -> None:
    cfg = bench_training.compose_run(TINY, "midx+top2")
    assert cfg.sampler._target_.endswith("MIDXSampler") and cfg.sampler.exact_top_codewords == 2
    assert (cfg.sampler.num_negatives, cfg.model.dim, cfg.model.max_len) == (20, 16, 10)
    assert cfg.task.datamodule.batch_size == 8 and cfg.negatives._target_.endswith("PerQuery")
    assert bench_training.compose_run(TINY, "kernel").sampler._target_.endswith("KernelSampler")
    sparse = bench_training.compose_run(TINY, "midx+top2/rowwise_adagrad")
    assert sparse.task.module.table_optimizer == "rowwise_adagrad"
    assert sparse.sampler.exact_top_codewords == 2
    assert bench_training.compose_run(TINY, "uniform").task.module.table_optimizer is None


@pytest.mark.parametrize("sampler", ["full", "midx+top1", "popularity", "uniform/sparse_adam"])
def test_each_timed_step_is_the_modules_training_step(monkeypatch, sampler) -> None:
    steps = []
    training_step = SeqRecModule.training_step

    def counted(module, batch, batch_idx):
        steps.append(batch_idx)
        return training_step(module, batch, batch_idx)

    monkeypatch.setattr(SeqRecModule, "training_step", counted)
    row = bench_training.measure(TINY, sampler, 300)
    assert steps == [0, 1, 2]  # the warm-up step, then the timed ones
    assert row["step_seconds"] > 0 and row["build_seconds"] >= 0 and row["peak_mb"] > 0


def test_unknown_samplers_are_refused_with_the_choices() -> None:
    assert bench_training.parse_sampler("midx+top3") == "midx+top3"
    with pytest.raises(argparse.ArgumentTypeError, match="'bogus': use one of .*'uniform'"):
        bench_training.parse_sampler("bogus")
    with pytest.raises(argparse.ArgumentTypeError, match="/sparse_adam or /rowwise_adagrad"):
        bench_training.parse_sampler("uniform/adam")
