"""Train and test a model: ``python train.py sampler=uniform dataset=ml-1m`` (see README)."""

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


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Returns the test NDCG@10, so Hydra sweepers can optimise it."""
    check_not_multirun_ddp(cfg)
    return train(cfg)["metrics"].get("test/ndcg@10")


if __name__ == "__main__":
    main()
