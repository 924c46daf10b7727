"""Helpers for multi-process (DDP) runs: who is running, unpadded evaluation shards, and sharing
a module's state from one rank.

They speak ``torch.distributed`` directly, so data modules and plain torch code can use them
without Lightning; every helper is a no-op (or returns the single-process answer) when no process
group with more than one process is initialised.
"""

from __future__ import annotations

from collections.abc import Sized

import torch
import torch.distributed as dist
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import nn

__all__ = ["broadcast_module_state", "eval_sampler", "raise_on_every_rank", "world_size"]


def world_size() -> int:
    """Number of processes in the default group (1 when none is initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def eval_sampler(dataset: Sized) -> UnrepeatedDistributedSampler | None:
    """A sampler that gives each rank a disjoint shard of ``dataset``, without padding.

    Lightning's default distributed sampler pads the last shard with repeated examples so every
    rank runs as many batches; for evaluation this would count some users twice. Here rank ``r``
    gets examples ``r, r + W, r + 2W, ...``, so the shards cover the dataset exactly once (they
    may differ in length by one). Metric states reduced with ``sum`` then equal one process's.

    Args:
        dataset: the evaluation dataset (anything with a length).

    Returns:
        The sampler in a multi-process run; ``None`` (keep the loader's default) otherwise.

    Raises:
        ValueError: if the dataset has fewer examples than there are processes (a rank without
            any batch would stall collective calls of the other ranks).

    Example:
        ```python
        loader = DataLoader(dataset, batch_size=256, sampler=eval_sampler(dataset))
        ```
    """
    size = world_size()
    if size == 1:
        return None
    if len(dataset) < size:
        raise ValueError(
            f"cannot split an evaluation set of {len(dataset)} examples over {size} processes"
        )
    return UnrepeatedDistributedSampler(
        dataset, num_replicas=size, rank=dist.get_rank(), shuffle=False
    )


@torch.no_grad()
def broadcast_module_state(module: nn.Module, src: int = 0) -> None:
    """Make ``module``'s parameters and buffers on every rank equal to those of rank ``src``.

    The state is sent as one pickled object (via host memory), so tensors whose shapes differ
    between ranks, or that were never built on the receiving ranks, are replaced too; the
    receiving module must accept such a state in ``load_state_dict`` (as
    :class:`~recsys_midx.index.IndexModule` does). Received tensors land on the
    devices of the receiving module's own buffers.

    Args:
        module: the module to synchronise, the same type on every rank.
        src: the rank whose state is kept.

    Raises:
        ValueError: if ``src`` is not a rank of the group.

    Example:
        ```python
        if dist.get_rank() == 0:
            sampler.update(item_table)
        broadcast_module_state(sampler)  # every rank now draws from rank 0's proposal
        ```
    """
    size = world_size()
    if size == 1:
        return
    if not 0 <= src < size:
        raise ValueError(f"src must be a rank in 0..{size - 1}, got {src}")
    payload = [None]
    if dist.get_rank() == src:
        # Host copies: a pickled CUDA tensor would be restored on the sender's device.
        payload = [{name: value.cpu() for name, value in module.state_dict().items()}]
    dist.broadcast_object_list(payload, src=src)
    if dist.get_rank() != src:
        module.load_state_dict(payload[0])


def raise_on_every_rank(error: Exception | None, src: int = 0) -> None:
    """Raise on every rank when rank ``src`` failed, so no rank waits for it forever.

    Work done on one rank only (building an index on rank 0) must tell the others whether it
    succeeded before they wait for its result in a collective call; otherwise a failure on
    ``src`` leaves the other ranks blocked in that call.

    Args:
        error: the exception ``src`` caught (``None`` on success); ignored on the other ranks.
        src: the rank that did the work.

    Raises:
        Exception: ``error`` itself on ``src`` (and in a single process).
        RuntimeError: on the other ranks when ``src`` failed, naming its error.

    Example:
        ```python
        error = None
        if dist.get_rank() == 0:
            try:
                sampler.update(item_table)
            except ValueError as exc:
                error = exc
        raise_on_every_rank(error)
        ```
    """
    if world_size() == 1:
        if error is not None:
            raise error
        return
    payload = [None if error is None else f"{type(error).__name__}: {error}"]
    dist.broadcast_object_list(payload, src=src)
    if dist.get_rank() == src and error is not None:
        raise error
    if payload[0] is not None:
        raise RuntimeError(f"rank {src} failed: {payload[0]}")
