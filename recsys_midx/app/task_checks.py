"""Pre-flight checks of one task family's settings (see :mod:`recsys_midx.app.preflight`, which
runs them with the others): a model trained by cloze gets whole windows, and a language model
reads its stream in order."""

from __future__ import annotations

from hydra.utils import get_class
from omegaconf import DictConfig

from recsys_midx.errors import ConfigError
from recsys_midx.lit.lm import LMModule


def check_cloze_samples(cfg: DictConfig) -> None:
    """A model trained by cloze (``masked_training``, ``model=bert4rec``) gets whole windows to
    mask: ``task.datamodule.train_samples=windows`` (the default) or ``last_window``, not
    ``prefixes``, whose samples hold one target each.

    The model group cannot choose the training samples itself: its file fills ``model`` only,
    and the task, composed after it, sets ``task.datamodule.train_samples``.
    """
    target = (cfg.get("model") or {}).get("_target_")
    model = get_class(target) if target else None
    if not getattr(model, "masked_training", False):
        return
    samples = cfg.task.datamodule.get("train_samples", "windows")
    if samples == "prefixes":
        raise ConfigError(
            f"model={model.name} trains by cloze on whole windows: set "
            "task.datamodule.train_samples=last_window or windows (got prefixes)"
        )


def check_language_model(cfg: DictConfig) -> None:
    """``task=lm`` reads its stream in order in one process, and a causal transformer reading
    its stretches (``model=sasrec``) takes at least ``task.datamodule.bptt`` positions
    (``model.max_len``)."""
    if not issubclass(get_class(cfg.task.module._target_), LMModule):
        return
    trainer = cfg.get("trainer") or {}
    if "ddp" in str(trainer.get("strategy", "")) and trainer.get("devices") != 1:
        raise ConfigError(
            f"task=lm with trainer.strategy={trainer.get('strategy')}: a language model reads "
            "its stream in order in one process, set trainer.devices=1"
        )
    max_len = (cfg.get("model") or {}).get("max_len")
    bptt = cfg.task.datamodule.bptt
    if isinstance(max_len, int) and isinstance(bptt, int) and bptt > max_len:
        raise ConfigError(
            f"task.datamodule.bptt={bptt} is longer than model.max_len={max_len}, the positions "
            "the model reads: lower the first or raise the second"
        )
