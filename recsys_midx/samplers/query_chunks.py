"""Query chunks: how many queries a sampler processes at once when the user has not said.

A sampler that builds per-query tables (cell masses, top-cell layouts, draws) takes its queries
in chunks, so that those tables stay within memory. On a CPU the work per query does not depend
on the chunk, and small chunks keep the tables in the caches: the default is a fixed 1,024
queries. On a GPU each chunk also pays fixed costs (kernel launches, the host syncs of
data-dependent sizes), so a chunk there takes a share of the device's memory instead.
``docs/benchmarks.md`` ("Query chunks") has the measurements behind both. Both rules depend
only on the device's kind and size, never on the memory free at the time, so a seed draws the
same ids on the same device whatever else it holds.
"""

from __future__ import annotations

import torch

#: Queries per chunk on a CPU (and any device but CUDA).
CPU_QUERY_CHUNK = 1024
#: Share of a CUDA device's memory that one chunk's tables may take.
CUDA_MEMORY_SHARE = 1 / 16
#: Bytes per element of the tables (float32, and int64 counted as two).
_ELEMENT_BYTES = 4


def query_chunk_rows(elements_per_query: int, device: torch.device) -> int:
    """Queries per chunk on ``device`` for tables of ``elements_per_query`` elements a query.

    Args:
        elements_per_query: the 4-byte elements a chunk's tables hold per query, at their peak
            (the sampler's own estimate, e.g. its cell table and top-cell layout).
        device: where the queries are.

    Returns:
        :data:`CPU_QUERY_CHUNK` off CUDA; on CUDA the most queries whose tables fit
        :data:`CUDA_MEMORY_SHARE` of the device's total memory, at least one.

    Raises:
        ValueError: if ``elements_per_query < 1``.

    Example:
        >>> query_chunk_rows(30_000, torch.device("cpu"))
        1024
    """
    if elements_per_query < 1:
        raise ValueError(f"elements_per_query must be >= 1, got {elements_per_query}")
    if device.type != "cuda":
        return CPU_QUERY_CHUNK
    budget = torch.cuda.get_device_properties(device).total_memory * CUDA_MEMORY_SHARE
    return max(1, int(budget // (_ELEMENT_BYTES * elements_per_query)))
