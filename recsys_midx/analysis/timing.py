"""Wall-clock timing of code that may queue work on a GPU, for the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds ``fn`` takes, waiting for the GPU work it queued on ``device``.

    CUDA kernels run asynchronously: without the synchronisation before and after, the time
    would be that of queueing the work, not of doing it.

    Args:
        fn: the code to time; its result is discarded.
        device: where ``fn`` runs; a CUDA device is synchronised, any other is not.

    Returns:
        The wall-clock seconds of one call of ``fn``.

    Example:
        ```python
        seconds = timed(lambda: sampler.sample(queries, 100), torch.device("cpu"))
        ```
    """
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda _: None
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def best_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Fastest of ``repeats`` timed runs: the least disturbed by other processes.

    Args:
        fn: the code to time.
        repeats: how many times to run it (at least 1).
        device: where ``fn`` runs (see :func:`timed`).

    Returns:
        The smallest of the ``repeats`` wall-clock times, in seconds.

    Example:
        ```python
        seconds = best_seconds(lambda: sampler.sample(queries, 100), 5, torch.device("cpu"))
        ```
    """
    return min(timed(fn, device) for _ in range(repeats))
