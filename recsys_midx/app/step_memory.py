"""The memory of a training step's largest temporaries, estimated from the settings alone, and the
memory of the device a run trains on.

A sampled softmax with ``M`` negatives per query gathers the item rows of every query's
negatives: ``[Q, M + 1, D]`` floats for ``Q`` queries a step. With ``train_samples=windows`` every
position of a sample is a query, so ``Q`` is the batch size times ``max_len`` and a few thousand
negatives ask for more memory than a machine has. :func:`estimate_step_memory` counts, before any
data is read, the tensors that certainly live at once at the step's peak (the backward pass of
the loss):

- ``R`` gathered item rows, each with ``D`` float32 values, their gradient and an int64 id:
  ``8 * (D + 1)`` bytes a row. Per-query negatives gather ``R = Q * (1 + M)`` rows (a mixture
  head with ``K`` components draws ``ceil(M / K)`` per component); negatives shared by the batch
  (``negatives=shared``) gather ``R = Q + M``.
- ``S`` logits, each with its gradient: ``8`` bytes a logit. ``S = Q * K * (1 + M)`` for a
  sampled softmax; the exact softmax (``sampler=full``) scores the catalog a chunk of ``C`` items
  at a time, ``S = Q * K * C``.

So the estimate is ``8 * (D + 1) * R + 8 * S`` bytes. ``Q`` is the most queries a step can hold:
``batch_size`` for ``train_samples=prefixes`` and ``task=xc``, ``batch_size * max_len`` for
``windows`` and ``last_window`` (a batch of windows without padding). Everything else a step
holds (the encoder's activations, the sampler's chunked tables, the item table and the optimiser
state, which need the catalog size) is left out, as are the positives of ``task=xc`` beyond the
first, so that a run is refused only when the counted part alone exceeds the memory. One case
holds less than counted: where the catalog is no larger than a query's candidate rows and the
table's gradient is dense, the loss scores the whole catalog and picks the candidates
(:func:`~recsys_midx.losses.full_softmax.score_candidates`, at most ``2**26`` scores) instead of
gathering their rows; the estimate does not know the catalog of a real dataset, so it counts the
rows there too and ``preflight.memory=false`` lets such a run go.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig

from recsys_midx.heads.mos import MoSHead
from recsys_midx.lit.lm import LMModule
from recsys_midx.lit.seqrec import SeqRecModule
from recsys_midx.lit.xc import XCModule
from recsys_midx.losses.softmax import CatalogSoftmax
from recsys_midx.scoring.logsumexp import items_per_chunk

#: Bytes of a float32 value: the softmax losses compute in float32 whatever the model's precision.
FLOAT_BYTES = 4
#: Bytes of an item id (int64).
ID_BYTES = 8
#: Training samples of ``task=seqrec`` whose every position is a query.
WINDOW_SAMPLES = ("windows", "last_window")
#: Strategies that fork worker processes, which fails once this process has used CUDA.
FORKING_STRATEGIES = ("fork", "notebook")


@dataclass(frozen=True)
class StepMemory:
    """The estimated memory of a training step's largest temporaries and what it counts.

    Attributes:
        bytes: the estimate, ``8 * (dim + 1) * rows + 8 * scores``.
        queries: ``Q``, the most queries one step holds.
        positions: query positions per sample (``max_len`` for windows, else 1).
        components: ``K``, queries per context of the head (MoS components, else 1).
        dim: ``D``, the item vectors' size.
        rows: ``R``, the item rows gathered by the loss (0 for the exact softmax).
        scores: ``S``, the logits alive at once.
        exact: whether the loss is the exact softmax (``negatives=none``) rather than sampled.
        shared: whether the negatives are shared by the batch (``negatives=shared``).
    """

    bytes: int
    queries: int
    positions: int
    components: int
    dim: int
    rows: int
    scores: int
    exact: bool
    shared: bool


def estimate_step_memory(cfg: DictConfig, device: torch.device | None = None) -> StepMemory | None:
    """Estimate the largest temporaries of one training step of ``cfg`` (module docstring).

    Args:
        cfg: a config composed from ``recsys_midx/conf/config.yaml``.
        device: where the run trains; on CPU the exact softmax scores fewer items at a time
            (see :func:`~recsys_midx.losses.full_softmax.full_softmax_loss`). ``None``: as on an
            accelerator, which takes ``loss.chunk_size`` items at a time.

    Returns:
        The estimate, or ``None`` where it does not apply: a loss other than the softmax
        objectives (EDRep gathers no negatives), negatives drawn per sequence (their scores are
        a sequence's, not a query's), a task other than ``seqrec``, ``xc`` and ``lm``, or a
        setting the other checks or the components refuse (an unknown ``train_samples``, no
        ``sampler.num_negatives``).

    Example:
        ```python
        cfg = compose("config", overrides=["sampler=uniform", "sampler.num_negatives=3000",
                                           "task.datamodule.train_samples=windows",
                                           "model.max_len=200"])
        estimate = estimate_step_memory(cfg)
        estimate.queries, estimate.rows == 512 * 200 * 3001, round(estimate.bytes / 2**30)
        # (102400, True, 151)
        ```
    """
    if not issubclass(get_class(cfg.loss._target_), CatalogSoftmax):
        return None
    positions = _query_positions(cfg)
    if positions is None:
        return None
    queries = int(cfg.task.datamodule.batch_size) * positions
    head = cfg.get("head") or {}
    mixture = "_target_" in head and issubclass(get_class(head._target_), MoSHead)
    components = int(head.num_components) if mixture else 1
    dim = int(cfg.model.dim)
    scope = get_class(cfg.negatives._target_).scope
    if scope == "sequence":
        return None  # drawn per sequence: no per-query gather to estimate
    exact, shared = scope == "catalog", scope == "batch"
    if exact:
        rows, scores = 0, queries * components * _exact_chunk(cfg, queries, components, device)
    else:
        negatives = cfg.sampler.get("num_negatives")
        if not isinstance(negatives, int) or negatives < 1:
            return None
        if shared:
            rows, candidates = queries + negatives, 1 + negatives
        else:
            # A mixture head draws ceil(M / K) negatives per component (draw_mixture_negatives).
            candidates = 1 + components * math.ceil(negatives / components)
            rows = queries * candidates
        scores = queries * components * candidates
    size = 2 * FLOAT_BYTES * dim * rows + ID_BYTES * rows + 2 * FLOAT_BYTES * scores
    return StepMemory(size, queries, positions, components, dim, rows, scores, exact, shared)


def _query_positions(cfg: DictConfig) -> int | None:
    """Queries per training sample: every position of a window or of a language model's stretch,
    one per prefix or XC point."""
    module = get_class(cfg.task.module._target_)
    if issubclass(module, XCModule):
        return 1
    if issubclass(module, LMModule):
        return int(cfg.task.datamodule.bptt)
    if not issubclass(module, SeqRecModule):
        return None
    samples = cfg.task.datamodule.get("train_samples", "windows")
    if samples == "prefixes":
        return 1
    return int(cfg.task.datamodule.max_len) if samples in WINDOW_SAMPLES else None


def _exact_chunk(
    cfg: DictConfig, queries: int, components: int, device: torch.device | None
) -> int:
    """Items the exact softmax scores at once: ``loss.chunk_size`` (shared among a mixture's
    components), capped on CPU as the loss caps it, and at most the catalog where the dataset's
    config gives its size (the synthetic sources)."""
    chunk = int(cfg.loss.get("chunk_size") or 1)
    if components > 1:
        chunk = max(1, chunk // components)
    chunk = items_per_chunk(chunk, queries * components, device or torch.device("cuda"))
    catalog = cfg.dataset.get("num_items", cfg.dataset.get("num_labels"))
    if isinstance(catalog, int) and catalog >= 1:
        chunk = min(chunk, catalog)
    return chunk


def training_device(cfg: DictConfig) -> torch.device | None:
    """The device the run trains on, as far as its memory can be read now.

    Args:
        cfg: a composed config; ``trainer.accelerator`` and ``trainer.devices`` are read.

    Returns:
        ``cpu``; ``cuda:I`` for the first CUDA device of the run (``trainer.accelerator`` gpu or
        cuda, or auto on a machine with CUDA); ``None`` for other accelerators, for CUDA under a
        forking strategy (``ddp_fork``, ``ddp_notebook``), which fails once this process has
        used CUDA, and in the extra ranks of a multi-process run (``LOCAL_RANK`` above 0), where
        the first rank has checked and reading the first device would open a context on it.

    Example:
        ```python
        training_device(compose("config", overrides=["trainer=cpu"]))
        # device(type='cpu')
        ```
    """
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return None
    trainer = cfg.get("trainer") or {}
    accelerator = _accelerator(cfg)
    if accelerator == "cpu":
        return torch.device("cpu")
    if trains_on_cuda(cfg):
        if not torch.cuda.is_available():
            return None
        if any(name in str(trainer.get("strategy") or "") for name in FORKING_STRATEGIES):
            return None
        return torch.device("cuda", _first_device_index(trainer.get("devices")))
    if accelerator == "auto" and not torch.backends.mps.is_available():
        return torch.device("cpu")
    return None


def trains_on_cuda(cfg: DictConfig) -> bool:
    """Whether the run asks for CUDA devices: ``trainer.accelerator`` gpu or cuda, or auto on a
    machine with one. Read from the config and the machine alone, so every process of a run
    reads the same."""
    accelerator = _accelerator(cfg)
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def _accelerator(cfg: DictConfig) -> str:
    """``trainer.accelerator`` in lower case, ``auto`` where it is not set."""
    return str((cfg.get("trainer") or {}).get("accelerator") or "auto").lower()


def _first_device_index(devices: object) -> int:
    """The first device of ``trainer.devices``: a list's first entry, ``"2,3"``'s 2, else 0."""
    if isinstance(devices, (list, tuple, ListConfig)) and devices:
        return int(devices[0])
    if isinstance(devices, str) and "," in devices:
        first = devices.split(",")[0].strip()
        return int(first) if first.isdigit() else 0
    return 0


def available_memory(device: torch.device) -> int | None:
    """Bytes a run may still allocate on ``device``.

    Args:
        device: ``cpu`` or a CUDA device.

    Returns:
        The device's free memory for CUDA (``torch.cuda.mem_get_info``), the host's available
        memory for ``cpu`` (:func:`host_available_memory`), ``None`` for other devices.
    """
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        return host_available_memory()
    return None


def host_available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes of host memory available to new allocations.

    Linux's ``MemAvailable`` (free memory plus the caches the kernel can reclaim); elsewhere the
    physical memory, which is more than is available, so that the check never refuses a run
    because of a low reading.

    Args:
        meminfo: the file to read ``MemAvailable`` from.

    Returns:
        Bytes, or ``None`` when the platform tells neither.
    """
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None
