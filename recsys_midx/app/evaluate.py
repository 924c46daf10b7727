"""Evaluate a trained checkpoint on validation and test, without training.

``python eval.py run_dir=RUN_FOLDER`` (``recsys_midx/conf/eval.yaml``) rebuilds a ``train.py``
run from its saved config, loads its best checkpoint, runs the full-ranking validation and test,
and writes ``results.json`` into its own output folder with the keys a training run writes
(training timings, best epoch and epochs run are null).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from recsys_midx.app.experiment import (
    RESULTS_FILE,
    build,
    peak_memory_mb,
    training_fields,
    write_json_atomically,
)
from recsys_midx.app.threads import apply_threads
from recsys_midx.app.train import filter_harmless_warnings, user_errors_reported
from recsys_midx.app.trained import load_weights, run_checkpoint, run_config

log = logging.getLogger(__name__)

__all__ = ["evaluate", "main"]


def evaluated_config(cfg: DictConfig) -> tuple[DictConfig, Path]:
    """The config to rebuild the model and data from, and the checkpoint to evaluate.

    Args:
        cfg: a config composed from ``conf/eval.yaml``: ``run_dir`` and/or ``ckpt_path`` set.

    Returns:
        With ``run_dir``: the run's saved config (``data_dir`` replacing its data folder when
        set) and ``ckpt_path`` or else the run's best checkpoint; with only ``ckpt_path``: ``cfg``
        itself and that checkpoint. The config writes into ``cfg.paths.output_dir``.

    Raises:
        ValueError: neither ``run_dir`` nor ``ckpt_path`` is set.
        FileNotFoundError: the run folder has no config or checkpoint, or the checkpoint is
            missing.
    """
    run_dir, ckpt_path = cfg.get("run_dir"), cfg.get("ckpt_path")
    if not run_dir and not ckpt_path:
        raise ValueError(
            "set run_dir=RUN_FOLDER (a train.py run) or ckpt_path=CHECKPOINT to evaluate"
        )
    if run_dir:
        model_cfg = run_config(run_dir)
        if cfg.get("data_dir"):
            OmegaConf.update(model_cfg, "paths.data_dir", str(cfg.data_dir))
        checkpoint = Path(ckpt_path) if ckpt_path else run_checkpoint(Path(run_dir))
    else:
        model_cfg, checkpoint = cfg.copy(), Path(ckpt_path)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"ckpt_path={checkpoint} not found")
    OmegaConf.update(model_cfg, "paths.output_dir", str(cfg.paths.output_dir))
    return model_cfg, checkpoint


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Validate and test a checkpoint; returns (and writes) the content of ``results.json``.

    The module and the data are built as for training (:func:`recsys_midx.app.experiment.build`),
    the checkpoint's encoder, head and objective weights are loaded, and the evaluation runs
    with the config's ``eval`` settings (history exclusion, cut-offs) on a trainer without
    callbacks or loggers: nothing but ``results.json`` is written.

    Args:
        cfg: a config composed from ``conf/eval.yaml`` (see :func:`evaluated_config`).

    Returns:
        ``config`` (the evaluated one), ``dataset``, ``metrics`` (``val/*`` and ``test/*``),
        ``best_epoch``, ``epochs_run``, ``stopped_by``, ``train_wall_seconds`` and
        ``seconds_per_epoch`` (null: nothing was trained), ``peak_memory_mb``,
        ``table_optimizer``, ``negatives``, ``sampler``, ``exact_positives``, ``best_checkpoint``
        (the evaluated checkpoint), ``output_dir`` and ``evaluated_run`` (``run_dir`` or null).

    Raises:
        ValueError: neither ``run_dir`` nor ``ckpt_path`` is set.
        FileNotFoundError: the run folder or the checkpoint is missing.

    Example:
        ```python
        with hydra.initialize(config_path="../conf", version_base="1.3"):
            results = evaluate(hydra.compose("eval", overrides=["run_dir=outputs/run"]))
        ```
    """
    model_cfg, checkpoint = evaluated_config(cfg)
    model_cfg.logger = None
    experiment = build(model_cfg)
    module, datamodule = experiment.module, experiment.datamodule
    load_weights(module, checkpoint)
    trainer = instantiate(model_cfg.trainer, callbacks=[], logger=False, enable_checkpointing=False)
    val_metrics = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    test_metrics = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    results = {
        "config": OmegaConf.to_container(model_cfg, resolve=True),
        "dataset": datamodule.stats,
        "metrics": {name: float(value) for name, value in {**val_metrics, **test_metrics}.items()},
        "best_epoch": None,
        "epochs_run": None,
        "stopped_by": None,
        "train_wall_seconds": None,
        "seconds_per_epoch": None,
        "peak_memory_mb": peak_memory_mb(),
        **training_fields(module, []),
        "best_checkpoint": str(checkpoint),
        "output_dir": str(experiment.output_dir),
        "evaluated_run": str(cfg.run_dir) if cfg.get("run_dir") else None,
    }
    if trainer.is_global_zero:
        path = write_json_atomically(experiment.output_dir / RESULTS_FILE, results)
        for name, value in sorted(results["metrics"].items()):
            print(f"{name:>14} {value:.4f}")
        print(f"results: {path}")
    return results


@hydra.main(config_path="../conf", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """The ``recsys-midx-eval`` command (and ``python eval.py`` in a clone): evaluate a
    checkpoint (see :func:`evaluate`) with the training command's thread setting, quiet library
    warnings and one-line user errors.

    Example:
        recsys-midx-eval run_dir=outputs/2026-01-01/12-00-00
    """
    filter_harmless_warnings()
    with user_errors_reported(Path(cfg.paths.output_dir)):
        apply_threads(cfg)
        evaluate(cfg)
