"""Tiny trained runs, laid out as ``train.py`` leaves them, shared by the inference and analysis
tests: one on a custom CSV with text user and item ids, one on the synthetic generator."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from conftest import CONF_DIR, TINY_RUN, sampler_overrides
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from recsys_midx.app.experiment import train
from recsys_midx.app.trained import LoadedRun

#: The keys of ``TINY_RUN`` that apply to a custom dataset (it has no num_users / num_items).
TINY_CUSTOM_RUN = (
    "model.dim=16",
    "model.max_len=12",
    "trainer.max_epochs=2",
    "trainer.accelerator=cpu",
    "task.datamodule.batch_size=32",
    "callbacks.progress_bar.refresh_rate=0",
    "logger=none",
)


def write_interactions(path: Path, num_users: int = 60, num_items: int = 40, seed: int = 0) -> Path:
    """A CSV of ``user,item,ts`` rows with text ids (``user-007``, ``sku-0012``), each user 8 to 14
    items that mostly walk forward through the catalog, so a model has something to learn."""
    rng = np.random.default_rng(seed)
    rows = []
    for user in range(num_users):
        item = int(rng.integers(num_items))
        for step in range(int(rng.integers(8, 15))):
            item = (item + int(rng.integers(1, 4))) % num_items
            rows.append((f"user-{user:03d}", f"sku-{item:04d}", 1_600_000_000 + 60 * step))
    frame = pd.DataFrame(rows, columns=["uid", "sku", "ts"])
    frame.to_csv(path, index=False)
    return path


def custom_config(root: Path, csv_path: Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The config of a tiny run on ``csv_path``, writing under ``root / "run"``."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                f"paths.output_dir={root / 'run'}",
                f"paths.data_dir={root / 'data'}",
                "dataset=custom",
                f"dataset.path={csv_path}",
                "dataset.columns.user=uid",
                "dataset.columns.item=sku",
                "dataset.columns.time=ts",
                *TINY_CUSTOM_RUN,
                *sampler_overrides("uniform"),
                *overrides,
            ],
        )


def train_custom_run(root: Path, overrides: Sequence[str] = ()) -> Path:
    """Train a tiny run on a fresh custom CSV under ``root``; returns its run folder, laid out as
    ``train.py`` leaves it (``.hydra/config.yaml``, ``checkpoints/``, ``results.json``)."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = custom_config(root, write_interactions(root / "interactions.csv"), overrides)
    return _train_as_train_py(cfg, root / "run")


def train_synthetic_run(
    run_dir: Path, data_dir: Path, sampler: str = "uniform", overrides: Sequence[str] = ()
) -> Path:
    """Train a tiny run of the default (synthetic) dataset with ``sampler`` into ``run_dir``;
    returns the folder, laid out as ``train.py`` leaves it."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"paths.output_dir={run_dir}",
                f"paths.data_dir={data_dir}",
                *TINY_RUN,
                *sampler_overrides(sampler),
                "logger=none",
                *overrides,
            ],
        )
    return _train_as_train_py(cfg, run_dir)


def _train_as_train_py(cfg: DictConfig, run_dir: Path) -> Path:
    """Train ``cfg`` and save its config where ``train.py``'s Hydra run leaves it."""
    train(cfg)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    return run_dir


def csv_histories(run_dir: Path) -> dict[str, list[str]]:
    """Every user's raw item ids, oldest first, read straight from the CSV the run trained on."""
    frame = pd.read_csv(run_dir.parent / "interactions.csv")
    frame = frame.sort_values(["uid", "ts"], kind="stable")
    return {user: list(group["sku"]) for user, group in frame.groupby("uid", sort=False)}


def brute_force(
    run: LoadedRun, raw_history: list[str], k: int, exclude_seen: bool
) -> tuple[list[str], np.ndarray]:
    """Top-k raw item ids and scores: the whole item table scored at once for the query of the
    history's last ``max_len`` items."""
    history = run.items.internal(raw_history)
    max_len = run.datamodule.max_len
    inputs = torch.zeros(1, max_len, dtype=torch.long)
    tail = torch.from_numpy(history[-max_len:])
    inputs[0, max_len - len(tail) :] = tail
    with torch.no_grad():
        query = run.module.encoder(inputs)[:, -1]
        scores = (query @ run.module.encoder.item_table[1:].T)[0].clone()
    if exclude_seen:
        scores[torch.from_numpy(history - 1)] = float("-inf")
    top = scores.topk(k)
    return list(run.items.raw[top.indices.numpy() + 1]), top.values.numpy()
