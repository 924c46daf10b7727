"""A run folder's config in today's settings, whatever version of the toolkit recorded it.

``recsys-midx-recommend``, ``-export`` and ``-eval`` rebuild a trained run from the config its
folder holds (``.hydra/config.yaml``). A run recorded before negatives became a config group of
their own kept how it drew them in the loss (``loss.shared_negatives``, ``loss.exclude_window``,
``loss.exact_positives``, ``loss=window_softmax`` with ``loss.negatives``) and named the exact
softmax by a sampler (``FullSampler``); :func:`in_current_settings` moves those settings where
they live now, so that such a run still loads. A config that already has them is returned as it
is.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, open_dict

from recsys_midx.reports import run_names

#: Where the strategies of the ``negatives`` group live.
_STRATEGIES = "recsys_midx.negatives."
#: The loss settings that now belong to the ``negatives`` group (EDRep's own
#: ``exact_positives`` stays).
_MOVED = ("shared_negatives", "exclude_window", "exact_positives", "negatives")


def in_current_settings(cfg: DictConfig) -> DictConfig:
    """``cfg`` with the settings a run recorded before the ``negatives`` group moved into it.

    Args:
        cfg: a run's recorded config (interpolations unresolved, as saved).

    Returns:
        The same config object, updated in place where it needed it.

    Example:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({
        ...     "sampler": {"_target_": "recsys_midx.samplers.UniformSampler", "num_negatives": 8},
        ...     "loss": {"_target_": "recsys_midx.losses.SoftmaxLoss", "chunk_size": 8192,
        ...              "shared_negatives": True, "exact_positives": None,
        ...              "exclude_window": False},
        ...     "task": {"module": {"table_optimizer": "auto"}}})
        >>> upgraded = in_current_settings(cfg)
        >>> upgraded.negatives._target_, dict(upgraded.loss)
        ('recsys_midx.negatives.SharedByBatch', {'_target_': 'recsys_midx.losses.SoftmaxLoss', \
'chunk_size': 8192})
    """
    with open_dict(cfg):
        if cfg.sampler.get("last_stage") == "exact":
            cfg.sampler.last_stage = "residual"
        module = (cfg.get("task") or {}).get("module") or {}
        if module.get("table_optimizer") == "dense":
            module["table_optimizer"] = None
        if "negatives" in cfg:
            return cfg
        loss = cfg.loss
        cfg.negatives = _recorded_strategy(cfg)
        for key in _MOVED:
            if not (key == "exact_positives" and loss._target_.endswith("EDRepLoss")):
                loss.pop(key, None)
        if loss._target_.endswith("WindowSoftmaxLoss"):
            loss._target_ = "recsys_midx.losses.SoftmaxLoss"
        if cfg.sampler.get("_target_", "").endswith("FullSampler"):
            cfg.sampler = {"num_negatives": cfg.sampler.get("num_negatives")}
    return cfg


def _recorded_strategy(cfg: DictConfig) -> dict[str, Any]:
    """The ``negatives`` config that draws as the recorded sampler and loss did (the strategy
    :func:`~recsys_midx.reports.run_names.strategy` reads from them, with its settings)."""
    kind = run_names.strategy(cfg)
    target = {"_target_": f"{_STRATEGIES}{kind}"}
    if kind == "PerSequence":
        return target
    if kind == "OutsideWindow":
        return {**target, "num_negatives": cfg.sampler.get("num_negatives")}
    window = bool(cfg.loss.get("exclude_window"))
    if kind == "NoNegatives":
        return {**target, "exclude_window": window}
    exact = cfg.loss.get("exact_positives")
    return {
        **target,
        "correct_positive": None if exact is None else not exact,
        "exclude_window": window,
    }
