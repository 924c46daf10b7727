"""Evaluate a trained checkpoint on validation and test, without training.

``python eval.py run_dir=RUN_FOLDER`` (``conf/eval.yaml``) rebuilds a ``train.py`` run from its
saved config, loads its best checkpoint, runs the full-ranking validation and test, and writes
``results.json`` into its own output folder with the keys a training run writes (training
timings, best epoch and epochs run are null).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from recsys_midx.experiment import (
    RESULTS_FILE,
    _peak_memory_mb,
    _sampler_summary,
    _write_json,
    build,
)
from recsys_midx.trained import load_weights, run_checkpoint, run_config

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

    The module and the data are built as for training (:func:`recsys_midx.experiment.build`),
    the checkpoint's encoder, head and objective weights are loaded, and the evaluation runs
    with the config's ``eval`` settings (history exclusion, cut-offs) on a trainer without
    callbacks or loggers: nothing but ``results.json`` is written.

    Args:
        cfg: a config composed from ``conf/eval.yaml`` (see :func:`evaluated_config`).

    Returns:
        ``config`` (the evaluated one), ``dataset``, ``metrics`` (``val/*`` and ``test/*``),
        ``best_epoch``, ``epochs_run``, ``train_wall_seconds`` and ``seconds_per_epoch`` (null:
        nothing was trained), ``peak_memory_mb``, ``sampler``, ``best_checkpoint`` (the
        evaluated checkpoint), ``output_dir`` and ``evaluated_run`` (``run_dir`` or null).

    Raises:
        ValueError: neither ``run_dir`` nor ``ckpt_path`` is set.
        FileNotFoundError: the run folder or the checkpoint is missing.

    Example:
        >>> with hydra.initialize(config_path="conf", version_base="1.3"):
        ...     results = evaluate(hydra.compose("eval", overrides=["run_dir=outputs/run"]))
    """
    model_cfg, checkpoint = evaluated_config(cfg)
    model_cfg.logger = None
    experiment = build(model_cfg)
    module, datamodule = experiment.module, experiment.datamodule
    load_weights(module, checkpoint)
    trainer = instantiate(model_cfg.trainer, callbacks=[], logger=False,
                          enable_checkpointing=False)
    val_metrics = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    test_metrics = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    results = {
        "config": OmegaConf.to_container(model_cfg, resolve=True),
        "dataset": datamodule.stats,
        "metrics": {name: float(value) for name, value in {**val_metrics, **test_metrics}.items()},
        "best_epoch": None,
        "epochs_run": None,
        "train_wall_seconds": None,
        "seconds_per_epoch": None,
        "peak_memory_mb": _peak_memory_mb(),
        "sampler": _sampler_summary([]),
        "best_checkpoint": str(checkpoint),
        "output_dir": str(experiment.output_dir),
        "evaluated_run": str(cfg.run_dir) if cfg.get("run_dir") else None,
    }
    if trainer.is_global_zero:
        path = _write_json(experiment.output_dir / RESULTS_FILE, results)
        for name, value in sorted(results["metrics"].items()):
            print(f"{name:>14} {value:.4f}")
        print(f"results: {path}")
    return results


#: The repository's ``conf/`` folder, found from this file so that the entry works from any folder.
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(config_path=CONF_DIR, config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Evaluate a checkpoint (see :func:`evaluate`): ``python eval.py run_dir=RUN_FOLDER``."""
    evaluate(cfg)
