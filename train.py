"""Train and test a model: ``python train.py sampler=uniform dataset=ml-1m`` (see docs/guides/configuration.md)."""

from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from recsys_midx.experiment import train


def check_not_multirun_ddp(cfg: DictConfig) -> None:
    """Refuse a Hydra sweep (``-m``) whose jobs would start several DDP processes.

    Lightning starts the extra ranks by re-running this script with its command line, which for
    a sweep is the whole sweep: every rank would run every job. DDP is for single runs; launch
    each job of a sweep as its own ``python train.py ... trainer=ddp`` process.

    Args:
        cfg: the composed config of the job.

    Raises:
        ValueError: in multirun mode with a ``ddp`` strategy on more than one device.
    """
    trainer = cfg.get("trainer") or {}
    multi_process = "ddp" in str(trainer.get("strategy", "")) and trainer.get("devices") != 1
    if multi_process and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise ValueError(
            f"trainer.strategy={trainer.get('strategy')} with trainer.devices="
            f"{trainer.get('devices')} cannot run inside a Hydra multirun (-m): the extra ranks "
            "would re-run the whole sweep. Run each job as its own process, e.g. "
            "`for s in full midx; do python train.py trainer=ddp sampler=$s; done`."
        )


def optimized_metric(cfg: DictConfig, results: dict[str, Any]) -> float | None:
    """The value of the metric named by ``optimized_metric`` in a run's results.

    Args:
        cfg: the composed config of the run; ``cfg.optimized_metric`` names a metric of
            ``results["metrics"]`` (``${task.monitor}`` by default: ``val/ndcg@10`` for
            ``task=seqrec``, ``val/p@1`` for ``task=xc``, the best epoch's value), or is null.
        results: what :func:`~recsys_midx.experiment.train` returned.

    Returns:
        The metric's value, or ``None`` when ``optimized_metric`` is null.

    Raises:
        KeyError: the run's results have no such metric.

    Example:
        >>> value = optimized_metric(cfg, train(cfg))  # cfg.optimized_metric: val/p@1
    """
    name = cfg.get("optimized_metric")
    if not name:
        return None
    metrics = results["metrics"]
    if name not in metrics:
        raise KeyError(
            f"optimized_metric={name} is not among the run's metrics: "
            f"{', '.join(sorted(metrics)) or '(none)'}"
        )
    return float(metrics[name])


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Train and test one configuration (see :func:`~recsys_midx.experiment.train`).

    Returns:
        The value of the config's ``optimized_metric`` (the task's monitored validation metric
        at the best epoch), which Hydra sweepers optimise; it is printed as well.
    """
    check_not_multirun_ddp(cfg)
    value = optimized_metric(cfg, train(cfg))
    if value is not None:
        print(f"optimized_metric {cfg.optimized_metric} = {value:.4f}")
    return value


if __name__ == "__main__":
    main()
