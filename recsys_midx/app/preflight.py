"""Checks of a composed config that need no data: run before anything is read or written.

A mistake that these checks catch would otherwise surface after the data is prepared, or after a
whole epoch (a monitored metric that is never logged fails in early stopping), or as an error
about an internal setting. Each check raises a :class:`~recsys_midx.errors.ConfigError` whose one
line names the settings as the user writes them. Checks that need the data (``num_negatives``
below the catalog size, ``num_codewords`` at most the number of items) stay with the components
that know it. The one check that reads the machine's memory, :func:`check_memory`, compares the
estimate of :mod:`recsys_midx.app.step_memory` with the memory of the device the run trains on;
``preflight.memory=false`` turns it off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf

from recsys_midx.app import step_memory
from recsys_midx.app.auto_sampler import check_auto
from recsys_midx.app.task_checks import check_cloze_samples, check_language_model
from recsys_midx.app.threads import processes_per_machine, sweep_jobs
from recsys_midx.errors import ConfigError
from recsys_midx.heads import DotHead, MoEHead
from recsys_midx.lit.checkpointing import RESUME_AUTO
from recsys_midx.lit.lm import LMModule
from recsys_midx.lit.table_optimizers import TableNeeds, check_table_optimizer
from recsys_midx.lit.xc import XCModule
from recsys_midx.losses import CatalogSoftmax
from recsys_midx.metrics.perplexity import PERPLEXITY_METRICS
from recsys_midx.metrics.ranking import metric_names
from recsys_midx.metrics.xc import xc_metric_names
from recsys_midx.reports import run_names
from recsys_midx.samplers import Sampler, UniformSampler


def check(cfg: DictConfig) -> None:
    """Run every check of this module on ``cfg``; the first failure is raised.

    Args:
        cfg: a config composed from ``recsys_midx/conf/config.yaml`` and the command line.

    Raises:
        ConfigError: naming the first setting (as written on the command line) that cannot work.

    Example:
        ```python
        check(compose("config", overrides=["eval.ks=[5, 50]"]))
        # Traceback (most recent call last):

        # recsys_midx.errors.ConfigError: eval.ks=[5, 50] does not produce task.monitor=...
        ```
    """
    for check_one in CHECKS:
        check_one(cfg)


def logged_validation_metrics(cfg: DictConfig) -> tuple[str, list[str]]:
    """The setting that holds the task's cut-offs and the ``val/*`` metrics the task logs.

    Args:
        cfg: a composed config.

    Returns:
        The cut-offs' key as the user writes it (``eval.ks`` for ``task=seqrec``, whose
        ``task.module.ks`` points there; ``task.module.ks`` for ``task=xc``; empty for
        ``task=lm``, which has none) and the names of the logged validation metrics, e.g.
        ``["val/hr@10", "val/ndcg@10", ...]``.

    Raises:
        ConfigError: the cut-offs are not a non-empty list of positive integers.
    """
    if issubclass(get_class(cfg.task.module._target_), LMModule):
        return "", [f"val/{name}" for name in PERPLEXITY_METRICS]
    key = _source_key(cfg.task.module, "ks", "task.module.ks")
    ks = cfg.task.module.ks
    if (
        not isinstance(ks, (list, ListConfig))
        or not ks
        or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ks)
    ):
        raise ConfigError(
            f"{key}={_show(ks)}: give a non-empty list of positive cut-offs, e.g. [10, 20]"
        )
    is_xc = issubclass(get_class(cfg.task.module._target_), XCModule)
    names = (xc_metric_names if is_xc else metric_names)(list(ks))
    return key, [f"val/{name}" for name in names]


def check_monitor(cfg: DictConfig) -> None:
    """``task.monitor`` (early stopping, checkpoint selection) is a metric the task logs."""
    key, logged = logged_validation_metrics(cfg)
    monitor = cfg.task.monitor
    if monitor not in logged and not key:
        raise ConfigError(
            f"task.monitor={monitor} is not a metric the task logs: choose one of "
            f"{', '.join(logged)}"
        )
    if monitor not in logged:
        raise ConfigError(
            f"{key}={_show(cfg.task.module.ks)} does not produce task.monitor={monitor}; "
            f"the task logs {', '.join(logged)}: add the cut-off to {key} or set task.monitor "
            "to one of them"
        )


def check_required(cfg: DictConfig) -> None:
    """Every mandatory setting (``???`` in the configs, e.g. ``dataset.path`` of
    ``dataset=custom``) is given."""
    missing = _missing_keys(OmegaConf.to_container(cfg, resolve=False))
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} must be set, e.g. {missing[0]}=VALUE on the command line"
        )


def check_optimized_metric(cfg: DictConfig) -> None:
    """``optimized_metric`` (what the command returns to a sweeper) is null or a ``val/`` or
    ``test/`` metric the task logs."""
    name = cfg.get("optimized_metric")
    if not name:
        return
    _, logged = logged_validation_metrics(cfg)
    known = [*logged, *(f"test/{metric.removeprefix('val/')}" for metric in logged)]
    if name not in known:
        raise ConfigError(
            f"optimized_metric={name} is not a metric the task logs: choose one of "
            f"{', '.join(known)}, or null"
        )


def check_resume(cfg: DictConfig) -> None:
    """``resume`` is null, ``auto`` or the path of an existing checkpoint file."""
    resume = cfg.get("resume")
    if resume and resume != RESUME_AUTO and not Path(str(resume)).is_file():
        raise ConfigError(
            f"resume={resume}: no such checkpoint file; give a .ckpt path, or resume=auto to "
            "continue from last.ckpt of hydra.run.dir"
        )


def check_epochs(cfg: DictConfig) -> None:
    """The trainer runs at least one step, and stops: ``max_epochs >= 1``, or no epoch limit
    (``-1``/``null``) together with ``max_steps`` or ``max_time``."""
    trainer = cfg.trainer
    if trainer.get("fast_dev_run"):
        return
    max_steps = trainer.get("max_steps")
    if max_steps is not None and (max_steps == 0 or max_steps < -1):
        raise ConfigError(f"trainer.max_steps={max_steps}: set it >= 1, or -1 for no step limit")
    max_epochs = trainer.get("max_epochs")
    limited = (max_steps is not None and max_steps > 0) or trainer.get("max_time") is not None
    if max_epochs in (None, -1) and not limited:
        raise ConfigError(
            f"trainer.max_epochs={_show(max_epochs)} without trainer.max_steps or "
            "trainer.max_time never stops: set trainer.max_epochs>=1 or one of those limits"
        )
    if max_epochs is not None and max_epochs != -1 and max_epochs < 1:
        raise ConfigError(
            f"trainer.max_epochs={max_epochs}: a run trains at least one epoch; set "
            "trainer.max_epochs>=1 (or -1 with trainer.max_steps or trainer.max_time)"
        )


def check_sampler(cfg: DictConfig) -> None:
    """Sampler sizes that are wrong for any catalog, the settings the sampler declares
    (:attr:`~recsys_midx.samplers.Sampler.choices` and
    :attr:`~recsys_midx.samplers.Sampler.minimums`), and product quantisation's split of
    ``model.dim`` into ``sampler.num_codebooks`` equal parts."""
    sampler = cfg.sampler
    negatives = sampler.get("num_negatives")
    if negatives is not None and negatives < 1:
        raise ConfigError(f"sampler.num_negatives={negatives}: draw at least 1 negative")
    if "_target_" not in sampler:  # sampler=full: no proposal
        return
    sampler_type = get_class(sampler._target_)
    if issubclass(sampler_type, Sampler):
        try:
            sampler_type.check_settings(sampler)
        except ValueError as error:  # "NAME=VALUE: ...", the setting as the command line has it
            raise ConfigError(f"sampler.{error}") from None
    books, dim = sampler.get("num_codebooks"), cfg.model.get("dim")
    if sampler.get("quantizer") == "pq" and books and dim and dim % books:
        raise ConfigError(
            f"model.dim={dim} is not divisible by sampler.num_codebooks={books}: product "
            "quantisation (sampler.quantizer=pq) splits the item vectors into equal parts; "
            f"choose sampler.num_codebooks dividing {dim} or sampler=midx_rq"
        )


def check_negatives(cfg: DictConfig) -> None:
    """The negatives strategy (``negatives``) goes with the loss, the sampler and the task.

    The loss scores negatives of the strategy's scope (``loss.scopes``: ``loss=bce`` needs
    drawn ones, ``loss=sce`` and ``loss=edrep`` none); a strategy that draws from the sampler
    has one (not ``sampler=full``); one that reads each batch's training sequences
    (per-sequence draws, ``negatives.exclude_window``) trains sequences, not ``task=xc``; the
    uniform draw outside each window (``negatives=outside_window``) is not asked of another
    sampler, which it would not use; and the exact softmax outside each window, like
    per-sequence draws, takes the plain dot product of a softmax loss.
    """
    strategy = get_class(cfg.negatives._target_)
    name = strategy.name
    windows = strategy.scope == "sequence" or bool(cfg.negatives.get("exclude_window"))
    setting = (
        "negatives.exclude_window=true" if strategy.scope != "sequence" else f"negatives={name}"
    )
    if windows and issubclass(get_class(cfg.task.module._target_), (XCModule, LMModule)):
        raise ConfigError(f"{setting} reads each batch's training sequences: it needs task=seqrec")
    loss = get_class(cfg.loss._target_)
    if strategy.scope not in loss.scopes:
        raise ConfigError(_refused_by_loss(loss, name))
    has_sampler = "_target_" in cfg.sampler
    if strategy.uses_sampler and not has_sampler:
        raise ConfigError(
            f"negatives={name} draws from a sampler and sampler=full has none: choose one, "
            "e.g. sampler=uniform, or negatives=none"
        )
    if name == "outside_window" and has_sampler:
        if not issubclass(get_class(cfg.sampler._target_), UniformSampler):
            raise ConfigError(
                "negatives=outside_window draws uniformly among the items outside each "
                f"sequence and uses no sampler={run_names.family(cfg)}: set "
                "negatives=per_sequence to draw from it, or sampler=uniform"
            )
    exact_outside = strategy.scope == "catalog" and windows
    if exact_outside and not (
        issubclass(loss, CatalogSoftmax) and loss.functions.exact_outside_windows is not None
    ):
        raise ConfigError(
            f"negatives.exclude_window=true with negatives=none needs loss=softmax: "
            f"loss={loss.name} does not leave each window out of its normaliser"
        )
    if (exact_outside or strategy.scope == "sequence") and not _plain_head(cfg):
        raise ConfigError(
            f"{setting} takes only head=dot or head=moe: it is computed for one query's plain "
            "dot product"
        )


def _refused_by_loss(loss: type, name: str) -> str:
    """Why ``loss`` refuses the negatives of ``negatives=name``, and what to choose."""
    if loss.scopes == frozenset({"catalog"}):
        return (
            f"loss={loss.name} estimates the softmax over the catalog itself and takes no drawn "
            f"negatives: set negatives=none (not negatives={name})"
        )
    if "catalog" not in loss.scopes and name == "none":
        return (
            f"loss={loss.name} trains on drawn negatives: choose a sampler that draws them, "
            "e.g. sampler=uniform, not sampler=full (negatives=none)"
        )
    return f"loss={loss.name} does not score negatives={name}: choose negatives=per_query or shared"


def _plain_head(cfg: DictConfig) -> bool:
    """Whether the head gives one query and no score transform (head=dot or head=moe)."""
    target = (cfg.get("head") or {}).get("_target_")
    return target is None or issubclass(get_class(target), (DotHead, MoEHead))


def table_needs(cfg: DictConfig) -> TableNeeds:
    """What a run asks of its item tables' update, read from its config: the facts
    :func:`~recsys_midx.lit.table_optimizers.resolve_table_optimizer` and
    :func:`~recsys_midx.lit.table_optimizers.check_table_optimizer` decide on.

    Example:
        ```python
        table_needs(compose("config", overrides=["sampler=full"])).exact_softmax  # True
        ```
    """
    catalog = get_class(cfg.negatives._target_).scope == "catalog"
    return TableNeeds(
        exact_softmax=catalog and get_class(cfg.loss._target_).exact_on_catalog,
        gradient_clip_val=cfg.trainer.get("gradient_clip_val"),
        weight_decay=cfg.task.module.optimizer.get("weight_decay") or 0.0,
        grad_through_stats=bool(cfg.loss.get("grad_through_stats")),
        nccl=reduces_over_nccl(cfg),
    )


def reduces_over_nccl(cfg: DictConfig) -> bool:
    """Whether the run's processes reduce gradients over NCCL: a DDP strategy over more than one
    CUDA device in all (Lightning picks NCCL there unless the strategy names another
    ``process_group_backend``). Read from the config and the machine's device count alone, so
    that every process of the run decides alike."""
    trainer = cfg.get("trainer") or {}
    strategy = trainer.get("strategy") or ""
    if isinstance(strategy, (dict, DictConfig)):
        name, backend = str(strategy.get("_target_", "")), strategy.get("process_group_backend")
    else:
        name, backend = str(strategy), None
    if "ddp" not in name.lower() or backend not in (None, "nccl"):
        return False
    accelerator = str(trainer.get("accelerator") or "auto").lower()
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    return cuda and (trainer.get("num_nodes") or 1) * _devices_per_node(trainer) > 1


def _devices_per_node(trainer: Any) -> int:
    """The devices ``trainer.devices`` asks for on each node (``-1`` or ``auto``: every CUDA
    device of this machine)."""
    devices = trainer.get("devices")
    if isinstance(devices, (list, ListConfig)):
        return len(devices)
    if devices in (-1, "-1", "auto", None):
        return torch.cuda.device_count()
    if isinstance(devices, str) and "," in devices:  # "0,1": device indices
        return len([index for index in devices.split(",") if index.strip()])
    return int(devices)


def check_table_optimizers(cfg: DictConfig) -> None:
    """A table optimizer (``task.module.table_optimizer``) is known, and a sparse one goes with
    what the run asks of the table (the rules of
    :func:`~recsys_midx.lit.table_optimizers.sparse_update_conflict`: drawn negatives, no
    gradient clipping, no weight decay, no gradient through EDRep's statistics, no NCCL)."""
    check_table_optimizer(cfg.task.module.get("table_optimizer"), table_needs(cfg))


def check_not_multirun_ddp(cfg: DictConfig) -> None:
    """No Hydra sweep (``-m``) whose jobs would start several DDP processes.

    Lightning starts the extra ranks by re-running the command line, which for a sweep is the
    whole sweep: every rank would run every job. DDP is for single runs; launch each job of a
    sweep as its own ``recsys-midx-train ... trainer=ddp`` process.
    """
    trainer = cfg.get("trainer") or {}
    multi_process = "ddp" in str(trainer.get("strategy", "")) and trainer.get("devices") != 1
    if multi_process and run_mode() == RunMode.MULTIRUN:
        raise ConfigError(
            f"trainer.strategy={trainer.get('strategy')} with trainer.devices="
            f"{trainer.get('devices')} cannot run inside a Hydra multirun (-m): the extra ranks "
            "would re-run the whole sweep. Run each job as its own process, e.g. "
            "`for s in full midx; do python train.py trainer=ddp sampler=$s; done`."
        )


def check_memory(cfg: DictConfig) -> None:
    """A training step's largest temporaries fit the memory of the device the run trains on.

    The estimate (:func:`~recsys_midx.app.step_memory.estimate_step_memory`) counts only what a
    step certainly holds at once, for the most queries a batch can hold; on CPU it is multiplied
    by the processes of the run that share the host (DDP ranks, a parallel sweep's jobs), on a
    GPU by the parallel sweep's jobs that share it. It is compared with the free memory of the
    first CUDA device, or the host's available memory.
    ``preflight.memory=false`` skips the check, as does a device whose memory cannot be read.

    Raises:
        ConfigError: naming ``sampler.num_negatives`` (or ``loss.chunk_size`` for the exact
            softmax), the queries per step, both sizes in GiB and the settings that shrink the
            step.
    """
    if not (cfg.get("preflight") or {}).get("memory", True):
        return
    device = step_memory.training_device(cfg)
    if device is None:
        return
    estimate = step_memory.estimate_step_memory(cfg, device)
    if estimate is None:
        return
    # The host is shared by every process of the run and of a parallel sweep; a GPU by the
    # sweep's jobs (each DDP rank has a device of its own).
    processes = processes_per_machine(cfg) if device.type == "cpu" else sweep_jobs()
    available = step_memory.available_memory(device)
    if available is None or estimate.bytes * processes <= available:
        return
    datamodule = cfg.task.datamodule
    queries = f"task.datamodule.batch_size={datamodule.batch_size}"
    if estimate.positions > 1 and "bptt" in datamodule:
        queries += f" x task.datamodule.bptt={estimate.positions} queries"
    elif estimate.positions > 1:
        length = _source_key(datamodule, "max_len", "task.datamodule.max_len")
        queries += (
            f" x {length}={estimate.positions} queries "
            f"(task.datamodule.train_samples={datamodule.train_samples})"
        )
    else:
        queries += " queries"
    if processes > 1:
        queries += f" in each of {processes} processes"
    size = _gib(estimate.bytes * processes)
    where = "host memory" if device.type == "cpu" else f"free memory of {device}"
    skip = "(preflight.memory=false skips this check)"
    if estimate.exact:
        raise ConfigError(
            f"loss.chunk_size={cfg.loss.chunk_size} with {queries} scores about {size} of "
            f"logits and gradients per training step of the exact softmax (sampler=full), more "
            f"than the {_gib(available)} of {where} available: lower loss.chunk_size or "
            f"task.datamodule.batch_size {skip}"
        )
    negatives = f"sampler.num_negatives={cfg.sampler.num_negatives}"
    if estimate.shared:
        raise ConfigError(
            f"{negatives} shared (negatives=shared) with {queries} scores about "
            f"{size} of logits and gradients per training step, more than the {_gib(available)} "
            f"of {where} available: lower sampler.num_negatives or "
            f"task.datamodule.batch_size {skip}"
        )
    raise ConfigError(
        f"{negatives} with {queries} gathers about {size} of item rows, logits and gradients "
        f"per training step, more than the {_gib(available)} of {where} available: set "
        f"negatives=shared, or lower sampler.num_negatives or "
        f"task.datamodule.batch_size {skip}"
    )


#: Every check, in the order they run: cheap structural ones first, the machine's memory last.
CHECKS: tuple[Callable[[DictConfig], None], ...] = (
    check_required,
    check_epochs,
    check_monitor,
    check_optimized_metric,
    check_sampler,
    check_negatives,
    check_auto,
    check_cloze_samples,
    check_language_model,
    check_table_optimizers,
    check_resume,
    check_not_multirun_ddp,
    check_memory,
)


def _missing_keys(node: Any, prefix: str = "") -> list[str]:
    """The dotted keys below ``node`` (a plain container) whose value is ``???``."""
    if isinstance(node, dict):
        items = [(f"{prefix}{key}", value) for key, value in node.items()]
    elif isinstance(node, list):
        items = [(f"{prefix[:-1]}[{index}]", value) for index, value in enumerate(node)]
    else:
        return []
    missing = []
    for key, value in items:
        if value == "???":
            missing.append(key)
        else:
            missing.extend(_missing_keys(value, f"{key}."))
    return missing


def _source_key(node: DictConfig, name: str, default: str) -> str:
    """The key a value comes from: ``eval.ks`` for ``ks: ${eval.ks}``, else ``default``."""
    raw = OmegaConf.to_container(node, resolve=False).get(name)
    if isinstance(raw, str) and raw.startswith("${") and raw.endswith("}"):
        inner = raw[2:-1]
        if ":" not in inner:  # a plain reference, not a resolver such as ${oc.env:...}
            return inner
    return default


def _gib(size: int) -> str:
    """Bytes in GiB with one decimal: ``151.1 GiB``."""
    return f"{size / 2**30:.1f} GiB"


def _show(value: Any) -> str:
    """A value as it is written on the command line: ``[5, 50]``, ``null``, ``true``."""
    if isinstance(value, (ListConfig, Sequence)) and not isinstance(value, str):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def run_mode() -> RunMode | None:
    """Hydra's mode of the current run (``RUN`` or ``MULTIRUN``), ``None`` outside a Hydra run."""
    try:
        return HydraConfig.get().mode
    except ValueError:  # composed outside a Hydra run (tests, notebooks)
        return None
