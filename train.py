"""Train and test a model: ``python train.py sampler=uniform dataset=ml-1m``, the same as
``recsys-midx-train ...`` (see :mod:`recsys_midx.app.train` and docs/guides/configuration.md)."""

from recsys_midx.app.train import train

if __name__ == "__main__":
    train()
