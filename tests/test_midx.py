"""MIDX samplers, their codebooks and the proposal diagnostics."""

from __future__ import annotations

import math
from typing import Any

import faiss
import numpy as np
import pytest
import torch
from goodness_of_fit import chi_square_pvalue

from recsys_midx.index import Codebooks, ProductCodebooks, ResidualCodebooks
from recsys_midx.index import codebooks as codebooks_module
from recsys_midx.samplers.cell_draws import factorised_masses
from recsys_midx.samplers.diagnostics import proposal_divergence
from recsys_midx.samplers.midx import MIDXSampler
from recsys_midx.samplers.uniform import UniformSampler

NUM_ITEMS, DIM, NUM_CLUSTERS, NUM_QUERIES = 500, 16, 20, 4
DRAWS_PER_QUERY = 50_000

#: name -> MIDXSampler keyword arguments. With 20 clusters, K=16 PQ/RQ leave most of the 256
#: cells empty (sparse table); K=8 gives the dense 8x8 table with empty cells in it.
CONFIGS: dict[str, dict[str, Any]] = {
    "midx": {"quantizer": "pq", "last_stage": "uniform", "num_codewords": 16},
    "midx_pop": {"quantizer": "pq", "last_stage": "popularity", "num_codewords": 16},
    "midx_rq": {"quantizer": "rq", "last_stage": "uniform", "num_codewords": 16},
    "midx_rq_pop": {"quantizer": "rq", "last_stage": "popularity", "num_codewords": 16},
    "midx_exact": {"quantizer": "pq", "last_stage": "residual", "num_codewords": 16},
    "midx_dense": {"quantizer": "pq", "last_stage": "uniform", "num_codewords": 8},
    "midx_rq_pop_dense": {"quantizer": "rq", "last_stage": "popularity", "num_codewords": 8},
    "midx_exact_dense": {"quantizer": "pq", "last_stage": "residual", "num_codewords": 8},
    # The exact softmax over each query's top cells mixed in (sparse and dense tables).
    "midx_top": {"quantizer": "pq", "num_codewords": 16, "exact_top_codewords": 3},
    "midx_rq_pop_top": {
        "quantizer": "rq",
        "last_stage": "popularity",
        "num_codewords": 16,
        "exact_top_codewords": 2,
        "exact_top_weight": 0.3,
    },
    "midx_top_dense": {"quantizer": "pq", "num_codewords": 8, "exact_top_codewords": 2},
}


def _unit_rows(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=1) * scale


@pytest.fixture(scope="module")
def catalog() -> dict[str, torch.Tensor]:
    """Clustered items and queries with |z.v| <= 10 (norms sqrt(10)), plus Zipf-like counts."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(NUM_CLUSTERS, DIM, generator=g)
    labels = torch.randint(0, NUM_CLUSTERS, (NUM_ITEMS + 1,), generator=g)
    noise = 0.35 * torch.randn(NUM_ITEMS + 1, DIM, generator=g)
    items = _unit_rows(centers[labels] + noise, 10**0.5)
    query_noise = 0.35 * torch.randn(NUM_QUERIES, DIM, generator=g)
    queries = _unit_rows(centers[:NUM_QUERIES] + query_noise, 10**0.5)
    ranks = torch.randperm(NUM_ITEMS + 1, generator=g).double() + 1
    counts = (2000.0 / ranks).floor()  # about half of the items have count 0
    counts[0] = 0
    return {"items": items, "queries": queries, "counts": counts}


def _built(catalog: dict[str, torch.Tensor], **kwargs: Any) -> MIDXSampler:
    sampler = MIDXSampler(NUM_ITEMS, num_negatives=20, **kwargs)
    sampler.update(catalog["items"], catalog["counts"])
    return sampler


def _all_ids(num_queries: int) -> torch.Tensor:
    return torch.arange(1, NUM_ITEMS + 1).expand(num_queries, -1)


def _assert_draws_fit(ids: torch.Tensor, probs: torch.Tensor) -> None:
    """Draws ``[Q, n]`` pass a chi-square test against ``probs`` ``[Q, N]``, and the same test
    notices a 5% tilt of the distribution."""
    assert chi_square_pvalue(ids, probs) > 1e-3
    tilt = 1.0 + 0.05 * torch.where(torch.arange(NUM_ITEMS) % 2 == 0, 1.0, -1.0)
    assert chi_square_pvalue(ids, probs * tilt) < 1e-6


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_draws_follow_reported_log_q(catalog: dict[str, torch.Tensor], name: str) -> None:
    sampler = _built(catalog, **CONFIGS[name])
    queries = catalog["queries"]
    generator = torch.Generator().manual_seed(1)
    ids, log_q = sampler.sample(queries, DRAWS_PER_QUERY, generator=generator)

    assert ids.dtype == torch.long and log_q.dtype == torch.float32
    assert int(ids.min()) >= 1 and int(ids.max()) <= NUM_ITEMS
    torch.testing.assert_close(sampler.log_prob(queries, ids), log_q, atol=1e-5, rtol=0)

    log_prob_all = sampler.log_prob(queries, _all_ids(NUM_QUERIES))
    assert torch.logsumexp(log_prob_all, 1).abs().max() < 1e-4

    probs = log_prob_all.exp()
    _assert_draws_fit(ids, probs)


def _without_table_draws(sampler: MIDXSampler) -> MIDXSampler:
    """``sampler``, failing any draw from the cell table (so only the two-stage draw runs)."""

    def table_draw(*args: Any) -> None:
        raise AssertionError("drew from the cell table")

    sampler._draw_cells_from_table = table_draw  # type: ignore[method-assign]
    return sampler


@pytest.mark.parametrize(
    "name", ["midx", "midx_rq_pop", "midx_dense", "midx_rq_pop_dense", "midx_top"]
)
def test_two_stage_draws_follow_reported_log_q(catalog: dict[str, torch.Tensor], name: str) -> None:
    # k_1 from its marginal, then k_2 | k_1, on the sparse 16x16 and the dense 8x8 grids.
    sampler = _without_table_draws(_built(catalog, **CONFIGS[name], cell_draw="two_stage"))
    assert sampler.is_dense == name.endswith("_dense")
    num_samples, repeats = 4, DRAWS_PER_QUERY // 4
    queries = catalog["queries"].repeat_interleave(repeats, 0)
    ids, log_q = sampler.sample(queries, num_samples, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(sampler.log_prob(queries, ids), log_q, atol=1e-5, rtol=0)

    ids = ids.view(NUM_QUERIES, repeats * num_samples)
    probs = sampler.log_prob(catalog["queries"], _all_ids(NUM_QUERIES)).exp()
    assert torch.logsumexp(probs.log(), 1).abs().max() < 1e-4
    _assert_draws_fit(ids, probs)


@pytest.mark.parametrize("num_codewords", [8, 16])
def test_two_stage_normaliser_equals_the_table(
    catalog: dict[str, torch.Tensor], num_codewords: int
) -> None:
    sampler = _built(catalog, **CONFIGS["midx_pop"] | {"num_codewords": num_codewords})
    queries = catalog["queries"]
    _, _, factorised = sampler._log_normaliser(queries, sampler._code_pair_grid())
    _, _, table = sampler._log_normaliser(queries, None)
    torch.testing.assert_close(factorised, table, atol=1e-5, rtol=0)


def test_auto_cell_draw_weighs_both_costs(catalog: dict[str, torch.Tensor]) -> None:
    dense = _built(catalog, **CONFIGS["midx_dense"])  # 64 cells, K = 8
    assert dense._draws_in_two_stages(13) and not dense._draws_in_two_stages(14)
    sparse = _built(catalog, **CONFIGS["midx"])  # K = 16, far fewer than 256 cells
    assert sparse._draws_in_two_stages(0) and not sparse._draws_in_two_stages(sparse.num_cells)
    assert not _built(catalog, **CONFIGS["midx_exact_dense"])._draws_in_two_stages(1)
    table = _built(catalog, **CONFIGS["midx_dense"], cell_draw="table")
    assert not table._draws_in_two_stages(1)


def test_two_stage_falls_back_to_the_table_when_masses_underflow() -> None:
    # Two 1-d subspaces with codewords -1 and +1; the cell (+1, +1) is empty. For z = (t, t) each
    # codebook's best codeword is +1, and every non-empty cell lies 2t below it: exp(-2t) is 0.
    corners = torch.tensor([[0.0, 0.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
    items = corners.repeat_interleave(torch.tensor([1, 10, 10, 10]), 0)
    sampler = MIDXSampler(30, 4, num_codewords=2)
    sampler.update(items)
    assert sampler._draws_in_two_stages(1) and int(sampler.cell_offsets.diff().eq(0).sum()) == 1
    queries = torch.tensor([[100.0, 100.0], [0.5, 0.5]])
    assert factorised_masses(sampler.codebooks.scores(queries), sampler._code_pair_grid()) is None

    ids, log_q = sampler.sample(queries, 1, generator=torch.Generator().manual_seed(5))
    assert bool(torch.isfinite(log_q).all())
    torch.testing.assert_close(sampler.log_prob(queries, ids), log_q, atol=1e-5, rtol=0)
    log_prob_all = sampler.log_prob(queries, torch.arange(1, 31).expand(2, -1))
    assert torch.logsumexp(log_prob_all, 1).abs().max() < 1e-5
    # Only the two cells at score 0 carry mass for the first query, 10 items each.
    expected = torch.tensor([math.log(1 / 20)] * 20 + [-200.0 - math.log(20)] * 10)
    torch.testing.assert_close(log_prob_all[0], expected, atol=1e-4, rtol=1e-6)


@pytest.mark.parametrize(
    ("name", "cell_draw"),
    [("midx_dense", "table"), ("midx_dense", "two_stage"), ("midx_rq_pop_dense", "table")]
    + [("midx_rq_pop_dense", "two_stage"), ("midx_exact_dense", "auto")],
)
def test_empty_cells_are_never_drawn(
    catalog: dict[str, torch.Tensor], name: str, cell_draw: str
) -> None:
    sampler = _built(catalog, **CONFIGS[name], cell_draw=cell_draw)
    cell_sizes = sampler.cell_offsets.diff()
    assert sampler.is_dense and bool((cell_sizes == 0).any()), "needs a dense table with holes"
    drawn_cells = []
    draw = sampler.stage.draw

    def recording_draw(state: Any, cells: torch.Tensor, *args: Any) -> torch.Tensor:
        drawn_cells.append(cells)
        return draw(state, cells, *args)

    sampler.stage.draw = recording_draw
    generator = torch.Generator().manual_seed(2)
    sampler.sample(catalog["queries"], 20_000, generator=generator)
    assert bool((cell_sizes[torch.cat(drawn_cells)] > 0).all())


def test_sparse_index_skips_empty_cells(catalog: dict[str, torch.Tensor]) -> None:
    sampler = _built(catalog, num_codewords=32)  # 1024 cells for 500 items
    assert not sampler.is_dense
    assert sampler.num_cells < 32**2
    assert bool((sampler.cell_offsets.diff() > 0).all())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_catalog_log_prob_equals_log_prob_of_every_id(
    catalog: dict[str, torch.Tensor], name: str
) -> None:
    sampler = _built(catalog, **CONFIGS[name])
    queries = catalog["queries"]
    expected = sampler.log_prob(queries, _all_ids(NUM_QUERIES))
    # Top-cell scores come from a sparse product here and a dense one for the whole catalog:
    # float32 rounding differs by a few ulps.
    torch.testing.assert_close(sampler.catalog_log_prob(queries), expected, atol=5e-6, rtol=0)


def test_padding_id_has_zero_probability(catalog: dict[str, torch.Tensor]) -> None:
    sampler = _built(catalog, **CONFIGS["midx_pop"])
    ids = torch.tensor([[0, 1]] * NUM_QUERIES)
    log_q = sampler.log_prob(catalog["queries"], ids)
    assert bool(torch.isneginf(log_q[:, 0]).all()) and bool(torch.isfinite(log_q[:, 1]).all())


@pytest.mark.parametrize("name", ["midx_exact", "midx_exact_dense"])
def test_exact_stage_is_the_softmax(catalog: dict[str, torch.Tensor], name: str) -> None:
    sampler = _built(catalog, **CONFIGS[name])
    queries, items = catalog["queries"], catalog["items"]
    log_softmax = torch.log_softmax(queries @ items[1:].T, dim=1)
    log_q = sampler.log_prob(queries, _all_ids(NUM_QUERIES))
    torch.testing.assert_close(log_q, log_softmax, atol=1e-4, rtol=0)
    ids, _ = sampler.sample(queries, DRAWS_PER_QUERY, generator=torch.Generator().manual_seed(3))
    assert chi_square_pvalue(ids, log_softmax.exp()) > 1e-3


def test_midx_is_closer_to_softmax_than_uniform(catalog: dict[str, torch.Tensor]) -> None:
    queries, items = catalog["queries"], catalog["items"]
    uniform = proposal_divergence(UniformSampler(NUM_ITEMS, 20), queries, items)
    for name in ("midx", "midx_rq"):
        midx = proposal_divergence(_built(catalog, **CONFIGS[name]), queries, items)
        assert midx["kl"] < 0.5 * uniform["kl"], (name, midx, uniform)
        assert midx["ess_fraction"] > uniform["ess_fraction"]
    exact = proposal_divergence(_built(catalog, **CONFIGS["midx_exact"]), queries, items)
    assert exact["kl"] < 1e-4 and abs(exact["ess_fraction"] - 1.0) < 1e-3
    assert exact["ess"] == pytest.approx(20 * exact["ess_fraction"])
    # A uniform proposal's KL is the yardstick every proposal reports beside its own.
    log_p = torch.log_softmax(queries.double() @ items[1:].double().T, dim=1)
    direct = float((log_p.exp() * (log_p + np.log(NUM_ITEMS))).sum(1).mean())
    assert uniform["kl"] == pytest.approx(direct, rel=1e-5)
    assert midx["kl_uniform"] == exact["kl_uniform"] == pytest.approx(direct, rel=1e-5)


def test_exact_top_cells_bring_the_proposal_closer_to_the_softmax(
    catalog: dict[str, torch.Tensor],
) -> None:
    queries, items = catalog["queries"], catalog["items"]
    plain = proposal_divergence(_built(catalog, num_codewords=16), queries, items)
    top = proposal_divergence(_built(catalog, **CONFIGS["midx_top"]), queries, items)
    assert top["kl"] < 0.7 * plain["kl"], (top, plain)
    # With every codeword in the top, the head is the whole catalog: q = (1 - lam) q_midx + lam p.
    whole = _built(catalog, num_codewords=8, exact_top_codewords=8, exact_top_weight=0.75)
    plain_dense = _built(catalog, num_codewords=8)
    expected = torch.logaddexp(
        plain_dense.catalog_log_prob(queries) + math.log(0.25),
        torch.log_softmax(queries @ items[1:].T, dim=1) + math.log(0.75),
    )
    torch.testing.assert_close(whole.catalog_log_prob(queries), expected, atol=1e-5, rtol=0)


def test_exact_top_scores_the_table_of_the_last_update(catalog: dict[str, torch.Tensor]) -> None:
    sampler = _built(catalog, **CONFIGS["midx_top"])
    log_q = sampler.catalog_log_prob(catalog["queries"])
    # Training moves the live table in place; the proposal keeps the snapshot until update().
    catalog_copy = catalog["items"].clone()
    sampler.update(catalog_copy)
    catalog_copy.mul_(2.0)
    torch.testing.assert_close(sampler.catalog_log_prob(catalog["queries"]), log_q)
    sampler.update(catalog_copy)
    assert not torch.allclose(sampler.catalog_log_prob(catalog["queries"]), log_q)


def test_queries_with_empty_top_cells_draw_from_midx_alone(
    catalog: dict[str, torch.Tensor],
) -> None:
    # One codeword per codebook: the best pair is often an empty cell of the sparse 16x16 grid.
    sampler = _built(catalog, num_codewords=16, exact_top_codewords=1)
    plain = _built(catalog, num_codewords=16)
    queries = torch.randn(64, DIM, generator=torch.Generator().manual_seed(8)) * 2.0
    state = sampler._prepare_exact_top(queries, sampler.codebooks.scores(queries))
    empty = torch.isneginf(state.log_normaliser.squeeze(1))
    assert 0 < int(empty.sum()) < 64
    log_q = sampler.catalog_log_prob(queries)
    assert torch.logsumexp(log_q, 1).abs().max() < 1e-4
    torch.testing.assert_close(log_q[empty], plain.catalog_log_prob(queries)[empty])
    ids, drawn_log_q = sampler.sample(queries, 2000, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(sampler.log_prob(queries, ids), drawn_log_q, atol=1e-5, rtol=0)


@pytest.mark.parametrize("quantizer", ["pq", "rq"])
def test_codebook_shapes(catalog: dict[str, torch.Tensor], quantizer: str) -> None:
    sampler = _built(catalog, quantizer=quantizer, num_codewords=16, num_codebooks=2)
    books = sampler.codebooks
    sub_dim = DIM // 2 if quantizer == "pq" else DIM
    assert tuple(books.codewords.shape) == (2, 16, sub_dim)
    assert tuple(books.codes.shape) == (NUM_ITEMS, 2)
    assert int(books.codes.min()) >= 0 and int(books.codes.max()) < 16
    assert tuple(books.codeword_matrix().shape) == (2 * 16, DIM)
    recon = books.reconstruct(books.codes)
    scores = books.scores(catalog["queries"]).view(NUM_QUERIES, 2, 16)
    codeword_sum = sum(scores[:, b, books.codes[:, b]] for b in range(2))
    torch.testing.assert_close(codeword_sum, catalog["queries"] @ recon.T, atol=1e-4, rtol=1e-5)


@pytest.fixture(scope="module")
def encoder_data() -> torch.Tensor:
    """3000 x 16 vectors: enough for K = 256 (8-bit codes, faiss's native layout)."""
    return torch.randn(3000, 16, generator=torch.Generator().manual_seed(4))


def test_pq_codes_match_faiss(encoder_data: torch.Tensor) -> None:
    books = ProductCodebooks(num_codewords=256, num_codebooks=2, kmeans_iters=4)
    codes = books.fit(encoder_data)
    pq = faiss.ProductQuantizer(16, 2, 8)
    faiss.copy_array_to_vector(books.codewords.numpy().ravel(), pq.centroids)
    expected = pq.compute_codes(encoder_data.numpy())
    np.testing.assert_array_equal(codes.numpy(), expected.astype(np.int64))


def test_rq_codes_match_faiss_greedy(encoder_data: torch.Tensor) -> None:
    books = ResidualCodebooks(num_codewords=256, num_codebooks=2, kmeans_iters=4)
    codes = books.fit(encoder_data)
    rq = faiss.ResidualQuantizer(16, 2, 8)
    rq.max_beam_size = 1
    faiss.copy_array_to_vector(books.codewords.numpy().ravel(), rq.codebooks)
    rq.is_trained = True
    expected = rq.compute_codes(encoder_data.numpy())
    np.testing.assert_array_equal(codes.numpy(), expected.astype(np.int64))
    # Greedy residual encoding by hand gives the same codes.
    residual = encoder_data.clone()
    for b in range(2):
        nearest = torch.cdist(residual, books.codewords[b]).argmin(1)
        assert torch.equal(nearest, codes[:, b])
        residual -= books.codewords[b][nearest]


def test_rq_encodes_in_blocks_of_rows(
    encoder_data: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Residuals are held a block of rows at a time; the codes are those of the whole table."""
    books = ResidualCodebooks(num_codewords=16, num_codebooks=3, kmeans_iters=4)
    whole = books.fit(encoder_data)
    monkeypatch.setattr(codebooks_module, "_RESIDUAL_BLOCK_ELEMENTS", 7 * 16)  # 7 rows
    assert torch.equal(books.encode(encoder_data), whole)


def test_refresh_follows_the_item_table(catalog: dict[str, torch.Tensor]) -> None:
    sampler = _built(catalog, **CONFIGS["midx"])
    queries = catalog["queries"]
    before = sampler.log_prob(queries, _all_ids(NUM_QUERIES))
    moved = catalog["items"].flip(1)  # same norms, different geometry
    sampler.update(moved, catalog["counts"])
    after = sampler.log_prob(queries, _all_ids(NUM_QUERIES))
    assert (after - before).abs().max() > 1.0
    fresh = MIDXSampler(NUM_ITEMS, 20, **CONFIGS["midx"])
    fresh.update(moved)
    target = torch.log_softmax(queries @ moved[1:].T, dim=1).exp()
    # The refreshed proposal describes the new table as well as a cold build does.
    kl_refreshed = (target * (target.log() - after)).sum(1).mean()
    kl_fresh = (target * (target.log() - fresh.log_prob(queries, _all_ids(NUM_QUERIES)))).sum(1)
    assert kl_refreshed < kl_fresh.mean() + 0.1


def test_refit_warm_starts_from_previous_codewords(
    catalog: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[torch.Tensor | None, int]] = []
    kmeans = Codebooks._kmeans

    def spy(self: Codebooks, x: torch.Tensor, init: torch.Tensor | None, niter: int, seed: int):
        calls.append((None if init is None else init.clone(), niter))
        return kmeans(self, x, init, niter, seed)

    monkeypatch.setattr(Codebooks, "_kmeans", spy)
    sampler = MIDXSampler(
        NUM_ITEMS, 20, num_codewords=16, quantizer="rq", kmeans_iters=12, warm_start_iters=3
    )
    sampler.update(catalog["items"])
    first = sampler.codebooks.codewords.clone()
    sampler.update(catalog["items"] + 0.01)
    assert [(init is None, niter) for init, niter in calls] == [(True, 12)] * 2 + [(False, 3)] * 2
    for b, (init, _) in enumerate(calls[2:]):
        assert torch.equal(init, first[b])

    frozen = MIDXSampler(NUM_ITEMS, 20, num_codewords=16, warm_start_iters=0)
    frozen.update(catalog["items"])
    codewords = frozen.codebooks.codewords.clone()
    frozen.update(catalog["items"] * 1.1)
    assert torch.equal(frozen.codebooks.codewords, codewords)


@pytest.mark.parametrize("name", ["midx_pop", "midx_rq", "midx_exact_dense", "midx_top"])
def test_state_dict_round_trip(catalog: dict[str, torch.Tensor], name: str) -> None:
    sampler = _built(catalog, **CONFIGS[name])
    sampler.update(catalog["items"] * 0.9)  # a refreshed state, not just the first build
    restored = MIDXSampler(NUM_ITEMS, num_negatives=20, **CONFIGS[name])
    restored.load_state_dict(sampler.state_dict())
    queries = catalog["queries"]
    expected = sampler.sample(queries, 500, generator=torch.Generator().manual_seed(5))
    actual = restored.sample(queries, 500, generator=torch.Generator().manual_seed(5))
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])
    # Training goes on identically: the next refresh reproduces the same codebooks.
    sampler.update(catalog["items"])
    restored.update(catalog["items"])
    assert torch.equal(sampler.codebooks.codewords, restored.codebooks.codewords)
    assert torch.equal(sampler.order, restored.order)


def test_bf16_queries_give_float32_log_q(catalog: dict[str, torch.Tensor]) -> None:
    sampler = _built(catalog, **CONFIGS["midx_pop"])
    queries = catalog["queries"].bfloat16()
    ids, log_q = sampler.sample(queries, 100, generator=torch.Generator().manual_seed(6))
    assert ids.dtype == torch.long and log_q.dtype == torch.float32
    reference = sampler.sample(queries.float(), 100, generator=torch.Generator().manual_seed(6))
    assert torch.equal(ids, reference[0]) and torch.equal(log_q, reference[1])
    assert sampler.log_prob(queries, ids).dtype == torch.float32


@pytest.mark.parametrize("name", ["midx_pop", "midx_exact"])
def test_module_dtype_casts_leave_the_index_intact(
    catalog: dict[str, torch.Tensor], name: str
) -> None:
    sampler = _built(catalog, **CONFIGS[name])
    dtypes = {key: value.dtype for key, value in sampler.state_dict().items()}
    expected = sampler.sample(catalog["queries"], 200, generator=torch.Generator().manual_seed(7))
    sampler.to(torch.bfloat16)  # what "bf16-true" precision does to the enclosing model
    assert {key: value.dtype for key, value in sampler.state_dict().items()} == dtypes
    actual = sampler.sample(catalog["queries"], 200, generator=torch.Generator().manual_seed(7))
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])


def test_invalid_configurations(catalog: dict[str, torch.Tensor]) -> None:
    with pytest.raises(ValueError, match="multiple"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=8, num_codebooks=3).update(catalog["items"])
    with pytest.raises(ValueError, match="exceeds the number of items"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=NUM_ITEMS + 1)
    with pytest.raises(ValueError, match="quantizer"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=8, quantizer="opq")
    with pytest.raises(ValueError, match="last_stage"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=8, last_stage="softmax")
    with pytest.raises(ValueError, match="cell_draw"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=8, cell_draw="gumbel")
    with pytest.raises(ValueError, match="item_counts"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=8, last_stage="popularity").update(
            catalog["items"]
        )
    with pytest.raises(ValueError, match="N\\+1"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=8).update(catalog["items"][1:])
    with pytest.raises(RuntimeError, match="update"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=8).sample(catalog["queries"], 5)
    with pytest.raises(ValueError, match="exact_top_codewords"):
        MIDXSampler(NUM_ITEMS, 20, num_codewords=8, exact_top_codewords=-1)
    for weight in (0.0, 1.0):
        with pytest.raises(ValueError, match="exact-top weight"):
            MIDXSampler(
                NUM_ITEMS, 20, num_codewords=8, exact_top_codewords=2, exact_top_weight=weight
            )
    with pytest.raises(ValueError, match="num_codewords"):
        ProductCodebooks(num_codewords=64).fit(torch.randn(10, 4))


def test_segment_positions_concatenate_the_runs_and_skip_empty_ones() -> None:
    from recsys_midx.samplers.exact_top import _segment_positions

    starts, counts = torch.tensor([5, 0, 9, 2, 7]), torch.tensor([2, 0, 3, 1, 0])
    expected = [5, 6, 9, 10, 11, 2]
    assert _segment_positions(starts, counts, int(counts.sum())).tolist() == expected
