"""Approximate inner-product indexes: defaults scaled by the catalog, one-line refusals, and a
recall that is exactly 1 when the search is exhaustive and a fraction when it is not."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from recsys_midx.inference.ann import (
    MIN_ITEMS_PER_LIST,
    IndexSpec,
    build_index,
    item_like_queries,
    measure_index,
)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((3000, 16)).astype(np.float32)


def test_defaults_scale_with_the_catalog() -> None:
    small, large = IndexSpec("ivf").resolve(4000), IndexSpec("ivf").resolve(4_000_000)
    assert small.nlist < large.nlist
    assert large.nlist == 8000 and large.nprobe == 500
    assert small.nlist * MIN_ITEMS_PER_LIST <= 4000
    assert IndexSpec("ivf").resolve(MIN_ITEMS_PER_LIST).parameters() == {"nlist": 1, "nprobe": 1}
    assert IndexSpec().resolve(10).parameters() == {}
    assert IndexSpec("hnsw", ef_search=16).resolve(10).parameters() == {
        "hnsw_m": 32,
        "ef_search": 16,
        "ef_construction": 200,
    }


@pytest.mark.parametrize(
    ("spec", "num_items", "message"),
    [
        (
            IndexSpec("ivf", nlist=8),
            40,
            "--nlist 8 needs at least 312 items (39 per list) and the catalog has 40: give "
            "--nlist 1 or less",
        ),
        (
            IndexSpec("ivf"),
            20,
            "--index ivf needs at least 39 items and the catalog has 20: use --index hnsw or exact",
        ),
        (IndexSpec("ivf", nlist=4, nprobe=5), 1000, "--nprobe 5 must not exceed --nlist 4"),
        (IndexSpec("hnsw", nprobe=2), 1000, "--nprobe applies to --index ivf, not hnsw"),
        (IndexSpec("exact", ef_search=2), 1000, "--ef-search applies to --index hnsw, not exact"),
        (IndexSpec("ivf", nlist=0), 1000, "--nlist must be a positive integer, got 0"),
        (IndexSpec("pq"), 1000, "--index must be one of exact, ivf, hnsw, got 'pq'"),  # type: ignore[arg-type]
    ],
)
def test_bad_settings_are_one_line_errors(spec: IndexSpec, num_items: int, message: str) -> None:
    with pytest.raises(ValueError) as error:
        spec.resolve(num_items)
    assert str(error.value) == message


def test_exhaustive_ivf_recall_is_exactly_one_and_a_narrow_one_is_lower(
    vectors: np.ndarray,
) -> None:
    exact = build_index(vectors, IndexSpec())
    queries = item_like_queries(vectors, 300)
    full = build_index(vectors, IndexSpec("ivf", nlist=32, nprobe=32))
    assert isinstance(full, faiss.IndexIVFFlat) and full.metric_type == faiss.METRIC_INNER_PRODUCT
    measured = measure_index(full, exact, queries)
    assert measured["recall"] == 1.0
    assert (measured["k"], measured["queries"]) == (10, 300)
    assert measured["qps"] > 0 and measured["exact_qps"] > 0
    narrow = measure_index(
        build_index(vectors, IndexSpec("ivf", nlist=32, nprobe=1)), exact, queries
    )
    assert 0.0 < narrow["recall"] < 1.0


def test_hnsw_with_a_generous_search_finds_the_exact_top_10(vectors: np.ndarray) -> None:
    exact = build_index(vectors, IndexSpec())
    hnsw = build_index(vectors, IndexSpec("hnsw", hnsw_m=16, ef_search=256))
    assert isinstance(hnsw, faiss.IndexHNSWFlat) and hnsw.hnsw.efSearch == 256
    assert measure_index(hnsw, exact, item_like_queries(vectors, 200))["recall"] >= 0.98
