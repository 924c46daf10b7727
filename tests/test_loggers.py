"""Loggers (conf/logger): every choice records the validation metrics and the sampler's
diagnostics in its own files under the run directory, offline; a missing library stops the run
before any work."""

from __future__ import annotations

import csv
import importlib
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from conftest import CONF_DIR, TINY_RUN, sampler_overrides
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from recsys_midx.app.experiment import train
from recsys_midx.app.loggers import INSTALL_HINT, check_logger_packages

#: What every logger must receive: the validation metric and the sampler's diagnostics
#: (recsys_midx.lit.callbacks.SamplerRefresh logs these through trainer.loggers).
EXPECTED_METRICS = {"val/ndcg@10", "sampler/kl", "sampler/ess_fraction", "sampler/refresh_seconds"}

#: The entries of each logger choice (conf/logger/<choice>.yaml).
LOGGER_ENTRIES = {
    "csv": {"csv"},
    "none": set(),
    "tensorboard": {"tensorboard"},
    "mlflow": {"mlflow"},
    "wandb": {"wandb"},
    "many": {"csv", "tensorboard", "mlflow"},
}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No logger reaches the network or writes outside ``tmp_path``."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")


@pytest.mark.parametrize("choice", sorted(LOGGER_ENTRIES))
def test_logger_choice_composes_its_entries(
    compose_config: Callable[..., DictConfig], choice: str
) -> None:
    cfg = compose_config([f"logger={choice}"])
    assert set(cfg.logger or {}) == LOGGER_ENTRIES[choice]
    for logger in (cfg.logger or {}).values():
        assert logger._target_.startswith("lightning.pytorch.loggers.")
        # Every logger writes inside the run directory.
        location = str(logger.get("save_dir") or logger.get("tracking_uri"))
        assert str(Path(cfg.paths.output_dir)) in location


def test_offline_settings(compose_config: Callable[..., DictConfig]) -> None:
    cfg = compose_config(["logger=wandb"])
    assert cfg.logger.wandb.offline is True
    assert cfg.logger.wandb.project == "recsys_midx"
    assert compose_config(["logger=mlflow"]).logger.mlflow.tracking_uri.startswith("sqlite:///")


@pytest.mark.parametrize(
    ("choice", "module", "package"),
    [
        ("tensorboard", "tensorboard", "tensorboard"),
        ("mlflow", "mlflow", "mlflow-skinny"),
        ("mlflow", "sqlalchemy", "sqlalchemy"),
        ("wandb", "wandb", "wandb"),
    ],
)
def test_missing_library_is_named_with_the_install_command(
    compose_config: Callable[..., DictConfig],
    monkeypatch: pytest.MonkeyPatch,
    choice: str,
    module: str,
    package: str,
) -> None:
    cfg = compose_config([f"logger={choice}"])
    check_logger_packages(cfg)  # installed: nothing to say
    # A None entry in sys.modules makes the module unimportable (find_spec returns None).
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ModuleNotFoundError) as error:
        check_logger_packages(cfg)
    assert str(error.value) == f"logger.{choice} needs the {package} package: {INSTALL_HINT}"


def test_missing_library_names_the_choice_under_hydra(monkeypatch: pytest.MonkeyPatch) -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["logger=many"], return_hydra_config=True)
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # restored after the test
    HydraConfig.instance().set_config(cfg)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(
        ModuleNotFoundError,
        match=r"^logger=many \(its mlflow entry\) needs the "
        r"mlflow-skinny package: pip install \"recsys_midx\[loggers\]\"$",
    ):
        check_logger_packages(cfg)


def test_csv_and_no_logger_need_nothing(
    compose_config: Callable[..., DictConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("tensorboard", "tensorboardX", "mlflow", "wandb"):
        monkeypatch.setitem(sys.modules, module, None)
    check_logger_packages(compose_config(["logger=csv"]))
    check_logger_packages(compose_config(["logger=none"]))


def test_missing_library_stops_the_run_before_any_work(
    compose_config: Callable[..., DictConfig],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    cfg = compose_config(["logger=wandb", *TINY_RUN])
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ModuleNotFoundError, match="logger.wandb needs the wandb package"):
        train(cfg)
    # Neither the data nor the run directory were prepared.
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "run").exists()


def _csv_metrics(run_dir: Path) -> dict[str, list[float]]:
    with (run_dir / "csv" / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return {name: [float(row[name]) for row in rows if row[name]] for name in rows[0]}


def _tensorboard_metrics(run_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: [event.value for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _mlflow_metrics(run_dir: Path) -> dict[str, list[float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("recsys_midx")
    (run,) = client.search_runs([experiment.experiment_id])
    # MLflow keeps only letters, digits and _ / . - and space in a name: val/ndcg@10 -> val/ndcg10.
    return {
        "val/ndcg@10" if name == "val/ndcg10" else name: [
            metric.value for metric in client.get_metric_history(run.info.run_id, name)
        ]
        for name in run.data.metrics
    }


def _wandb_metrics(run_dir: Path, summary: dict[str, object]) -> dict[str, list[float]]:
    """The metrics named in the offline run's records (what `wandb sync` uploads), each with its
    last value from the run's ``summary`` (an offline run writes no summary file)."""
    (offline_run,) = (run_dir / "wandb").glob("offline-run-*")
    (records,) = offline_run.glob("run-*.wandb")
    data = records.read_bytes()
    return {
        name: [float(value)]
        for name, value in summary.items()
        if isinstance(value, (int, float)) and name.encode() in data
    }


#: Reads the metrics a logger entry wrote under the run directory: name -> logged values.
METRIC_READERS: dict[str, Callable[[Path], dict[str, list[float]]]] = {
    "csv": _csv_metrics,
    "tensorboard": _tensorboard_metrics,
    "mlflow": _mlflow_metrics,
}


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["tensorboard", "mlflow", "wandb", "many"])
def test_run_records_metrics_in_every_logger(
    compose_config: Callable[..., DictConfig], tmp_path: Path, choice: str
) -> None:
    # midx rebuilds its proposal every epoch: refresh time, KL and ESS are all logged.
    cfg = compose_config([f"logger={choice}", *TINY_RUN, *sampler_overrides("midx")])
    readers = dict(METRIC_READERS)
    wandb = importlib.import_module("wandb") if choice == "wandb" else None
    try:
        results = train(cfg)
        if wandb is not None:
            readers["wandb"] = partial(_wandb_metrics, summary=dict(wandb.run.summary))
    finally:
        if wandb is not None:
            # Close the run, so that the next one starts afresh, and stop W&B's service
            # process, which writes the offline records: once it exits, they are complete.
            wandb.finish()
            wandb.teardown()
    run_dir = tmp_path / "run"
    for entry in LOGGER_ENTRIES[choice]:
        metrics = readers[entry](run_dir)
        assert EXPECTED_METRICS <= set(metrics), (entry, sorted(metrics))
        assert all(values for name, values in metrics.items() if name in EXPECTED_METRICS)
        if entry != "wandb":  # the summary holds only the last value, not the best epoch's
            assert results["metrics"]["val/ndcg@10"] == pytest.approx(
                max(metrics["val/ndcg@10"]), abs=1e-6
            )
        assert results["sampler"]["kl_last"] == pytest.approx(metrics["sampler/kl"][-1], rel=1e-5)
