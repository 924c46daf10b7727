"""How many CPU threads a run's torch and faiss use: the ``threads`` setting.

torch and faiss each default to one thread per core. When several processes share a machine
(DDP ranks, a parallel sweep launcher) or other work keeps the cores busy, those threads contend
for the same cores and a step spends its time waiting for them; the models' small per-step
matrices gain little from many threads anyway. So a run picks a modest count per process, and
``threads=N`` sets it exactly.
"""

from __future__ import annotations

import logging
import os

import faiss
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig

from recsys_midx.errors import ConfigError

log = logging.getLogger(__name__)

#: The most threads a process gets by default (``threads: null``).
DEFAULT_CAP = 4


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def processes_per_machine(cfg: DictConfig) -> int:
    """How many processes of this run share the machine.

    ``LOCAL_WORLD_SIZE`` when a launcher such as ``torchrun`` set it; otherwise the trainer's
    ``devices`` under a DDP strategy, times ``hydra.launcher.n_jobs`` for a parallel sweep
    launcher (Hydra's default launcher runs a sweep's jobs one after the other).

    Args:
        cfg: the run's composed config.

    Returns:
        At least 1.
    """
    if os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
        return max(1, int(os.environ["LOCAL_WORLD_SIZE"]))
    trainer = cfg.get("trainer") or {}
    devices = trainer.get("devices")
    ranks = 1
    if "ddp" in str(trainer.get("strategy", "")):
        if isinstance(devices, int) and devices > 1:
            ranks = devices
        elif isinstance(devices, (list, tuple, ListConfig)):
            ranks = max(1, len(devices))
    return ranks * sweep_jobs()


def sweep_jobs() -> int:
    """How many jobs of this run's sweep run at once.

    Returns:
        ``hydra.launcher.n_jobs`` for a parallel launcher (``hydra/launcher=joblib``), else 1:
        Hydra's default launcher runs a sweep's jobs one after the other, and a run outside a
        Hydra sweep is one job.
    """
    try:
        jobs = HydraConfig.get().launcher.get("n_jobs")
    except ValueError:  # composed outside a Hydra run
        jobs = None
    return jobs if isinstance(jobs, int) and jobs > 1 else 1


def resolve_threads(cfg: DictConfig) -> int:
    """The thread count ``cfg.threads`` stands for.

    Args:
        cfg: the run's composed config; ``threads`` is a positive integer or null.

    Returns:
        ``threads`` when set. For null: ``OMP_NUM_THREADS`` when the environment sets it, else
        the available cores divided among the processes on this machine, at most
        :data:`DEFAULT_CAP` and at least 1.

    Raises:
        ConfigError: ``threads`` is set but not a positive integer.

    Example:
        ```python
        resolve_threads(compose("config", overrides=["threads=2"]))
        # 2
        ```
    """
    threads = cfg.get("threads")
    if threads is not None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ConfigError(f"threads={threads}: give a positive integer, or null for automatic")
        return threads
    from_env = os.environ.get("OMP_NUM_THREADS", "")
    if from_env.isdigit() and int(from_env) >= 1:
        return int(from_env)
    return max(1, min(DEFAULT_CAP, available_cores() // processes_per_machine(cfg)))


def apply_threads(cfg: DictConfig) -> int:
    """Set torch's and faiss's thread counts from ``cfg.threads`` and log the choice once.

    torch's inter-op pool can only be sized before its first parallel work; when that has
    happened already (a second run in the same process) it keeps its size.

    Args:
        cfg: the run's composed config.

    Returns:
        The thread count now in use.

    Raises:
        ConfigError: ``threads`` is not a positive integer or null.
    """
    threads = resolve_threads(cfg)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # the inter-op pool is already running
        pass
    faiss.omp_set_num_threads(threads)
    log.info("threads: %d per process (torch, faiss); set with threads=N", threads)
    return threads
