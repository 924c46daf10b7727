"""``sampler=auto``: the exact softmax where it costs no more than sampling, else MIDX.

Below some catalog size the exact softmax is one matrix product that costs a training step no
more than drawing and scoring a sample does, and it is the objective every sampled one
approximates. ``sampler=auto`` composes as ``sampler=midx`` with one more setting,
``sampler.exact_up_to_items``: the largest catalog, per kind of device, for which the run trains
the exact softmax instead (``negatives=none``). The choice is made once the data is prepared
and the catalog's size is known, before the module is built; ``results.json`` records it
(``sampler.auto``). The limits are measured: docs/benchmarks.md has the table and the command.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, open_dict

from recsys_midx.app.step_memory import trains_on_cuda
from recsys_midx.errors import ConfigError
from recsys_midx.lit.table_optimizers import AUTO_TABLE_OPTIMIZER

#: The setting that makes a sampler config ``sampler=auto``.
AUTO_SETTING = "exact_up_to_items"
#: The kinds of device it has a limit for; any other accelerator uses the CPU's.
DEVICE_KINDS = ("cpu", "cuda")
#: The exact softmax's strategy (``negatives=none``).
_EXACT_STRATEGY = "recsys_midx.negatives.NoNegatives"


@dataclass(frozen=True)
class SamplerChoice:
    """What ``sampler=auto`` chose for a run.

    Attributes:
        sampler: ``full`` (the exact softmax) or ``midx``.
        items: the catalog's size it was chosen for.
        exact_up_to_items: the limit it compared that size with.
        device: the kind of device whose limit that is (``cpu`` or ``cuda``).
    """

    sampler: str
    items: int
    exact_up_to_items: int
    device: str


def is_auto(cfg: DictConfig) -> bool:
    """Whether the run's sampler is ``sampler=auto`` (its config holds ``exact_up_to_items``)."""
    return AUTO_SETTING in (cfg.get("sampler") or {})


def check_auto(cfg: DictConfig) -> None:
    """``sampler=auto`` settings that cannot work, before any data is read.

    Raises:
        ConfigError: a limit that is not a whole number of items, or an objective that cannot
            become the exact softmax: a loss without one (``loss=bce``, ``loss=gbce``) or a
            strategy that draws from no sampler (``negatives=none``, ``outside_window``), or a
            sparse table optimizer named (the exact softmax reads every row).
    """
    if not is_auto(cfg):
        return
    limits = cfg.sampler[AUTO_SETTING]
    for kind in DEVICE_KINDS:
        limit = limits.get(kind) if isinstance(limits, Mapping) else None
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ConfigError(
                f"sampler.{AUTO_SETTING}.{kind}={limit}: give the largest catalog, in items, "
                "for which sampler=auto trains the exact softmax on that device (0: never)"
            )
    loss = get_class(cfg.loss._target_)
    strategy = get_class(cfg.negatives._target_)
    if not (getattr(loss, "exact_on_catalog", False) and "catalog" in loss.scopes):
        raise ConfigError(
            f"sampler=auto chooses between the exact softmax and MIDX: loss={loss.name} has no "
            "exact softmax, choose loss=softmax or a sampler"
        )
    if not strategy.uses_sampler:
        raise ConfigError(
            f"sampler=auto chooses between the exact softmax and MIDX draws: "
            f"negatives={strategy.name} draws none from it, choose per_query, shared or "
            "per_sequence"
        )
    table_optimizer = (cfg.task.get("module") or {}).get("table_optimizer")
    if table_optimizer not in (None, AUTO_TABLE_OPTIMIZER):
        raise ConfigError(
            f"sampler=auto with task.module.table_optimizer={table_optimizer}: the exact "
            "softmax it may choose updates every row, set task.module.table_optimizer=auto"
        )


def device_kind(cfg: DictConfig) -> str:
    """``cuda`` where the run trains on CUDA devices
    (:func:`~recsys_midx.app.step_memory.trains_on_cuda`), else ``cpu``."""
    return "cuda" if trains_on_cuda(cfg) else "cpu"


def choose_sampler(cfg: DictConfig, num_items: int) -> tuple[DictConfig, SamplerChoice | None]:
    """The config a run builds its module from, with ``sampler=auto`` decided.

    Args:
        cfg: the run's composed config; left unchanged.
        num_items: ``N``, the prepared catalog's size.

    Returns:
        ``(cfg, None)`` for any other sampler. For ``sampler=auto``, a copy of ``cfg`` that is
        ``sampler=full`` (``negatives=none``, keeping ``negatives.exclude_window``) when
        ``num_items`` is at most ``sampler.exact_up_to_items`` of the run's device
        (:func:`device_kind`), else
        ``sampler=midx`` with the configured strategy; and the choice.

    Example:
        ```python
        cfg = compose("config", overrides=["sampler=auto"])
        run_cfg, choice = choose_sampler(cfg, 3_416)  # on a CPU
        choice.sampler, run_cfg.negatives._target_
        # ('full', 'recsys_midx.negatives.NoNegatives')
        ```
    """
    if not is_auto(cfg):
        return cfg, None
    kind = device_kind(cfg)
    limit = int(cfg.sampler[AUTO_SETTING][kind])
    exact = num_items <= limit
    chosen = copy.deepcopy(cfg)
    with open_dict(chosen):
        if exact:
            chosen.sampler, chosen.negatives = _exact_softmax(cfg.negatives)
        else:
            del chosen.sampler[AUTO_SETTING]
    return chosen, SamplerChoice("full" if exact else "midx", num_items, limit, kind)


def as_trained(results: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config a ``results.json`` run trained with: its recorded config, with the exact
    softmax's sampler and negatives where ``sampler=auto`` chose it (reports name the run by
    what it trained)."""
    config = results["config"]
    choice = (results.get("sampler") or {}).get("auto") or {}
    if choice.get("sampler") != "full":
        return config
    sampler, negatives = _exact_softmax(config.get("negatives") or {})
    return {**config, "sampler": sampler, "negatives": negatives}


def _exact_softmax(negatives: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``sampler=full``'s sampler and strategy, keeping the configured strategy's
    ``exclude_window``."""
    exclude_window = bool(negatives.get("exclude_window", False))
    return {"num_negatives": None}, {"_target_": _EXACT_STRATEGY, "exclude_window": exclude_window}
