"""One training run from a composed Hydra config: fit, test the best checkpoint, write results."""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import EarlyStopping, Timer
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from recsys_midx.app.auto_sampler import SamplerChoice, choose_sampler
from recsys_midx.app.loggers import check_logger_packages
from recsys_midx.app.preflight import table_needs
from recsys_midx.lit.base import CatalogModule
from recsys_midx.lit.callbacks import EpochLog, SamplerRefresh
from recsys_midx.lit.checkpointing import resume_checkpoint
from recsys_midx.lit.table_optimizers import AUTO_TABLE_OPTIMIZER, resolve_table_optimizer
from recsys_midx.losses import CatalogSoftmax
from recsys_midx.protocols import CatalogDataModule, NegativeSampler, NegativesStrategy

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"


@dataclass
class Experiment:
    """The objects of one run, built from a config but not yet trained."""

    datamodule: CatalogDataModule
    module: CatalogModule
    trainer: L.Trainer
    epoch_log: EpochLog
    output_dir: Path
    #: What ``sampler=auto`` chose; ``None`` for any other sampler.
    sampler_choice: SamplerChoice | None = None


def build(cfg: DictConfig) -> Experiment:
    """Seed, prepare the data and instantiate encoder, sampler, head, loss, module and trainer.

    Args:
        cfg: a config composed from ``recsys_midx/conf`` (see ``recsys_midx/conf/config.yaml``).

    Returns:
        The run's objects; ``experiment.trainer.fit(experiment.module, experiment.datamodule)``
        trains it.

    Raises:
        TypeError: if the loss does not accept the head (e.g. ``head=mos`` with ``loss=edrep``).
        ModuleNotFoundError: if a chosen logger's library is not installed.
    """
    check_logger_packages(cfg)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True)

    datamodule: CatalogDataModule = instantiate(cfg.task.datamodule)
    datamodule.prepare_data()
    datamodule.setup("fit")
    # sampler=auto is decided here, where the catalog's size is known.
    run_cfg, sampler_choice = choose_sampler(cfg, datamodule.num_items)
    if sampler_choice is not None:
        log.info(
            "sampler=auto: %s for %d items (sampler.exact_up_to_items.%s=%d)",
            "the exact softmax" if sampler_choice.sampler == "full" else "MIDX",
            sampler_choice.items,
            sampler_choice.device,
            sampler_choice.exact_up_to_items,
        )
    module = build_module(run_cfg, datamodule.encoder_sizes, datamodule.num_items)
    warn_top_cells_with_corrected_positive(module.sampler, module.negatives)
    epoch_log = EpochLog(output_dir / "epochs.csv")
    callbacks = [instantiate(c) for c in cfg.get("callbacks", {}).values()] + [epoch_log]
    if cfg.trainer.get("max_time") is None and not any(isinstance(c, Timer) for c in callbacks):
        # The trainer adds its own Timer for max_time; without one, a Timer without a limit
        # still counts the training time across a resume (see training_seconds).
        callbacks.append(Timer())
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    return Experiment(datamodule, module, trainer, epoch_log, output_dir, sampler_choice)


def build_module(
    cfg: DictConfig, encoder_sizes: Mapping[str, int], num_items: int
) -> CatalogModule:
    """Instantiate encoder, negatives strategy, sampler, head and loss, and the module that
    trains them.

    Args:
        cfg: a composed config.
        encoder_sizes: the sizes the encoder is built with (the data module's
            ``encoder_sizes``).
        num_items: ``N``, the catalog the sampler draws from.

    Returns:
        The module; its sampler (none where the strategy draws from none) is built from the item
        table when fitting starts.

    Raises:
        TypeError: if the loss does not accept the head.
        ValueError: if the loss does not score the strategy's negatives.
    """
    # Built in this order (the head after the sampler), so that parameters are initialised
    # from the same random numbers as in every earlier run of a config.
    encoder = instantiate(cfg.model, **encoder_sizes)
    negatives: NegativesStrategy = instantiate(cfg.negatives)
    sampler = instantiate(cfg.sampler, num_items=num_items) if negatives.uses_sampler else None
    head = instantiate(cfg.task.module.head)
    table_optimizer = resolve_table_optimizer(
        cfg.task.module.get("table_optimizer"), table_needs(cfg)
    )
    if cfg.task.module.get("table_optimizer") == AUTO_TABLE_OPTIMIZER:
        log.info(
            "item table updated by %s (task.module.table_optimizer=auto)",
            table_optimizer or "the dense optimizer",
        )
    return instantiate(
        cfg.task.module,
        encoder=encoder,
        head=head,
        sampler=sampler,
        negatives=negatives,
        loss=instantiate(cfg.loss),
        table_optimizer=table_optimizer,
    )


def warn_top_cells_with_corrected_positive(
    sampler: NegativeSampler | None, negatives: NegativesStrategy
) -> bool:
    """Warn (and return True) when a MIDX proposal mixes in exact top cells but the strategy
    logQ-corrects the positive (``negatives.correct_positive=true``): the closer ``q`` is to the
    softmax, the more that correction underweighs a confident positive, so the top cells then
    leave the gradient error as it was (docs/guides/samplers.md). The top cells are read from
    the built sampler, which sizes them from the catalog where the config leaves them null."""
    top_codewords = 0 if sampler is None else sampler.sizing().get("exact_top_codewords", 0)
    if not top_codewords or negatives.counts_positives_exactly(sampler) is not False:
        return False
    log.warning(
        "sampler.exact_top_codewords=%d with negatives.correct_positive=true: the exact top "
        "cells only reduce the sampled gradient's error when the positive is counted exactly",
        top_codewords,
    )
    return True


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train and test one configuration; returns (and writes) the content of ``results.json``.

    The test uses the best checkpoint, or the weights at the end of training when the run saved
    none (``trainer.fast_dev_run=true``, ``debug=fdr``).

    With ``cfg.resume`` set (``auto`` or a checkpoint path, see
    :func:`~recsys_midx.lit.checkpointing.resume_checkpoint`) training continues from a
    checkpoint: model, optimiser, sampler, random states, counters and callback states.

    Args:
        cfg: a config composed from ``recsys_midx/conf`` (see ``recsys_midx/conf/config.yaml``).

    Returns:
        The results: config, dataset stats, ``val/*`` and ``test/*`` metrics, best epoch, epochs
        run, what stopped training (:func:`stopped_by`), timings (:func:`training_seconds`,
        counted across a resume), peak memory and the sampler's refresh summary.

    Example:
        ```python
        with hydra.initialize_config_module("recsys_midx.conf", version_base="1.3"):
            results = train(hydra.compose("config", overrides=["sampler=uniform"]))
        ```
    """
    experiment = build(cfg)
    datamodule, module, trainer = experiment.datamodule, experiment.module, experiment.trainer
    output_dir = experiment.output_dir
    trainer.fit(
        module, datamodule=datamodule, ckpt_path=resume_checkpoint(cfg.get("resume"), trainer)
    )
    train_wall_seconds = training_seconds(trainer)
    # Testing restores callback states from the best checkpoint: read what stopped training and
    # keep the full logs first.
    stopped = stopped_by(trainer)
    epochs = list(experiment.epoch_log.rows)
    refreshes = [
        row for c in trainer.callbacks if isinstance(c, SamplerRefresh) for row in c.history
    ]
    # A run without checkpoints (fast_dev_run, checkpointing off) is tested as it ends.
    checkpointing = trainer.checkpoint_callback
    best_checkpoint = checkpointing.best_model_path if checkpointing else ""
    test_metrics = trainer.test(
        module, datamodule=datamodule, ckpt_path="best" if best_checkpoint else None, verbose=False
    )[0]

    best = EpochLog.best_row(epochs, cfg.task.monitor, cfg.task.get("monitor_mode", "max")) or {}
    epoch_seconds = EpochLog.epoch_train_seconds(epochs)
    results = {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "dataset": datamodule.stats,
        "metrics": {
            **{k: v for k, v in best.items() if k.startswith("val/")},
            **{k: float(v) for k, v in test_metrics.items()},
        },
        "best_epoch": int(best["epoch"]) if best else None,
        "epochs_run": len(epoch_seconds),
        "stopped_by": stopped,
        "train_wall_seconds": train_wall_seconds,
        "seconds_per_epoch": _mean(epoch_seconds),
        "peak_memory_mb": peak_memory_mb(),
        **training_fields(module, refreshes, experiment.sampler_choice),
        "best_checkpoint": best_checkpoint or None,
        "output_dir": str(output_dir),
    }
    if trainer.is_global_zero:
        path = write_json_atomically(output_dir / RESULTS_FILE, results)
        _print_summary(results, path)
    return results


def training_seconds(trainer: L.Trainer) -> float:
    """Seconds in the training loop (validation included), as the trainer's
    :class:`~lightning.pytorch.callbacks.Timer` counts them against ``trainer.max_time``: a run
    resumed from a checkpoint adds the time it had trained up to that checkpoint, and the work
    it repeats after it counts once."""
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    return timer.time_elapsed("train")


def stopped_by(trainer: L.Trainer) -> str:
    """What ended a run's training: ``early stopping``, ``max_time`` (the wall-time cap),
    ``max_steps``, ``max_epochs`` or ``interrupted``."""
    if trainer.interrupted:
        return "interrupted"
    remaining = [c.time_remaining() for c in trainer.callbacks if isinstance(c, Timer)]
    if any(seconds is not None and seconds <= 0 for seconds in remaining):
        return "max_time"
    if trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        return "max_steps"
    # The timer aside, only early stopping asks the trainer to stop; its ``stopped_epoch`` cannot
    # tell, being 0 both when it never stopped and when it stopped in the first epoch (a run
    # validating several times an epoch).
    if trainer.should_stop and any(isinstance(c, EarlyStopping) for c in trainer.callbacks):
        return "early stopping"
    return "max_epochs"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def training_fields(
    module: CatalogModule,
    refreshes: list[dict[str, float]],
    sampler_choice: SamplerChoice | None = None,
) -> dict[str, Any]:
    """The ``sampler``, ``negatives``, ``exact_positives`` and ``table_optimizer`` entries of
    ``results.json``, for a training run (its refresh history) and an evaluation (no refreshes)
    alike. ``negatives`` is the strategy's name (``none``: the exact softmax);
    ``sampler.auto`` what ``sampler=auto`` chose (``full`` or ``midx``) and why;
    ``exact_positives`` whether a loss correcting by ``log q`` counted the positive exactly
    (``None`` where there was no such choice); ``table_optimizer`` the item table's optimizer as
    built (``auto`` resolved; null: the dense optimizer's)."""
    sampler = module.sampler
    counted = module.negatives.counts_positives_exactly(sampler)
    return {
        "table_optimizer": module.table_optimizer,
        "negatives": module.negatives.name,
        "sampler": {
            **sampler_summary(refreshes),
            "sizing": {} if sampler is None else sampler.sizing(),
            **({} if sampler_choice is None else {"auto": asdict(sampler_choice)}),
        },
        "exact_positives": counted if module.loss.corrects_by_log_q else None,
    }


def sampler_summary(refreshes: list[dict[str, float]]) -> dict[str, Any]:
    """Refresh count and time, and the proposal's divergence at the first and last build."""
    seconds = [
        row["sampler/refresh_seconds"] for row in refreshes if "sampler/refresh_seconds" in row
    ]
    diagnosed = [row for row in refreshes if "sampler/kl" in row]
    return {
        "refreshes": len(seconds),
        "refresh_seconds_mean": _mean(seconds),
        "kl_first": diagnosed[0]["sampler/kl"] if diagnosed else None,
        "kl_last": diagnosed[-1]["sampler/kl"] if diagnosed else None,
        "ess_fraction_last": diagnosed[-1]["sampler/ess_fraction"] if diagnosed else None,
        "kl_uniform_last": diagnosed[-1].get("sampler/kl_uniform") if diagnosed else None,
    }


def peak_memory_mb() -> dict[str, float]:
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = {"cpu_rss": rss / (1024**2 if sys.platform == "darwin" else 1024)}
    if torch.cuda.is_available():
        peak["cuda_allocated"] = torch.cuda.max_memory_allocated() / 1024**2
    return peak


def write_json_atomically(path: Path, payload: dict[str, Any]) -> Path:
    """Write atomically: a reader never sees a half-written results file."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
        json.dump(payload, handle, indent=2, default=str)
    os.replace(handle.name, path)
    return path


def _print_summary(results: dict[str, Any], path: Path) -> None:
    table = Table(title="Full-ranking metrics (best checkpoint)")
    table.add_column("metric")
    table.add_column("validation", justify="right")
    table.add_column("test", justify="right")
    metrics = results["metrics"]
    names = sorted({key.split("/", 1)[1] for key in metrics}, key=_metric_order)
    for name in names:
        table.add_row(
            name,
            *(
                f"{metrics[f'{split}/{name}']:.4f}" if f"{split}/{name}" in metrics else "-"
                for split in ("val", "test")
            ),
        )
    console = Console()
    console.print(table)
    console.print(
        f"best epoch {results['best_epoch']} of {results['epochs_run']}, "
        f"{results['train_wall_seconds']:.1f} s training, "
        f"{results['seconds_per_epoch'] or 0:.2f} s/epoch"
    )
    for line in sampler_lines(results):
        console.print(line, soft_wrap=True)
    console.print(f"results: {path}")


def sampler_lines(results: dict[str, Any]) -> list[str]:
    """What the run's softmax cost per training query and how close its proposal came.

    Args:
        results: the content of ``results.json``.

    Returns:
        Up to two lines; none when the results name no sampler or catalog size, or name a loss
        that is not a softmax over the sampler's draws.

    Example:
        >>> for line in sampler_lines({
        ...     "config": {"sampler": {"_target_": "recsys_midx.samplers.UniformSampler",
        ...                            "num_negatives": 100}},
        ...     "dataset": {"items": 1000},
        ...     "negatives": "per_query", "sampler": {"kl_last": 2.0, "kl_uniform_last": 2.0}}):
        ...     print(line)
        sampled softmax: 100 negatives from UniformSampler per query, of 1,000 items
        proposal: KL(softmax || q) = 2.00 nats at the last refresh; uniform: 2.00
    """
    config = results.get("config") or {}
    sampler, loss = config.get("sampler") or {}, config.get("loss") or {}
    items = (results.get("dataset") or {}).get("items")
    if not items or ("_target_" not in sampler and results.get("negatives") != "none"):
        return []
    if "_target_" in loss and not issubclass(get_class(loss["_target_"]), CatalogSoftmax):
        return []  # another objective (BCE, SCE, EDRep, ...): no softmax drawn from the sampler
    summary = results.get("sampler") or {}
    strategy = results.get("negatives")
    lines = []
    chosen = summary.get("auto")
    if chosen is not None:
        lines.append(
            f"sampler=auto: {chosen['sampler']} for {items:,} items "
            f"(sampler.exact_up_to_items.{chosen['device']}={chosen['exact_up_to_items']:,})"
        )
    if strategy == "none":
        return [*lines, f"exact softmax: every training query scores all {items:,} items"]
    name = sampler["_target_"].rsplit(".", 1)[-1]
    sizing = summary.get("sizing") or {}
    top = " and its exact top cells" if sizing.get("exact_top_codewords") else ""
    per = _DRAWN_FOR.get(strategy, "per query")
    lines.append(
        f"sampled softmax: {sampler['num_negatives']} negatives from {name}{top} {per}, "
        f"of {items:,} items"
    )
    if summary.get("kl_last") is not None and summary.get("kl_uniform_last") is not None:
        lines.append(
            f"proposal: KL(softmax || q) = {summary['kl_last']:.2f} nats at the last "
            f"refresh; uniform: {summary['kl_uniform_last']:.2f}"
        )
    return lines


#: How a strategy's draws are shared, in :func:`sampler_lines`.
_DRAWN_FOR = {
    "shared": "shared by each batch",
    "per_sequence": "per training sequence",
    "outside_window": "per training sequence, outside it",
}


def _metric_order(name: str) -> tuple[str, int]:
    metric, _, k = name.partition("@")
    return metric, int(k) if k.isdigit() else 0
