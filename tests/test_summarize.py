"""The sweep summary script: mean ± std per group, and its three plots, on a hand-written tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from recsys_midx.reports import run_names, summary_plots
from recsys_midx.reports.time_to_quality import time_to_quality, to_markdown

ROOT = Path(__file__).resolve().parents[1]
SAMPLER_TARGETS = {
    "full": {"_target_": "recsys_midx.samplers.FullSampler"},
    "uniform": {"_target_": "recsys_midx.samplers.UniformSampler", "num_negatives": 32},
}
#: Test NDCG@10 per (sampler, seed); means 0.2 and 0.1, sample std 0.02 and 0.01.
NDCG = {
    ("full", 0): 0.18,
    ("full", 1): 0.20,
    ("full", 2): 0.22,
    ("uniform", 0): 0.09,
    ("uniform", 1): 0.11,
}


def _write_run(folder: Path, sampler: str, seed: int, loss: dict | None = None) -> None:
    """One run as a training run leaves it: results.json and epochs.csv (without a ``loss``
    config, as runs from before output heads)."""
    folder.mkdir(parents=True)
    ndcg = NDCG[(sampler, seed)]
    results = {
        "config": {
            "dataset": {"name": "tiny"},
            "seed": seed,
            "model": {"_target_": "recsys_midx.models.SASRec"},
            "sampler": SAMPLER_TARGETS[sampler],
            **({"loss": loss} if loss else {}),
        },
        "metrics": {
            "test/ndcg@10": ndcg,
            "test/hr@10": 2 * ndcg,
            "test/mrr@10": ndcg / 2,
            "val/ndcg@10": ndcg + 0.01,
        },
        "epochs_run": 3,
        "best_epoch": 2,
        "seconds_per_epoch": 1.5 + seed,
        "train_wall_seconds": 3 * (1.5 + seed),
    }
    (folder / "results.json").write_text(json.dumps(results))
    pd.DataFrame(
        {
            "epoch": [0.0, 1.0, 2.0],
            "train_seconds": [1.5 + seed] * 3,
            "val_seconds": [0.25] * 3,
            "train/loss": [3.0, 2.0, 1.0],
            "val/ndcg@10": [ndcg / 2, ndcg, ndcg + 0.01],
        }
    ).to_csv(folder / "epochs.csv", index=False)


def _write_task_run(
    folder: Path,
    sampler: str,
    config: dict,
    metrics: dict[str, float],
    curve: list[float],
    val_seconds: float,
) -> None:
    """One seed-0 run of another task (``config``: its dataset, task and model): results.json
    with ``metrics``, and epochs.csv with a second of training an epoch and ``curve`` as the
    values of the metric its task monitors, the last epoch the best."""
    folder.mkdir()
    results = {
        "config": {"seed": 0, **config, "sampler": SAMPLER_TARGETS[sampler]},
        "metrics": metrics,
        "epochs_run": len(curve),
        "best_epoch": len(curve) - 1,
        "seconds_per_epoch": 1.0,
        "train_wall_seconds": float(len(curve)),
    }
    (folder / "results.json").write_text(json.dumps(results))
    pd.DataFrame(
        {
            "epoch": [float(epoch) for epoch in range(len(curve))],
            "train_seconds": 1.0,
            "val_seconds": val_seconds,
            config["task"]["monitor"]: curve,
        }
    ).to_csv(folder / "epochs.csv", index=False)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A multirun folder with 3 seeds of ``full`` and 2 of ``uniform``."""
    for job, (sampler, seed) in enumerate(NDCG):
        _write_run(tmp_path / "multirun" / str(job), sampler, seed)
    return tmp_path / "multirun"


@pytest.mark.slow
def test_summary_table_and_plots(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "summarize.py"), str(sweep), "--plots", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    table = pd.read_csv(out / "summary.csv").set_index("sampler")
    assert table.loc["full", "seeds"] == 3 and table.loc["uniform", "seeds"] == 2
    assert table.loc["full", "test/ndcg@10 mean"] == pytest.approx(0.20)
    assert table.loc["full", "test/ndcg@10 std"] == pytest.approx(0.02)  # sample std (ddof 1)
    assert table.loc["uniform", "test/ndcg@10 mean"] == pytest.approx(0.10)
    assert table.loc["uniform", "test/ndcg@10 std"] == pytest.approx(0.01 * 2**0.5)
    assert table.loc["uniform", "negatives"] == 32
    assert table.loc["full", "s/epoch mean"] == pytest.approx(2.5)

    markdown = (out / "summary.md").read_text()
    assert "| tiny | SASRec | dot | full | - | 3 | 0.2000 ± 0.0200 |" in markdown
    assert markdown in done.stdout
    for name in ("test_quality", "val_quality_vs_time", "epoch_time"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.slow
def test_plots_default_next_to_first_folder(sweep: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "summarize.py"), str(sweep)],
        capture_output=True,
        check=True,
    )
    assert {p.name for p in sweep.glob("*.png")} == {
        "test_quality.png",
        "val_quality_vs_time.png",
        "epoch_time.png",
    }


@pytest.mark.slow
def test_no_results_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "summarize.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "no results.json" in done.stderr


@pytest.mark.slow
def test_heads_and_objectives_are_groups_of_their_own(tmp_path: Path) -> None:
    softmax = "recsys_midx.losses.SoftmaxLoss"
    losses = {
        "plif": {"_target_": softmax, "head": {"_target_": "recsys_midx.heads.PLIFHead"}},
        "dot": {"_target_": softmax, "head": {"_target_": "recsys_midx.heads.DotHead"}},
        "edrep": {"_target_": "recsys_midx.losses.EDRepLoss"},
    }
    for job, loss in enumerate(losses.values()):
        _write_run(tmp_path / "multirun" / str(job), "full", 0, loss)
    _write_run(tmp_path / "multirun" / "3", "full", 1)  # no loss config: the dot head
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "summarize.py"),
            str(tmp_path / "multirun"),
            "--plots",
            str(tmp_path / "report"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    table = pd.read_csv(tmp_path / "report" / "summary.csv").set_index(["head", "sampler"])
    # EDRep estimates the softmax itself: it names its runs, as SCE does.
    assert sorted(table.index) == [("dot", "edrep"), ("dot", "full"), ("plif", "full")]
    assert table.loc[("dot", "full"), "seeds"] == 2 and table.loc[("plif", "full"), "seeds"] == 1


def _name(sampler: dict, loss: dict, callbacks: dict | None = None, result=None, **rest) -> str:
    config = {"sampler": sampler, "loss": loss, "callbacks": callbacks or {}, **rest}
    return run_names.sampler_label(config, result)


def test_sampler_names_show_non_default_midx_settings_and_exact_positives() -> None:
    midx = {"_target_": "recsys_midx.samplers.MIDXSampler", "num_codewords": 64}
    softmax = {"_target_": "recsys_midx.losses.SoftmaxLoss"}
    default_refresh = {"sampler_refresh": {"every_n_epochs": 1, "every_n_steps": 0}}
    assert _name(midx, softmax, default_refresh) == "midx[pq,uniform]"
    finer = {**midx, "num_codewords": 256, "quantizer": "rq"}
    every_10_steps = {"sampler_refresh": {"every_n_epochs": 1, "every_n_steps": 10}}
    refreshed = _name(finer, softmax, every_10_steps)
    assert refreshed == "midx[rq,uniform,K=256,refresh/10 steps]"
    # Runs from before the schedule moved to the callback kept it in the sampler.
    older = {**finer, "refresh_every_n_steps": 10}
    assert _name(older, softmax) == "midx[rq,uniform,K=256,refresh/10 steps]"
    top = {**midx, "exact_top_codewords": 8}
    exact = {"_target_": "recsys_midx.negatives.PerQuery", "correct_positive": False}
    labelled = "midx[pq,uniform,exact top 8], exact positives"
    assert _name(top, softmax, negatives=exact) == labelled
    # Sized from the catalog: the run's results say what was used.
    sized = {**midx, "exact_top_codewords": None}
    left_to_sampler = {**exact, "correct_positive": None}
    result = {"sampler": {"sizing": {"exact_top_codewords": 6}}, "exact_positives": True}
    assert (
        _name(sized, softmax, default_refresh, result, negatives=left_to_sampler)
        == "midx[pq,uniform,exact top 6], exact positives"
    )
    uniform = {"_target_": "recsys_midx.samplers.UniformSampler"}
    assert _name(uniform, softmax, negatives=exact) == "uniform, exact positives"
    shared = {**exact, "_target_": "recsys_midx.negatives.SharedByBatch"}
    assert _name(uniform, softmax, negatives=shared) == "uniform, shared, exact positives"
    per_sequence = {"_target_": "recsys_midx.negatives.PerSequence"}
    assert (
        _name(top, softmax, negatives=per_sequence) == "midx[pq,uniform,exact top 8], per sequence"
    )
    # EDRep estimates the softmax itself: its exact positives are its own, and it names the run.
    edrep = {"_target_": "recsys_midx.losses.EDRepLoss", "exact_positives": True}
    none = {"_target_": "recsys_midx.negatives.NoNegatives"}
    assert _name(uniform, edrep, negatives=none) == "edrep"
    assert _name({"num_negatives": None}, softmax, negatives=none) == "full"


def test_runs_recorded_before_the_negatives_group_keep_their_names() -> None:
    uniform = {"_target_": "recsys_midx.samplers.UniformSampler"}
    exact_positives = {"_target_": "recsys_midx.losses.SoftmaxLoss", "exact_positives": True}
    assert _name(uniform, exact_positives) == "uniform, exact positives"
    shared = {**exact_positives, "shared_negatives": True}
    assert _name(uniform, shared) == "uniform, shared, exact positives"
    window = {"_target_": "recsys_midx.losses.WindowSoftmaxLoss", "negatives": "outside"}
    assert _name(uniform, window) == "uniform, outside window"
    proposal = {**window, "negatives": "proposal"}
    midx = {"_target_": "recsys_midx.samplers.MIDXSampler"}
    assert _name(midx, proposal) == "midx[pq,uniform], per sequence"
    full = {"_target_": "recsys_midx.samplers.FullSampler"}
    assert _name(full, exact_positives) == "full"
    config = {"sampler": full, "loss": exact_positives}
    assert (run_names.family(config), run_names.colour(config)) == run_names.EXACT_FAMILY


def _summarize_module():
    from recsys_midx.app import summarize

    return summarize


def _write_sweep_run(folder: Path, seed: int, dim: int, ndcg: float) -> None:
    """A run as a sweep over ``model.dim`` and ``seed`` leaves it: the seed reaches the sampler
    (``sampler.seed: ${seed}``) and the output folder reaches the checkpoint callback."""
    folder.mkdir(parents=True)
    config = {
        "dataset": {"name": "tiny"},
        "seed": seed,
        "model": {"_target_": "recsys_midx.models.SASRec", "dim": dim},
        "sampler": {**SAMPLER_TARGETS["uniform"], "seed": seed},
        "paths": {"output_dir": str(folder)},
        "callbacks": {"model_checkpoint": {"dirpath": f"{folder}/checkpoints"}},
    }
    results = {
        "config": config,
        "output_dir": str(folder),
        "metrics": {
            "test/ndcg@10": ndcg,
            "test/hr@10": ndcg,
            "test/mrr@10": ndcg,
            "val/ndcg@10": ndcg,
        },
        "epochs_run": 1,
        "best_epoch": 0,
        "seconds_per_epoch": 1.0,
        "train_wall_seconds": 1.0,
    }
    (folder / "results.json").write_text(json.dumps(results))


def test_runs_that_differ_in_more_than_the_seed_are_not_averaged(tmp_path: Path) -> None:
    summarize = _summarize_module()
    _write_sweep_run(tmp_path / "0", seed=0, dim=16, ndcg=0.2353)
    _write_sweep_run(tmp_path / "1", seed=0, dim=64, ndcg=0.5287)
    table = summarize.summarize(summarize.load_runs([tmp_path]))
    assert sorted(table["settings"]) == ["model.dim=16", "model.dim=64"]
    assert table.set_index("settings")["test/ndcg@10 mean"].to_dict() == {
        "model.dim=16": 0.2353,
        "model.dim=64": 0.5287,
    }
    assert list(table["seeds"]) == [1, 1]
    markdown = summarize.to_markdown(table)
    # One run per row: its value, without a made-up spread.
    assert "| model.dim=16 | 1 | 0.2353 |" in markdown and "±" not in markdown


def test_a_seed_sweep_is_one_row_counting_its_seeds(tmp_path: Path) -> None:
    summarize = _summarize_module()
    for seed, ndcg in enumerate((0.18, 0.20, 0.22)):
        _write_sweep_run(tmp_path / str(seed), seed=seed, dim=64, ndcg=ndcg)
    table = summarize.summarize(summarize.load_runs([tmp_path]))
    assert len(table) == 1 and table.loc[0, "seeds"] == 3 and table.loc[0, "settings"] == ""
    assert table.loc[0, "test/ndcg@10 std"] == pytest.approx(0.02)
    assert "| tiny | SASRec | dot | uniform | 32 | 3 | 0.2000 ± 0.0200 |" in (
        summarize.to_markdown(table)
    )


def test_the_seed_a_sampler_takes_from_the_run_is_no_setting(tmp_path: Path) -> None:
    summarize = _summarize_module()
    for seed, ndcg in enumerate((0.18, 0.20, 0.22)):
        _write_sweep_run(tmp_path / f"uniform-{seed}", seed=seed, dim=64, ndcg=ndcg)
        _write_run(tmp_path / f"full-{seed}", "full", seed)  # no sampler.seed: exact softmax
    table = summarize.summarize(summarize.load_runs([tmp_path]))
    assert sorted(table["seeds"]) == [3, 3] and set(table["settings"]) == {""}


def test_a_setting_already_named_by_the_row_adds_no_label(tmp_path: Path) -> None:
    summarize = _summarize_module()
    runs = summarize.load_runs([_write_two_samplers(tmp_path)])
    assert set(runs["settings"]) == {""}


def test_runs_carry_the_family_and_colour_reports_give_their_sampler(tmp_path: Path) -> None:
    summarize = _summarize_module()
    runs = summarize.load_runs([_write_two_samplers(tmp_path)]).set_index("sampler")
    for family, colour in (run_names.EXACT_FAMILY, run_names.SAMPLER_FAMILIES["UniformSampler"]):
        assert tuple(runs.loc[family, ["family", "colour"]]) == (family, colour)
    softmax = {"_target_": "recsys_midx.losses.SoftmaxLoss"}
    midx = {"_target_": "recsys_midx.samplers.MIDXSampler", "quantizer": "rq"}
    assert _name(midx, softmax) == "midx[rq,uniform]"
    # A sampler from outside the package is named by its class.
    foreign = {"sampler": {"_target_": "my_package.WeightedSampler"}, "loss": softmax}
    assert run_names.sampler_label(foreign) == "weighted"
    assert run_names.colour(foreign) == run_names.OTHER_COLOUR


def test_an_objective_picking_its_own_candidates_names_the_run(tmp_path: Path) -> None:
    summarize = _summarize_module()
    sce = {"_target_": "recsys_midx.losses.ScalableCrossEntropyLoss", "num_buckets": 256}
    _write_run(tmp_path / "sce", "uniform", 0, sce)  # its sampler config draws nothing
    _write_run(tmp_path / "uniform", "uniform", 1)
    runs = summarize.load_runs([tmp_path]).set_index("sampler")
    assert tuple(runs.loc["sce", ["head", "family"]]) == ("dot", "sce")
    assert pd.isna(runs.loc["sce", "negatives"])
    assert runs.loc["sce", "colour"] == run_names.OTHER_COLOUR
    assert runs.loc["uniform", "negatives"] == 32
    labels = summary_plots.with_labels(runs.reset_index()).set_index("sampler")["label"]
    assert labels.to_dict() == {"sce": "sce", "uniform": "uniform (M=32)"}


def _write_two_samplers(tmp_path: Path) -> Path:
    for job, (sampler, seed) in enumerate([("full", 0), ("uniform", 0)]):
        _write_run(tmp_path / "multirun" / str(job), sampler, seed)
    return tmp_path / "multirun"


def test_time_to_quality_times_each_share_of_the_exact_softmaxs_best() -> None:
    def run(sampler: str, path: str, elapsed: list[float], values: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "dataset": "d",
                "model": "m",
                "sampler": sampler,
                "label": sampler,
                "path": path,
                "epoch": range(len(elapsed)),
                "elapsed": elapsed,
                "quality": values,
            }
        )

    epochs = pd.concat(
        [
            # The exact softmax's best, averaged over its runs: (1.0 + 0.8) / 2 = 0.9.
            run("full", "f0", [10.0, 20.0, 30.0], [0.5, 0.9, 1.0]),
            run("full", "f1", [10.0, 20.0], [0.7, 0.8]),
            run("midx", "m0", [5.0, 10.0], [0.82, 0.88]),  # 90% (0.81) at 5 s, 97% (0.873) at 10 s
            run("midx", "m1", [6.0, 12.0], [0.7, 0.86]),  # 90% and 95% (0.855) at 12 s, never 97%
        ],
        ignore_index=True,
    )
    table = time_to_quality(epochs).set_index("label")
    # Frontier first: midx reaches 97% at 10 s, the exact softmax at 20 s.
    assert table.index.tolist() == ["midx", "full"]
    assert table.loc["full", "s per epoch"] == pytest.approx((30.0 + 20.0) / 5)
    assert table.loc["full", "best share"] == pytest.approx(1.0)
    assert table.loc["midx", "best share"] == pytest.approx((0.88 + 0.86) / 2 / 0.9)
    assert table.loc["midx", "s to 0.9"] == pytest.approx((5.0 + 12.0) / 2)
    assert table.loc["midx", "s to 0.95"] == pytest.approx((10.0 + 12.0) / 2)
    assert table.loc["midx", "s to 0.97"] == pytest.approx(10.0)
    assert table.loc["midx", "reached 0.97"] == 1
    # The exact softmax's own runs: f0 reaches every share at 20 s, f1 not even 90%.
    assert table.loc["full", "s to 0.9"] == pytest.approx(20.0)
    markdown = to_markdown(table.reset_index())
    assert "| d | m | midx | 2 | 96.7% | 8 | 11 | 10 (1/2 runs) | 5.5 |" in markdown
    assert (
        "| d | m | full | 2 | 100.0% | 20 (1/2 runs) | 20 (1/2 runs) | 20 (1/2 runs) | 10.0 |"
        in markdown
    )


def test_time_to_quality_counts_epochs_not_validations() -> None:
    # Validated twice an epoch: four rows, two epochs of 10 s each.
    epochs = pd.DataFrame(
        {
            "dataset": "d",
            "model": "m",
            "sampler": "full",
            "label": "full",
            "path": "a",
            "epoch": [0, 0, 1, 1],
            "elapsed": [5.0, 10.0, 15.0, 20.0],
            "quality": [0.5, 0.7, 0.9, 1.0],
        }
    )
    assert time_to_quality(epochs).loc[0, "s per epoch"] == pytest.approx(10.0)


def test_time_to_quality_lists_the_frontier_first() -> None:
    def run(label: str, values: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "dataset": "d",
                "model": "m",
                "sampler": label,
                "label": label,
                "path": label,
                "epoch": range(len(values)),
                "elapsed": [1.0, 2.0, 3.0][: len(values)],
                "quality": values,
            }
        )

    epochs = pd.concat(
        [
            run("low", [0.5]),  # reaches no share, lower best
            run("to 90 at 1 s", [0.91]),  # 90% only, soonest of all
            run("high", [0.89]),  # reaches no share, higher best
            run("to 95 at 3 s", [0.1, 0.1, 0.96]),
            run("to 95 at 2 s", [0.1, 0.96]),
            run("full", [0.5, 0.9, 1.0]),  # 97% at 3 s
        ],
        ignore_index=True,
    )
    assert time_to_quality(epochs)["label"].tolist() == [
        "full",
        "to 95 at 2 s",
        "to 95 at 3 s",
        "to 90 at 1 s",
        "high",
        "low",
    ]


def test_time_to_quality_leaves_out_panels_without_the_exact_softmax() -> None:
    epochs = pd.DataFrame(
        {
            "dataset": "d",
            "model": "m",
            "sampler": "midx",
            "label": "midx",
            "path": "a",
            "epoch": [0],
            "elapsed": [1.0],
            "quality": [0.5],
        }
    )
    assert time_to_quality(epochs).empty


def test_extreme_classification_runs_are_summarised_by_the_metric_their_task_monitors(
    tmp_path: Path,
) -> None:
    from recsys_midx.app.summarize import load_runs, summarize
    from recsys_midx.app.summarize import to_markdown as table_markdown
    from recsys_midx.reports.summary_plots import epoch_rows, with_labels

    for sampler, p_at_1 in (("full", 0.8), ("uniform", 0.6)):
        _write_task_run(
            tmp_path / sampler,
            sampler,
            {
                "dataset": {"name": "xc"},
                "task": {"monitor": "val/p@1"},
                "model": {"_target_": "recsys_midx.models.XCMLP"},
            },
            {
                "test/p@1": p_at_1,
                "test/p@5": p_at_1 / 4,
                "test/psp@5": p_at_1 / 5,
                "val/p@1": p_at_1 + 0.01,
            },
            curve=[p_at_1 / 2, p_at_1 + 0.01],
            val_seconds=0.5,
        )

    runs = with_labels(load_runs([tmp_path]))
    markdown = table_markdown(summarize(runs))
    assert "| test/p@1 | test/p@5 | test/psp@5 | val/p@1 |" in markdown
    assert "ndcg" not in markdown
    table = time_to_quality(epoch_rows(runs)).set_index("label")
    assert table.loc["uniform (M=32)", "best share"] == pytest.approx(0.61 / 0.81)
    assert table.loc["full", "s to 0.97"] == pytest.approx(3.0)


def test_language_model_runs_are_timed_to_shares_of_the_lowest_perplexity(tmp_path: Path) -> None:
    from recsys_midx.app.summarize import load_runs
    from recsys_midx.reports.summary_plots import epoch_rows, exact_best, plot_all, with_labels

    # Perplexity per epoch: the exact softmax's best is 100; 95% of it is reached at 100 / 0.95.
    curves = {"full": [150.0, 104.0, 100.0], "uniform": [120.0, 105.0, 103.0]}
    for sampler, ppl in curves.items():
        _write_task_run(
            tmp_path / sampler,
            sampler,
            {
                "dataset": {"name": "ptb"},
                "task": {"monitor": "val/ppl", "monitor_mode": "min"},
                "model": {"_target_": "recsys_midx.models.LSTMLanguageModel"},
            },
            {"test/ppl": min(ppl) - 2, "val/ppl": min(ppl)},
            curve=ppl,
            val_seconds=0.0,
        )

    runs = with_labels(load_runs([tmp_path]))
    epochs = epoch_rows(runs)
    assert exact_best(epochs) == pytest.approx(100.0)
    table = time_to_quality(epochs).set_index("label")
    assert table.loc["uniform (M=32)", "best share"] == pytest.approx(100.0 / 103.0)
    assert table.loc["uniform (M=32)", "s to 0.95"] == pytest.approx(2.0)  # 105 <= 100 / 0.95
    assert table.loc["uniform (M=32)", "s to 0.97"] == pytest.approx(3.0)  # 103 <= 100 / 0.97
    assert table.loc["full", "s to 0.97"] == pytest.approx(3.0)  # 104 is not, 100 is
    (tmp_path / "plots").mkdir()
    assert set(plot_all(runs, epochs, tmp_path / "plots")) == {
        "test_quality",
        "val_quality_vs_time",
        "epoch_time",
    }
