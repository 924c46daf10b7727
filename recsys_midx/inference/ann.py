"""Inner-product faiss indexes over an item table, exact or approximate, and how good they are.

:class:`IndexSpec` names the index (``exact``: ``IndexFlatIP``; ``ivf``: ``IndexIVFFlat``;
``hnsw``: ``IndexHNSWFlat``; all with the inner-product metric) and its parameters, with
defaults scaled by the catalog size. :func:`build_index` builds it over the item vectors, and
:func:`measure_index` compares an approximate index with the exact one on the same queries:
recall@k of the exact top-k and queries per second of both.

Plain numpy and faiss: nothing here loads torch's training stack, Lightning or Hydra.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Literal

import faiss
import numpy as np

__all__ = [
    "INDEX_KINDS",
    "MIN_ITEMS_PER_LIST",
    "IndexSpec",
    "build_factory_index",
    "build_index",
    "item_like_queries",
    "measure_index",
]

IndexKind = Literal["exact", "ivf", "hnsw"]
#: The index kinds :class:`IndexSpec` builds.
INDEX_KINDS: tuple[str, ...] = ("exact", "ivf", "hnsw")
#: Items per inverted list below which faiss's k-means has too few points to place the lists
#: (faiss itself warns under this count per centroid).
MIN_ITEMS_PER_LIST = 39


@dataclasses.dataclass(frozen=True)
class IndexSpec:
    """Which inner-product index to build, and its parameters (``None``: scaled by the catalog).

    Args:
        kind: ``"exact"`` (``IndexFlatIP``), ``"ivf"`` (``IndexIVFFlat``) or ``"hnsw"``
            (``IndexHNSWFlat``).
        nlist: inverted lists of ``ivf``; default about ``4 * sqrt(N)``, at most
            ``N / MIN_ITEMS_PER_LIST``.
        nprobe: lists ``ivf`` scans per query; default ``nlist / 16`` (at least 1).
        hnsw_m: graph neighbours per node of ``hnsw``; default 32.
        ef_search: candidate list size of an ``hnsw`` search; default 128.
        ef_construction: candidate list size while building ``hnsw``; default 200.

    Raises:
        ValueError: (from :meth:`resolve`) a kind that is not one of :data:`INDEX_KINDS`, a
            parameter that is not positive or does not apply to the kind, ``nprobe > nlist``,
            or a catalog too small for ``nlist``; the message names the option as
            ``--nlist``, ``--nprobe``, ``--hnsw-m``, ``--ef-search`` or ``--ef-construction``.

    Example:
        >>> IndexSpec("ivf").resolve(100_000).parameters()
        {'nlist': 1265, 'nprobe': 79}
        >>> IndexSpec("hnsw").resolve(1000).parameters()
        {'hnsw_m': 32, 'ef_search': 128, 'ef_construction': 200}
    """

    kind: IndexKind = "exact"
    nlist: int | None = None
    nprobe: int | None = None
    hnsw_m: int | None = None
    ef_search: int | None = None
    ef_construction: int | None = None

    _IVF = ("nlist", "nprobe")
    _HNSW = ("hnsw_m", "ef_search", "ef_construction")

    def resolve(self, num_items: int) -> IndexSpec:
        """This spec with every default filled in for a catalog of ``num_items`` items.

        Args:
            num_items: ``N``, the vectors the index will hold.

        Returns:
            A spec whose parameters of its kind are all set (the others ``None``).

        Raises:
            ValueError: see the class.
        """
        if self.kind not in INDEX_KINDS:
            raise ValueError(f"--index must be one of {', '.join(INDEX_KINDS)}, got {self.kind!r}")
        own = {"exact": (), "ivf": self._IVF, "hnsw": self._HNSW}[self.kind]
        for name in self._IVF + self._HNSW:
            value = getattr(self, name)
            if value is None:
                continue
            option = "--" + name.replace("_", "-")
            if name not in own:
                raise ValueError(f"{option} applies to --index {_kind_of(name)}, not {self.kind}")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{option} must be a positive integer, got {value!r}")
        if self.kind == "ivf":
            return self._resolve_ivf(num_items)
        if self.kind == "hnsw":
            return dataclasses.replace(
                self,
                hnsw_m=self.hnsw_m or 32,
                ef_search=self.ef_search or 128,
                ef_construction=self.ef_construction or 200,
            )
        return self

    def _resolve_ivf(self, num_items: int) -> IndexSpec:
        most = num_items // MIN_ITEMS_PER_LIST
        if self.nlist is not None and self.nlist > most:
            raise ValueError(
                f"--nlist {self.nlist} needs at least {self.nlist * MIN_ITEMS_PER_LIST} items "
                f"({MIN_ITEMS_PER_LIST} per list) and the catalog has {num_items}: give --nlist "
                f"{max(most, 1)} or less" + ("" if most else ", or use --index hnsw or exact")
            )
        if most < 1:
            raise ValueError(
                f"--index ivf needs at least {MIN_ITEMS_PER_LIST} items and the catalog has "
                f"{num_items}: use --index hnsw or exact"
            )
        nlist = self.nlist or max(1, min(round(4 * math.sqrt(num_items)), most))
        nprobe = self.nprobe or max(1, nlist // 16)
        if nprobe > nlist:
            raise ValueError(f"--nprobe {nprobe} must not exceed --nlist {nlist}")
        return dataclasses.replace(self, nlist=nlist, nprobe=nprobe)

    def parameters(self) -> dict[str, int]:
        """The parameters of this spec's kind that are set, by name."""
        own = {"exact": (), "ivf": self._IVF, "hnsw": self._HNSW}[self.kind]
        return {name: getattr(self, name) for name in own if getattr(self, name) is not None}


def _kind_of(name: str) -> str:
    return "ivf" if name in IndexSpec._IVF else "hnsw"


def build_index(vectors: np.ndarray, spec: IndexSpec) -> faiss.Index:
    """An inner-product faiss index over ``vectors`` (trained first where the kind needs it).

    Row ``r`` of the index is row ``r`` of ``vectors``; the search parameters (``nprobe``,
    ``efSearch``) are set on the index, so they travel with it when it is written.

    Args:
        vectors: ``float32 [N, D]`` item vectors.
        spec: the index to build; defaults are resolved for ``N`` first.

    Returns:
        The filled index.

    Raises:
        ValueError: see :class:`IndexSpec`.

    Example:
        >>> vectors = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
        >>> index = build_index(vectors, IndexSpec("ivf", nlist=4, nprobe=4))
        >>> type(index).__name__, index.ntotal, index.nprobe
        ('IndexIVFFlat', 500, 4)
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    num_items, dim = vectors.shape
    spec = spec.resolve(num_items)
    if spec.kind == "exact":
        index = faiss.IndexFlatIP(dim)
    elif spec.kind == "ivf":
        # The factory builds the index owning its quantizer (a constructor-built one would be
        # freed with this frame unless its ownership were handed over by hand).
        index = faiss.index_factory(dim, f"IVF{spec.nlist},Flat", faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.nprobe = spec.nprobe
    else:
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec.ef_construction
        index.hnsw.efSearch = spec.ef_search
    index.add(vectors)
    return index


def build_factory_index(vectors: np.ndarray, factory: str) -> faiss.Index:
    """The faiss index of a factory string over ``vectors``, with the inner-product metric.

    Args:
        vectors: ``float32 [N, D]`` item vectors.
        factory: a faiss index factory string, e.g. ``"IVF1024,PQ16"`` or ``"HNSW32"``.

    Returns:
        The trained and filled index, row ``r`` being row ``r`` of ``vectors``.

    Example:
        >>> vectors = np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32)
        >>> type(build_factory_index(vectors, "HNSW16")).__name__
        'IndexHNSWFlat'
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors)
    return index


def item_like_queries(vectors: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    """Random queries shaped like the items: random item vectors plus noise of their spread.

    For measuring an index where no real queries are at hand.

    Args:
        vectors: ``float32 [N, D]`` item vectors.
        count: queries to draw.
        seed: the random seed.

    Returns:
        ``float32 [count, D]`` queries.
    """
    rng = np.random.default_rng(seed)
    picked = vectors[rng.integers(len(vectors), size=count)]
    noise = rng.standard_normal(picked.shape) * vectors.std(axis=0, keepdims=True)
    return np.ascontiguousarray(picked + noise, dtype=np.float32)


def measure_index(
    index: faiss.Index, exact: faiss.Index, queries: np.ndarray, k: int = 10, repeats: int = 3
) -> dict[str, Any]:
    """Recall@k of ``index`` against the exact top-k, and both indexes' queries per second.

    Recall@k is the mean over queries of ``|approximate top-k & exact top-k| / k``. Each index
    searches all queries in one call, ``repeats`` times; the fastest call gives its queries per
    second, both on the same queries and threads.

    Args:
        index: the index measured.
        exact: the exact index over the same vectors, in the same row order.
        queries: ``float32 [Q, D]`` queries, ``Q >= 1``.
        k: the depth compared (lowered to the number of items if larger).
        repeats: timed searches per index.

    Returns:
        ``{"k", "queries", "recall", "qps", "exact_qps", "threads"}``.

    Example:
        >>> vectors = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
        >>> exact = build_index(vectors, IndexSpec())
        >>> ivf = build_index(vectors, IndexSpec("ivf", nlist=4, nprobe=4))
        >>> measure_index(ivf, exact, item_like_queries(vectors, 50))["recall"]
        1.0
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    k = min(k, exact.ntotal)
    exact_rows, exact_seconds = _timed_search(exact, queries, k, repeats)
    rows, seconds = _timed_search(index, queries, k, repeats)
    hits = sum(
        len(np.intersect1d(found[found >= 0], truth)) for found, truth in zip(rows, exact_rows)
    )
    return {
        "k": k,
        "queries": len(queries),
        "recall": hits / (k * len(queries)),
        "qps": len(queries) / seconds,
        "exact_qps": len(queries) / exact_seconds,
        "threads": faiss.omp_get_max_threads(),
    }


def _timed_search(
    index: faiss.Index, queries: np.ndarray, k: int, repeats: int
) -> tuple[np.ndarray, float]:
    """The rows of ``index.search(queries, k)`` and its fastest time in seconds."""
    best = math.inf
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        _, rows = index.search(queries, k)
        best = min(best, time.perf_counter() - start)
    return rows, max(best, 1e-9)
