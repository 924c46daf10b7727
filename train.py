"""Train and test a model: ``python train.py sampler=uniform dataset=ml-1m`` (see README)."""

import hydra
from omegaconf import DictConfig

from recsys_midx.experiment import train


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Returns the test NDCG@10, so Hydra sweepers can optimise it."""
    return train(cfg)["metrics"].get("test/ndcg@10")


if __name__ == "__main__":
    main()
