"""faiss k-means behind a torch interface: the only module of the package that calls faiss.

Tensors go in and come out on their own device; the training set is copied to host memory for
faiss (callers keep it small), and with a faiss GPU build and CUDA tensors faiss assigns points on
the GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import faiss
import numpy as np
import torch
from torch import Tensor

#: Below this many multiply-adds per k-means iteration faiss runs on one thread: on a small,
#: shared CPU the OpenMP fork/join per iteration costs far more than the arithmetic.
_KMEANS_SERIAL_WORK = 1 << 28


@contextlib.contextmanager
def _faiss_threads(num_threads: int | None) -> Iterator[None]:
    """Run the body with ``num_threads`` OpenMP threads in faiss (``None``: leave as is)."""
    if num_threads is None:
        yield
        return
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(num_threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def kmeans(
    x: Tensor,
    num_centroids: int,
    *,
    init: Tensor | None = None,
    niter: int = 20,
    seed: int = 0,
    max_points_per_centroid: int = 256,
) -> Tensor:
    """faiss k-means of ``x`` into ``num_centroids`` centroids, starting from ``init`` if given.

    Args:
        x: ``[n, d]`` float32 vectors, ``n >= num_centroids``; copied to host memory.
        num_centroids: ``K``.
        init: ``[K, d]`` starting centroids, or ``None`` for faiss's random start.
        niter: k-means iterations; 0 with ``init`` returns a copy of ``init``.
        seed: seed of faiss's initialisation and subsampling.
        max_points_per_centroid: faiss trains on at most this many points per centroid (a
            random subset of ``x`` beyond that).

    Returns:
        ``[K, d]`` float32 centroids on the device of ``x``.

    Example:
        >>> centroids = kmeans(torch.randn(100, 4), 3, niter=5)
        >>> tuple(centroids.shape), centroids.dtype
        ((3, 4), torch.float32)
    """
    k, d = num_centroids, x.shape[1]
    if niter == 0 and init is not None:
        return init.clone()
    use_gpu = x.is_cuda and faiss.get_num_gpus() > 0
    serial = not use_gpu and x.shape[0] * k * d < _KMEANS_SERIAL_WORK
    trainer = faiss.Kmeans(
        d,
        k,
        niter=niter,
        seed=seed,
        max_points_per_centroid=max_points_per_centroid,
        # Only used for a "too few points" warning; callers check K <= n themselves.
        min_points_per_centroid=1,
        gpu=use_gpu,
        verbose=False,
    )
    with _faiss_threads(1 if serial else None):
        trainer.train(
            np.ascontiguousarray(x.cpu().numpy()),
            init_centroids=None if init is None else init.detach().cpu().numpy(),
        )
    return torch.from_numpy(trainer.centroids).to(x.device)
