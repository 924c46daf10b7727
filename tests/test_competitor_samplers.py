"""Tests of the samplers the MIDX paper compares against: kernel, LSH, SIR and DNS."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from goodness_of_fit import chi_square_pvalue

from recsys_midx.samplers import DNSSampler, KernelSampler, LSHSampler, Sampler, SIRSampler
from recsys_midx.samplers.uniform import random_int62

NUM_ITEMS = 60
DIM = 8
NUM_QUERIES = 6
DRAWS_PER_QUERY = 20_000  # per-query goodness of fit: 6 x 60 bins, about 330 draws each


def _items(seed: int = 0, num_items: int = NUM_ITEMS) -> torch.Tensor:
    return torch.randn(num_items + 1, DIM, generator=torch.Generator().manual_seed(seed))


def _queries(num_queries: int = NUM_QUERIES, seed: int = 1) -> torch.Tensor:
    return torch.randn(num_queries, DIM, generator=torch.Generator().manual_seed(seed))


def _kernel(alpha: float = 2.0, block_size: int | None = 8) -> KernelSampler:
    # N = 60 in blocks of 8: the last block holds 4 items and 4 padding rows.
    sampler = KernelSampler(NUM_ITEMS, num_negatives=10, alpha=alpha, block_size=block_size)
    sampler.update(_items())
    return sampler


def _lsh(uniform_mix: float = 0.1, seed: int = 0) -> LSHSampler:
    sampler = LSHSampler(
        NUM_ITEMS, num_negatives=10, num_tables=3, num_bits=5, uniform_mix=uniform_mix, seed=seed
    )
    sampler.update(_items())
    return sampler


EXACT_SAMPLERS = {"kernel": _kernel, "lsh": _lsh}


@pytest.fixture(params=sorted(EXACT_SAMPLERS))
def exact_sampler(request: pytest.FixtureRequest) -> Sampler:
    return EXACT_SAMPLERS[request.param]()


def _all_ids(num_queries: int) -> torch.Tensor:
    return torch.arange(1, NUM_ITEMS + 1).expand(num_queries, -1)


def _gof_pvalue(sampler: Sampler, reference: Sampler) -> float:
    """p-value of ``sampler``'s draws for each query against ``reference``'s ``q``."""
    query = _queries()
    generator = torch.Generator().manual_seed(7)
    ids, _ = sampler.sample(query, DRAWS_PER_QUERY, generator=generator)
    return chi_square_pvalue(ids, reference.catalog_log_prob(query).double().exp())


# --- exact proposals: kernel and LSH -----------------------------------------------------------


def test_kernel_frequencies_match_log_q_and_test_has_power() -> None:
    sampler = _kernel(alpha=2.0)
    assert _gof_pvalue(sampler, sampler) > 1e-3
    # A neighbouring alpha is rejected by the same draws.
    assert _gof_pvalue(sampler, _kernel(alpha=1.5)) < 1e-6


def test_lsh_frequencies_match_log_q_and_test_has_power() -> None:
    sampler = _lsh()
    # Some of the queries' buckets are empty, so the uniform fallback is drawn too.
    assert bool((sampler._query_buckets(_queries())[2] == 0).any())
    assert _gof_pvalue(sampler, sampler) > 1e-3
    # Other projections, or a different share of uniform draws, are rejected.
    assert _gof_pvalue(sampler, _lsh(seed=1)) < 1e-6
    assert _gof_pvalue(sampler, _lsh(uniform_mix=0.2)) < 1e-6


def test_log_prob_matches_sampled_log_q(exact_sampler: Sampler) -> None:
    query = _queries(40)
    ids, log_q = exact_sampler.sample(query, 30, generator=torch.Generator().manual_seed(0))
    assert ids.shape == log_q.shape == (40, 30)
    assert ids.dtype == torch.int64 and log_q.dtype == torch.float32
    assert int(ids.min()) >= 1 and int(ids.max()) <= NUM_ITEMS
    torch.testing.assert_close(exact_sampler.log_prob(query, ids), log_q)


def test_catalog_log_prob_is_normalised_and_is_log_prob_of_every_id(
    exact_sampler: Sampler,
) -> None:
    query = _queries(5)
    catalog = exact_sampler.catalog_log_prob(query)
    assert catalog.shape == (5, NUM_ITEMS) and catalog.dtype == torch.float32
    total = catalog.double().logsumexp(1)
    torch.testing.assert_close(total, torch.zeros(5, dtype=torch.float64), rtol=0, atol=1e-5)
    torch.testing.assert_close(exact_sampler.log_prob(query, _all_ids(5)), catalog)


def test_padding_is_never_drawn_and_has_zero_probability(exact_sampler: Sampler) -> None:
    ids, log_q = exact_sampler.sample(_queries(200), 50, generator=torch.Generator().manual_seed(3))
    assert int(ids.min()) >= 1 and bool(torch.isfinite(log_q).all())
    log_q = exact_sampler.log_prob(_queries(2), torch.tensor([[0, 1], [2, 0]]))
    assert torch.isneginf(log_q[0, 0]) and torch.isneginf(log_q[1, 1])
    assert torch.isfinite(log_q[0, 1]) and torch.isfinite(log_q[1, 0])


def test_generator_reproducibility(exact_sampler: Sampler) -> None:
    query = _queries(16)
    first = exact_sampler.sample(query, 30, generator=torch.Generator().manual_seed(123))
    again = exact_sampler.sample(query, 30, generator=torch.Generator().manual_seed(123))
    other = exact_sampler.sample(query, 30, generator=torch.Generator().manual_seed(124))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


def test_state_dict_loads_into_a_never_updated_sampler() -> None:
    for source, fresh in (
        (_kernel(), KernelSampler(NUM_ITEMS, 10, alpha=2.0, block_size=8)),
        (_lsh(), LSHSampler(NUM_ITEMS, 10, num_tables=3, num_bits=5)),
    ):
        with pytest.raises(RuntimeError, match="update"):
            fresh.sample(_queries(1), 3)
        fresh.load_state_dict(source.state_dict())
        query = _queries(8)
        expected = source.sample(query, 25, generator=torch.Generator().manual_seed(5))
        actual = fresh.sample(query, 25, generator=torch.Generator().manual_seed(5))
        assert torch.equal(expected[0], actual[0]) and torch.equal(expected[1], actual[1])


@pytest.mark.parametrize("block_size", [1, 7, 8, NUM_ITEMS, None])
def test_kernel_probabilities_are_the_normalised_quadratic_kernel(block_size) -> None:
    sampler = _kernel(alpha=2.0, block_size=block_size)
    query = _queries(5)
    kernel = 2.0 * (query.double() @ _items()[1:].double().T).square() + 1.0
    expected = kernel / kernel.sum(1, keepdim=True)
    actual = sampler.catalog_log_prob(query).double().exp()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=0)
    ids, log_q = sampler.sample(query, 40, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(log_q.double().exp(), expected.gather(1, ids - 1), rtol=1e-5, atol=0)


def test_kernel_chunks_rows_and_columns_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = _kernel()
    query = _queries(7)
    expected = sampler.catalog_log_prob(query)
    ids, _ = sampler.sample(query, 9, generator=torch.Generator().manual_seed(0))
    expected_drawn = sampler.log_prob(query, ids)
    # A cap below one query's temporaries: one query, a few ids at a time.
    monkeypatch.setattr("recsys_midx.samplers.kernel._CHUNK_ELEMENTS", 200)
    torch.testing.assert_close(sampler.log_prob(query, _all_ids(7)), expected)
    torch.testing.assert_close(sampler.catalog_log_prob(query), expected)
    torch.testing.assert_close(sampler.log_prob(query, ids), expected_drawn)
    ids, log_q = sampler.sample(query, 9, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(log_q, expected.gather(1, ids - 1))


def test_kernel_default_block_size_balances_blocks_and_draws() -> None:
    sampler = KernelSampler(10_000, num_negatives=100)
    sampler.update(torch.randn(10_001, 16, generator=torch.Generator().manual_seed(0)))
    # sqrt(N * D / M) = 40 items per block.
    assert sampler.blocked_items.shape == (250, 40, 16)


def _nearly_orthogonal(norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Four queries spanning 4 of 16 dimensions and 200 items of norm ``norm`` in the other 12,
    with components of 0.01 along the queries: scores stay small while the items are large."""
    generator = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(16, 16, generator=generator, dtype=torch.float64))
    along, across = basis[:, :4], basis[:, 4:]
    query = torch.randn(4, 4, generator=generator, dtype=torch.float64) @ along.T
    large = torch.randn(200, 12, generator=generator, dtype=torch.float64)
    large *= norm / large.norm(dim=1, keepdim=True)
    small = 0.01 * torch.randn(200, 4, generator=generator, dtype=torch.float64)
    items = torch.cat([torch.zeros(1, 16, dtype=torch.float64), large @ across.T + small @ along.T])
    return query.float(), items.float()


@pytest.mark.parametrize("norm", [100.0, 1000.0])
def test_kernel_log_q_is_the_quadratic_kernel_for_large_nearly_orthogonal_items(norm) -> None:
    query, items = _nearly_orthogonal(norm)
    sampler = KernelSampler(200, num_negatives=10, alpha=100.0)
    sampler.update(items)
    assert sampler.num_blocks > 1
    # The proposal re-derived in float64 from the same float32 tables.
    kernel = 100.0 * (query.double() @ items[1:].double().T).square() + 1.0
    expected = kernel.log() - kernel.sum(1, keepdim=True).log()
    # Float32 scores of size |z| |v| round by about eps * norm: the tolerance follows the norm.
    tolerance = 2e-6 * norm
    catalog = sampler.catalog_log_prob(query).double()
    assert (catalog - expected).abs().max().item() < tolerance
    ids, log_q = sampler.sample(query, 500, generator=torch.Generator().manual_seed(0))
    assert (log_q.double() - expected.gather(1, ids - 1)).abs().max().item() < tolerance


def _lsh_brute_force(sampler: LSHSampler, query: torch.Tensor) -> torch.Tensor:
    """``[Q, N]`` q of every item, enumerating the tables and buckets one by one in float64."""
    items = _items()[1:].double()
    eps, tables = sampler.uniform_mix, sampler.num_tables
    probs = torch.full((query.shape[0], NUM_ITEMS), eps / NUM_ITEMS, dtype=torch.float64)
    for row, z in enumerate(query.double()):
        for t in range(tables):
            planes = sampler.projections[t].double()
            query_bits = planes @ z > 0
            bucket = [i for i in range(NUM_ITEMS) if torch.equal(planes @ items[i] > 0, query_bits)]
            if bucket:
                for i in bucket:
                    probs[row, i] += (1 - eps) / tables / len(bucket)
            else:
                probs[row] += (1 - eps) / tables / NUM_ITEMS
    return probs


def test_lsh_probabilities_enumerate_the_tables() -> None:
    sampler = _lsh()
    query = _queries(12)
    expected = _lsh_brute_force(sampler, query)
    torch.testing.assert_close(
        sampler.catalog_log_prob(query).double().exp(), expected, rtol=1e-5, atol=0
    )
    # Some query meets an empty bucket (the uniform fallback) and some a non-empty one.
    sizes = sampler._query_buckets(query)[2]
    assert bool((sizes == 0).any()) and bool((sizes > 0).any())


def test_lsh_bucket_draws_stay_in_the_query_buckets() -> None:
    sampler = LSHSampler(NUM_ITEMS, 10, num_tables=2, num_bits=2, uniform_mix=1e-12)
    sampler.update(_items())
    query = _queries(20)
    ids, _ = sampler.sample(query, 200, generator=torch.Generator().manual_seed(0))
    keys, _, sizes = sampler._query_buckets(query)
    in_some_bucket = torch.zeros(ids.shape, dtype=torch.bool)
    for t in range(2):
        in_some_bucket |= sampler.item_keys[t][ids] == keys[:, t : t + 1]
    # With 4 buckets per table and 60 items, every query's buckets are non-empty here.
    assert bool((sizes > 0).all()) and bool(in_some_bucket.all())


def test_lsh_gives_every_item_a_finite_log_q() -> None:
    # Many bits: most buckets are empty or tiny, yet no item has q = 0.
    sampler = LSHSampler(NUM_ITEMS, 10, num_tables=2, num_bits=12, uniform_mix=0.05)
    sampler.update(_items())
    log_q = sampler.catalog_log_prob(_queries(10))
    assert bool(torch.isfinite(log_q).all())
    assert float(log_q.min()) >= math.log(0.05 / NUM_ITEMS) - 1e-5


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("name", sorted(EXACT_SAMPLERS))
def test_exact_samplers_stay_normalised_for_large_norms(name, autocast) -> None:
    sampler = EXACT_SAMPLERS[name]()
    items, query = _items() * 300.0, _queries(8) * 300.0
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        sampler.update(items)
        ids, log_q = sampler.sample(query, 20, generator=torch.Generator().manual_seed(3))
        catalog = sampler.catalog_log_prob(query)
    assert log_q.dtype == torch.float32 and bool(torch.isfinite(log_q).all())
    assert (log_q - catalog.gather(1, ids - 1)).abs().max().item() < 1e-4
    assert catalog.double().logsumexp(1).abs().max().item() < 1e-5


# --- approximate proposals: SIR and DNS ---------------------------------------------------------


def _sir(pool_size: int = 32) -> SIRSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = SIRSampler(NUM_ITEMS, num_negatives=10, pool_size=pool_size, seed=0)
    sampler.update(_items())
    return sampler


def _dns(pool_size: int = 32) -> DNSSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = DNSSampler(NUM_ITEMS, num_negatives=10, pool_size=pool_size)
    sampler.update(_items())
    return sampler


def test_sir_and_dns_warn_that_their_log_q_is_approximate() -> None:
    with pytest.warns(UserWarning, match="approximate log q"):
        SIRSampler(NUM_ITEMS, 10, pool_size=20)
    with pytest.warns(UserWarning, match="an approximation"):
        DNSSampler(NUM_ITEMS, 10, pool_size=20)


def test_sir_draws_approach_the_softmax_as_the_pool_grows() -> None:
    query = _queries(1)
    softmax = torch.softmax(query @ _items()[1:].T, dim=1)[0].double()
    distances = []
    for pool_size in (2, 8, 32, 128):
        ids, _ = _sir(pool_size).sample(
            query.expand(4000, -1), 10, generator=torch.Generator().manual_seed(0)
        )
        frequencies = torch.bincount(ids.flatten(), minlength=NUM_ITEMS + 1)[1:].double()
        distances.append(0.5 * float((frequencies / frequencies.sum() - softmax).abs().sum()))
    # Total variation from the softmax shrinks with the pool, down to the noise of 40k draws.
    assert all(later < earlier for earlier, later in zip(distances, distances[1:])), distances
    assert distances[0] > 0.3 and distances[-1] < 0.04, distances


def test_sir_log_q_is_the_softmax_with_the_reference_set_normaliser() -> None:
    sampler = _sir()
    query = _queries(30)
    ids, log_q = sampler.sample(query, 20, generator=torch.Generator().manual_seed(0))
    assert ids.shape == log_q.shape == (30, 20) and log_q.dtype == torch.float32
    assert int(ids.min()) >= 1 and int(ids.max()) <= NUM_ITEMS
    items = _items()[1:]
    scores = query @ items.T
    reference = scores[:, sampler.reference_ids - 1]
    expected = scores - reference.logsumexp(1, keepdim=True) - math.log(NUM_ITEMS / 32)
    torch.testing.assert_close(sampler.catalog_log_prob(query), expected)
    torch.testing.assert_close(log_q, expected.gather(1, ids - 1))
    # log_prob gives the positives the normaliser of their negatives.
    torch.testing.assert_close(sampler.log_prob(query, ids), log_q)
    assert torch.isneginf(sampler.log_prob(query[:1], torch.tensor([[0]]))).all()


def test_dns_keeps_the_best_scored_candidates_of_its_pool() -> None:
    sampler = _dns(pool_size=32)
    query = _queries(50)
    ids, log_q = sampler.sample(query, 5, generator=torch.Generator().manual_seed(4))
    assert ids.shape == log_q.shape == (50, 5) and ids.dtype == torch.int64
    assert int(ids.min()) >= 1 and int(ids.max()) <= NUM_ITEMS
    # The same generator state draws the same pool: the pool's 5 best scores are the drawn ones.
    words = random_int62((50, 32), query.device, torch.Generator().manual_seed(4))
    candidates = words.remainder(NUM_ITEMS).add(1)
    items = _items()[1:]
    pool_scores = torch.einsum("qd,qld->ql", query, items[candidates - 1])
    drawn_scores = torch.einsum("qd,qmd->qm", query, items[ids - 1])
    torch.testing.assert_close(drawn_scores, pool_scores.topk(5, dim=1).values)
    assert bool(torch.isin(ids, candidates).all())
    # The documented approximation: the uniform log q, for draws and any other id.
    torch.testing.assert_close(log_q, torch.full((50, 5), -math.log(NUM_ITEMS)))
    torch.testing.assert_close(sampler.log_prob(query, ids), log_q)
    assert torch.isneginf(sampler.log_prob(query[:1], torch.tensor([[0]]))).all()


def test_dns_with_one_negative_is_the_hardest_candidate() -> None:
    sampler = _dns(pool_size=NUM_ITEMS * 20)
    query = _queries(8)
    ids, _ = sampler.sample(query, 1, generator=torch.Generator().manual_seed(0))
    # A pool twenty times the catalog holds the best item of every query.
    assert torch.equal(ids[:, 0], (query @ _items()[1:].T).argmax(1) + 1)


@pytest.mark.parametrize("make", [_sir, _dns])
def test_pool_samplers_are_reproducible_and_round_trip_state(make) -> None:
    sampler = make()
    query = _queries(16)
    first = sampler.sample(query, 10, generator=torch.Generator().manual_seed(1))
    again = sampler.sample(query, 10, generator=torch.Generator().manual_seed(1))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = type(sampler)(NUM_ITEMS, 10, pool_size=32)
    with pytest.raises(RuntimeError, match="update"):
        fresh.sample(query, 3)
    fresh.load_state_dict(sampler.state_dict())
    restored = fresh.sample(query, 10, generator=torch.Generator().manual_seed(1))
    assert torch.equal(first[0], restored[0]) and torch.equal(first[1], restored[1])


@pytest.mark.parametrize("make", [_kernel, _lsh, _sir, _dns])
def test_built_samplers_move_and_keep_float32_state_under_dtype_casts(make) -> None:
    sampler = make()
    query = _queries(8)
    expected = sampler.sample(query, 10, generator=torch.Generator().manual_seed(2))
    sampler.cpu().to(torch.bfloat16)
    assert all(buf.dtype in (torch.float32, torch.int64) for buf in sampler.buffers())
    actual = sampler.sample(query, 10, generator=torch.Generator().manual_seed(2))
    assert torch.equal(expected[0], actual[0]) and torch.equal(expected[1], actual[1])


# --- errors ------------------------------------------------------------------------------------


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="alpha"):
        KernelSampler(10, 2, alpha=0.0)
    with pytest.raises(ValueError, match="block_size"):
        KernelSampler(10, 2, block_size=0)
    with pytest.raises(ValueError, match="num_tables"):
        LSHSampler(10, 2, num_tables=0)
    with pytest.raises(ValueError, match="num_bits"):
        LSHSampler(10, 2, num_bits=25)
    with pytest.raises(ValueError, match="uniform_mix"):
        LSHSampler(10, 2, uniform_mix=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="pool_size"):
            SIRSampler(10, 2, pool_size=0)
        with pytest.raises(ValueError, match="pool_size"):
            DNSSampler(10, 5, pool_size=4)
        with pytest.raises(ValueError, match="pool_size"):
            DNSSampler(10, 2, pool_size=4).sample(torch.zeros(1, DIM), 5)


@pytest.mark.parametrize("name", [*sorted(EXACT_SAMPLERS), "sir", "dns"])
def test_malformed_inputs_raise(name) -> None:
    sampler = {**EXACT_SAMPLERS, "sir": _sir, "dns": _dns}[name]()
    with pytest.raises(ValueError, match="query"):
        sampler.sample(torch.zeros(DIM), 3)
    with pytest.raises(ValueError, match="query"):
        sampler.sample(torch.zeros(2, DIM + 1), 3)
    with pytest.raises(ValueError, match="not finite"):
        sampler.sample(torch.full((2, DIM), float("nan")), 3)
    with pytest.raises(ValueError, match="num_samples"):
        sampler.sample(torch.zeros(2, DIM), 0)
    with pytest.raises(ValueError, match="0..60"):
        sampler.log_prob(torch.zeros(2, DIM), torch.tensor([[1], [NUM_ITEMS + 1]]))
    with pytest.raises(ValueError, match="item_emb"):
        sampler.update(torch.zeros(NUM_ITEMS, DIM))


@pytest.mark.parametrize("name", [*sorted(EXACT_SAMPLERS), "sir", "dns"])
def test_log_q_of_a_non_finite_query_is_refused(name) -> None:
    # DNS reports a log q that does not depend on the query, yet refuses what sample refuses.
    sampler = {**EXACT_SAMPLERS, "sir": _sir, "dns": _dns}[name]()
    query = _queries(3)
    query[1, 2] = float("nan")
    query[2, 0] = float("inf")
    with pytest.raises(ValueError, match=r"query rows \[1, 2\] are not finite"):
        sampler.log_prob(query, _all_ids(3))
    with pytest.raises(ValueError, match=r"query rows \[1, 2\] are not finite"):
        sampler.catalog_log_prob(query)
    with pytest.raises(ValueError, match=r"query rows \[1, 2\] are not finite"):
        sampler.sample(query, 3)
