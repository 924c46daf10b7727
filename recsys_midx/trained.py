"""Trained runs of ``train.py``, rebuilt from their folder with their trained weights."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from recsys_midx.experiment import build
from recsys_midx.lit.base import CatalogModule
from recsys_midx.protocols import CatalogDataModule


@dataclass
class LoadedRun:
    """A trained run rebuilt from its folder: its config, module (eval mode) and data."""

    config: DictConfig
    module: CatalogModule
    datamodule: CatalogDataModule
    checkpoint: Path


def _checkpoint(run_dir: Path) -> Path:
    """The best checkpoint of a run (the one ``train.py`` tested), else its last one."""
    best = sorted((run_dir / "checkpoints").glob("best-*.ckpt"))
    if best:
        return best[-1]
    last = run_dir / "checkpoints" / "last.ckpt"
    if not last.is_file():
        raise FileNotFoundError(f"no checkpoint under {run_dir / 'checkpoints'}")
    return last


def load_run(run_dir: str | Path, data_dir: str | Path | None = None) -> LoadedRun:
    """Rebuild the module and data of a ``train.py`` run folder with its trained weights.

    The folder must hold ``.hydra/config.yaml`` and ``checkpoints/``. The run is rebuilt with
    :func:`recsys_midx.experiment.build` writing into a temporary folder (the run's own folder is
    only read); the encoder, the head and the objective get the checkpoint's weights.

    Args:
        run_dir: the run folder.
        data_dir: where the run's dataset lives, if not where its config says.

    Returns:
        The rebuilt run, module in eval mode on the CPU.

    Raises:
        FileNotFoundError: if the config or a checkpoint is missing.

    Example:
        >>> run = load_run("outputs/2026-01-01/12-00-00")
    """
    run_dir = Path(run_dir)
    config_path = run_dir / ".hydra" / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: not a train.py run folder")
    cfg = OmegaConf.load(config_path)
    OmegaConf.update(cfg, "paths.output_dir", tempfile.mkdtemp(prefix="bottleneck-"))
    if data_dir is not None:
        OmegaConf.update(cfg, "paths.data_dir", str(data_dir))
    cfg.logger = None
    experiment = build(cfg)
    checkpoint = _checkpoint(run_dir)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    module = experiment.module
    # The sampler is not needed and its buffers are sized when it is built: load the rest.
    for name in ("encoder", "head", "loss"):
        prefix = f"{name}."
        module.get_submodule(name).load_state_dict(
            {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
        )
    module.eval()
    return LoadedRun(cfg, module, experiment.datamodule, checkpoint)
