"""End to end: the real configs composed through Hydra train, test and write results."""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_RUN, sampler_overrides
from hydra.utils import instantiate

from recsys_midx.app.experiment import build, train, warn_top_cells_with_corrected_positive
from recsys_midx.app.threads import DEFAULT_CAP, available_cores

#: The sampler each ``sampler=`` config builds (``full`` builds none: the exact softmax).
SAMPLERS = {
    "full": None,
    "uniform": "UniformSampler",
    "popularity": "PopularitySampler",
    "inbatch": "InBatchSampler",
    "midx": "MIDXSampler",
    "midx_pop": "MIDXSampler",
    "midx_rq": "MIDXSampler",
    "midx_exact": "MIDXSampler",
    "midx_plain": "MIDXSampler",
    "kernel": "KernelSampler",
    "lsh": "LSHSampler",
    "sir": "SIRSampler",
    "dns": "DNSSampler",
}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sasrec", "gru4rec"])
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_every_sampler_and_model_trains_and_tests(compose_config, tmp_path, sampler, model):
    cfg = compose_config([*TINY_RUN, *sampler_overrides(sampler), f"model={model}"])
    results = train(cfg)

    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["metrics"] == pytest.approx(results["metrics"])
    for split in ("val", "test"):
        for metric in ("hr", "ndcg", "mrr"):
            for k in (10, 20):
                assert 0.0 <= saved["metrics"][f"{split}/{metric}@{k}"] <= 1.0
    if SAMPLERS[sampler] is None:
        assert saved["negatives"] == "none" and "_target_" not in saved["config"]["sampler"]
    else:
        assert saved["config"]["sampler"]["_target_"].endswith(SAMPLERS[sampler])
        assert saved["negatives"] == "per_query"
    assert saved["epochs_run"] == 2
    assert saved["best_epoch"] in (0, 1)
    assert saved["dataset"]["items"] <= 80
    assert saved["seconds_per_epoch"] > 0
    assert saved["peak_memory_mb"]["cpu_rss"] > 0
    # MIDX sizes its exact top cells from the catalog (none on one this small, which the budget
    # would mostly cover) and the loss counts positives as the sampler prefers; results.json
    # says what was used.
    assert saved["sampler"]["sizing"].get("exact_top_codewords", 0) == 0
    assert saved["exact_positives"] is (None if sampler == "full" else False)
    with (tmp_path / "run" / "epochs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(float(row["epoch"])) for row in rows] == [0, 1]
    assert all(float(row["train/loss"]) > 0 and "val/ndcg@10" in row for row in rows)
    assert Path(saved["best_checkpoint"]).is_file()


@pytest.mark.slow
def test_validation_inside_epochs_writes_a_row_per_validation(compose_config, tmp_path):
    # Four batches an epoch, validated after the third: a row for the three batches and their
    # validation, and one for the epoch's last batch, which carries no validation metrics (the
    # trainer still holds the previous validation's); their training seconds add up to the
    # epoch's.
    results = train(
        compose_config([*TINY_RUN, *sampler_overrides("uniform"), "trainer.val_check_interval=3"])
    )
    with (tmp_path / "run" / "epochs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(float(row["epoch"])) for row in rows] == [0, 0, 1, 1]
    assert [bool(row["val/ndcg@10"]) for row in rows] == [True, False, True, False]
    assert all(float(row["train/loss"]) > 0 for row in rows)
    per_epoch = [
        float(rows[0]["train_seconds"]) + float(rows[1]["train_seconds"]),
        float(rows[2]["train_seconds"]) + float(rows[3]["train_seconds"]),
    ]
    assert results["seconds_per_epoch"] == pytest.approx(sum(per_epoch) / 2)
    assert results["epochs_run"] == 2 and results["best_epoch"] in (0, 1)


def _run_train(
    *overrides: str, multirun: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    command = [sys.executable, "train.py", *(["-m"] if multirun else []), *overrides]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_train_py_writes_everything_under_hydra_run_dir(tmp_path):
    run_dir = tmp_path / "chosen"
    done = _run_train(
        *TINY_RUN,
        *sampler_overrides("uniform"),
        "trainer.max_epochs=1",
        f"paths.data_dir={tmp_path / 'data'}",
        f"hydra.run.dir={run_dir}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "results.json").is_file()
    assert (run_dir / "epochs.csv").is_file()
    assert any((run_dir / "checkpoints").glob("best-*.ckpt"))
    assert str(run_dir / "results.json") in done.stdout.replace("\n", "")
    assert "ndcg@10" in done.stdout


@pytest.mark.slow
def test_parallel_multirun_sweeps_samplers_and_divides_the_cores(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # Without OMP_NUM_THREADS the jobs' threads come from the cores and the launcher's n_jobs.
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    done = _run_train(
        *TINY_RUN,
        "trainer.max_epochs=1",
        f"paths.data_dir={tmp_path / 'data'}",
        "sampler=uniform,popularity",
        "sampler.num_negatives=20",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep_dir}",
        multirun=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    samplers = {
        json.loads(path.read_text())["config"]["sampler"]["_target_"].rsplit(".", 1)[1]
        for path in sweep_dir.glob("*/results.json")
    }
    assert samplers == {"UniformSampler", "PopularitySampler"}
    threads = max(1, min(DEFAULT_CAP, available_cores() // 2))
    logs = [path.read_text() for path in sweep_dir.glob("*/train.log")]
    assert len(logs) == 2 and all(f"threads: {threads} per process" in log for log in logs)


@pytest.mark.slow
def test_unknown_sampler_lists_the_valid_options(tmp_path):
    done = _run_train("sampler=nope", f"hydra.run.dir={tmp_path}")
    assert done.returncode != 0
    message = done.stderr + done.stdout
    assert "Could not find 'sampler/nope'" in message
    for option in ("full", "uniform", "popularity"):
        assert option in message


#: The command-line overrides that recsys_midx/conf/experiment/synthetic-100k.yaml stands for.
SYNTHETIC_100K = (
    "dataset.name=synthetic-100k",
    "dataset.num_items=100000",
    "dataset.num_users=10000",
    "dataset.num_topics=100",
    "model.max_len=20",
    "model.dim=32",
    "sampler.num_negatives=32",
    "task.module.optimizer.lr=0.005",
    "trainer.max_epochs=30",
    "callbacks.early_stopping.patience=3",
    "task.datamodule.train_samples=last_window",
    "task.datamodule.batch_size=128",
)


@pytest.mark.parametrize("sampler", ["full", "midx", "uniform"])
def test_experiment_composes_to_its_overrides_and_yields_to_the_command_line(
    compose_config, sampler
):
    named = compose_config(["experiment=synthetic-100k", f"sampler={sampler}"])
    spelled_out = compose_config([*SYNTHETIC_100K, f"sampler={sampler}"])
    assert named == spelled_out
    assert named.sampler.get("_target_", "").endswith(SAMPLERS[sampler] or "")
    later = compose_config(["experiment=synthetic-100k", "sampler.num_negatives=8", "model.dim=16"])
    assert (later.sampler.num_negatives, later.model.dim) == (8, 16)
    assert later.dataset.num_items == 100000


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (["sampler.exact_top_codewords=2", "negatives.correct_positive=true"], True),
        (["sampler.exact_top_codewords=2", "negatives.correct_positive=false"], False),
        (["sampler.exact_top_codewords=2"], False),
        (["sampler.exact_top_codewords=0", "negatives.correct_positive=true"], False),
        # Sized from the catalog (the default null): the built sampler says what it uses.
        (["negatives.correct_positive=true"], True),
        (["negatives=shared", "negatives.correct_positive=true"], True),
    ],
    ids=[
        "top-cells-usual-correction",
        "top-cells-exact-positives",
        "top-cells-strategy-follows",
        "no-top-cells",
        "sized-top-cells-usual-correction",
        "shared-usual-correction",
    ],
)
def test_exact_top_cells_without_exact_positives_are_flagged(
    compose_config, caplog, overrides, warned
):
    cfg = compose_config(["sampler=midx", *overrides])
    sampler = instantiate(cfg.sampler, num_items=100_000)
    with caplog.at_level(logging.WARNING, logger="recsys_midx.app.experiment"):
        assert warn_top_cells_with_corrected_positive(sampler, instantiate(cfg.negatives)) is warned
    assert ("negatives.correct_positive=true" in caplog.text) is warned


@pytest.mark.slow
def test_resumed_run_keeps_the_checkpointed_midx_proposal(compose_config, tmp_path):
    train(compose_config([*TINY_RUN, *sampler_overrides("midx")]))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    saved = {
        key.removeprefix("sampler."): value
        for key, value in torch.load(last, weights_only=True)["state_dict"].items()
        if key.startswith("sampler.")
    }
    # Resuming at the end of training runs the fit start-up but no further epoch: the sampler
    # must be the checkpointed one, not rebuilt from the restored table.
    experiment = build(compose_config([*TINY_RUN, *sampler_overrides("midx")]))
    experiment.trainer.fit(experiment.module, experiment.datamodule, ckpt_path=str(last))
    resumed = experiment.module.sampler.state_dict()
    assert saved.keys() == resumed.keys()
    for key, value in saved.items():
        assert torch.equal(resumed[key], value), key


@pytest.mark.slow
@pytest.mark.parametrize("table_optimizer", ["sparse_adam", "rowwise_adagrad"])
@pytest.mark.parametrize(
    "overrides",
    [
        sampler_overrides("inbatch"),
        [*sampler_overrides("midx"), "head=moe"],
        [*sampler_overrides("dns"), "+trainer.precision=bf16-mixed"],
        [*sampler_overrides("uniform"), "negatives=outside_window"],
        [*sampler_overrides("midx"), "model.separate_output_table=true"],
    ],
    ids=["inbatch", "midx-moe", "dns-bf16", "outside-window", "midx-separate-output-table"],
)
def test_sparse_table_optimizers_train_and_test(compose_config, overrides, table_optimizer):
    cfg = compose_config(
        [
            *TINY_RUN,
            *overrides,
            f"task.module.table_optimizer={table_optimizer}",
            "task.module.table_lr=0.05",
        ]
    )
    results = train(cfg)
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())
