"""Tests of the query-independent samplers: distributions, protocol, errors, state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from goodness_of_fit import chi_square_pvalue

from recsys_midx.samplers import (
    InBatchSampler,
    PopularitySampler,
    Sampler,
    UniformSampler,
)

NUM_ITEMS = 300
DIM = 8
NUM_QUERIES = 2000
NUM_SAMPLES = 100  # 2000 x 100 = 200k draws per goodness-of-fit test


def _skewed_counts(num_items: int = NUM_ITEMS) -> torch.Tensor:
    """Zipf-like counts [N+1] with some never-seen items; index 0 (padding) is left at 0."""
    ranks = torch.arange(1, num_items + 1, dtype=torch.float64)
    counts = torch.floor(5000.0 * ranks.pow(-1.1))
    counts[::7] = 0  # unseen items: reachable only through smoothing
    return torch.cat([torch.zeros(1), counts]).to(torch.int64)


def _popularity(alpha: float = 0.75, num_items: int = NUM_ITEMS) -> PopularitySampler:
    sampler = PopularitySampler(num_items, num_negatives=10, alpha=alpha, smoothing=1.0)
    sampler.update(torch.zeros(num_items + 1, DIM), _skewed_counts(num_items))
    return sampler


def _all_ids(sampler: Sampler, num_queries: int = 1) -> torch.Tensor:
    return torch.arange(1, sampler.num_items + 1).expand(num_queries, -1)


def _probabilities(sampler: Sampler) -> np.ndarray:
    """q(i) for i in 1..N, from the sampler's own log_prob."""
    log_q = sampler.log_prob(torch.zeros(1, DIM), _all_ids(sampler))[0]
    return log_q.double().exp().numpy()


def _draw(sampler: Sampler, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return sampler.sample(torch.randn(NUM_QUERIES, DIM), NUM_SAMPLES, generator=generator)


def _gof_pvalue(ids: torch.Tensor, probabilities: np.ndarray) -> float:
    """Goodness of fit of all draws pooled (the samplers ignore the query)."""
    return chi_square_pvalue(ids.reshape(1, -1), torch.from_numpy(probabilities)[None])


# --- distributions --------------------------------------------------------------------------


def test_uniform_frequencies_match_log_q_and_test_has_power() -> None:
    sampler = UniformSampler(NUM_ITEMS, num_negatives=10)
    ids, _ = _draw(sampler)
    assert _gof_pvalue(ids, _probabilities(sampler)) > 1e-3
    # The same draws are clearly not popularity-distributed.
    assert _gof_pvalue(ids, _probabilities(_popularity())) < 1e-6


def test_popularity_frequencies_match_log_q_and_test_has_power() -> None:
    sampler = _popularity(alpha=0.75)
    ids, _ = _draw(sampler)
    assert _gof_pvalue(ids, _probabilities(sampler)) > 1e-3
    # Wrong exponents and the uniform distribution are rejected by the same test.
    assert _gof_pvalue(ids, _probabilities(_popularity(alpha=0.7))) < 1e-6
    assert _gof_pvalue(ids, _probabilities(_popularity(alpha=0.8))) < 1e-6
    assert _gof_pvalue(ids, _probabilities(UniformSampler(NUM_ITEMS, 10))) < 1e-6


def test_popularity_weights_follow_formula() -> None:
    sampler = _popularity(alpha=0.75)
    weights = (_skewed_counts()[1:].double() + 1.0) ** 0.75
    expected = (weights / weights.sum()).numpy()
    np.testing.assert_allclose(_probabilities(sampler), expected, rtol=1e-6)


def test_popularity_zero_weight_items_are_never_drawn() -> None:
    sampler = PopularitySampler(6, num_negatives=2, alpha=1.0, smoothing=0.0)
    sampler.update(torch.zeros(7, DIM), torch.tensor([9, 0, 3, 0, 1, 0, 2]))
    generator = torch.Generator().manual_seed(1)
    ids, log_q = sampler.sample(torch.zeros(500, DIM), 40, generator=generator)
    assert set(ids.unique().tolist()) == {2, 4, 6}
    assert torch.isfinite(log_q).all()
    assert torch.isinf(sampler.log_prob(torch.zeros(1, DIM), torch.tensor([[1, 3, 5]]))).all()


# --- protocol ---------------------------------------------------------------------------------


def _batch_targets() -> torch.Tensor:
    """Every item once, plus skewed repeats: a batch whose in-batch proposal covers 1..N."""
    return torch.cat([torch.arange(1, NUM_ITEMS + 1), torch.arange(1, 31).repeat_interleave(10)])


def _inbatch() -> InBatchSampler:
    sampler = InBatchSampler(NUM_ITEMS, num_negatives=10)
    sampler.observe_targets(_batch_targets())
    return sampler


SAMPLERS = {
    "uniform": lambda: UniformSampler(NUM_ITEMS, num_negatives=10),
    "popularity": _popularity,
    "inbatch": _inbatch,
}


def test_inbatch_frequencies_match_batch_target_frequencies() -> None:
    sampler = _inbatch()
    ids, _ = _draw(sampler)
    counts = torch.bincount(_batch_targets(), minlength=NUM_ITEMS + 1)[1:].double().numpy()
    np.testing.assert_allclose(_probabilities(sampler), counts / counts.sum(), rtol=1e-5)
    assert _gof_pvalue(ids, _probabilities(sampler)) > 1e-3
    assert _gof_pvalue(ids, _probabilities(UniformSampler(NUM_ITEMS, 10))) < 1e-6


def test_inbatch_falls_back_to_item_frequency_and_never_draws_unseen_items() -> None:
    sampler = InBatchSampler(NUM_ITEMS, num_negatives=10)
    with pytest.raises(RuntimeError, match="observe_targets"):
        sampler.sample(torch.randn(2, DIM), 3)
    counts = _skewed_counts()
    sampler.update(torch.zeros(NUM_ITEMS + 1, DIM), counts)
    ids, _ = _draw(sampler)
    assert not bool(torch.isin(ids, torch.nonzero(counts == 0).flatten()).any())
    expected = counts[1:].double().numpy()
    np.testing.assert_allclose(_probabilities(sampler), expected / expected.sum(), rtol=1e-5)
    assert _gof_pvalue(ids, expected) > 1e-3
    with pytest.raises(ValueError, match="1..300"):
        sampler.observe_targets(torch.tensor([0, 1]))


@pytest.fixture(params=sorted(SAMPLERS))
def sampler(request: pytest.FixtureRequest) -> Sampler:
    return SAMPLERS[request.param]()


def test_sample_shapes_dtypes_and_range(sampler: Sampler) -> None:
    query = torch.randn(7, DIM, dtype=torch.float64)
    num_samples = 13
    ids, log_q = sampler.sample(query, num_samples, generator=torch.Generator().manual_seed(0))
    assert ids.shape == log_q.shape == (7, num_samples)
    assert ids.dtype == torch.int64 and log_q.dtype == torch.float32
    assert int(ids.min()) >= 1 and int(ids.max()) <= sampler.num_items


def test_log_prob_matches_sampled_log_q(sampler: Sampler) -> None:
    query = torch.randn(50, DIM)
    num_samples = 20
    ids, log_q = sampler.sample(query, num_samples, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sampler.log_prob(query, ids), log_q, rtol=0, atol=0)


def test_log_prob_is_normalised(sampler: Sampler) -> None:
    log_q = sampler.log_prob(torch.randn(3, DIM), _all_ids(sampler, 3))
    assert log_q.dtype == torch.float32
    total = torch.logsumexp(log_q.double(), dim=1)
    torch.testing.assert_close(total, torch.zeros(3, dtype=torch.float64), rtol=0, atol=1e-5)


def test_catalog_log_prob_is_log_prob_of_every_id(sampler: Sampler) -> None:
    query = torch.randn(3, DIM)
    expected = sampler.log_prob(query, _all_ids(sampler, 3))
    torch.testing.assert_close(sampler.catalog_log_prob(query), expected, rtol=0, atol=1e-6)


def test_log_prob_of_padding_is_minus_inf(sampler: Sampler) -> None:
    log_q = sampler.log_prob(torch.randn(2, DIM), torch.tensor([[0, 1], [2, 0]]))
    assert torch.isneginf(log_q[0, 0]) and torch.isneginf(log_q[1, 1])
    assert torch.isfinite(log_q[0, 1]) and torch.isfinite(log_q[1, 0])


def test_no_gradients_flow(sampler: Sampler) -> None:
    query = torch.randn(4, DIM, requires_grad=True)
    num_samples = 5
    ids, log_q = sampler.sample(query, num_samples)
    assert not log_q.requires_grad and not sampler.log_prob(query, ids).requires_grad


def test_generator_reproducibility() -> None:
    for sampler in (UniformSampler(NUM_ITEMS, 10), _popularity()):
        query = torch.randn(16, DIM)
        first = sampler.sample(query, 30, generator=torch.Generator().manual_seed(123))
        again = sampler.sample(query, 30, generator=torch.Generator().manual_seed(123))
        other = sampler.sample(query, 30, generator=torch.Generator().manual_seed(124))
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
        assert not torch.equal(first[0], other[0])


def test_popularity_state_dict_round_trip() -> None:
    source = _popularity(alpha=0.5)
    target = PopularitySampler(NUM_ITEMS, num_negatives=10, alpha=0.5)
    with pytest.raises(RuntimeError, match="update"):
        target.sample(torch.zeros(1, DIM), 3)
    target.load_state_dict(source.state_dict())
    query = torch.randn(8, DIM)
    expected = source.sample(query, 25, generator=torch.Generator().manual_seed(5))
    actual = target.sample(query, 25, generator=torch.Generator().manual_seed(5))
    assert torch.equal(expected[0], actual[0]) and torch.equal(expected[1], actual[1])


def test_popularity_table_survives_dtype_casts() -> None:
    sampler = _popularity()
    before = _probabilities(sampler)
    sampler.to(torch.bfloat16)
    np.testing.assert_array_equal(_probabilities(sampler), before)


def test_stateless_samplers_round_trip_state_dict() -> None:
    restored = UniformSampler(NUM_ITEMS, 10)
    restored.load_state_dict(UniformSampler(NUM_ITEMS, 10).state_dict())
    torch.testing.assert_close(
        restored.log_prob(torch.zeros(1, DIM), _all_ids(restored)),
        UniformSampler(NUM_ITEMS, 10).log_prob(torch.zeros(1, DIM), _all_ids(restored)),
    )


@pytest.mark.slow
def test_popularity_large_catalog() -> None:
    num_items = 5_000_000
    counts = torch.randint(0, 1000, (num_items + 1,), generator=torch.Generator().manual_seed(0))
    sampler = PopularitySampler(num_items, num_negatives=100)
    sampler.update(torch.empty(num_items + 1, 1), counts)
    ids, log_q = sampler.sample(torch.zeros(64, 4), 100, generator=torch.Generator().manual_seed(0))
    assert int(ids.min()) >= 1 and int(ids.max()) <= num_items
    all_log_q = sampler.log_prob(torch.zeros(1, 4), torch.arange(1, num_items + 1)[None])
    assert abs(float(torch.logsumexp(all_log_q.double(), dim=1))) < 1e-5
    assert torch.equal(log_q, all_log_q[0, ids - 1])


# --- errors -----------------------------------------------------------------------------------


def test_popularity_requires_counts() -> None:
    sampler = PopularitySampler(NUM_ITEMS, num_negatives=10)
    with pytest.raises(RuntimeError, match="update"):
        sampler.log_prob(torch.zeros(1, DIM), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="item_counts"):
        sampler.update(torch.zeros(NUM_ITEMS + 1, DIM), None)
    with pytest.raises(ValueError, match="item_counts"):
        sampler.update(torch.zeros(NUM_ITEMS + 1, DIM), torch.ones(NUM_ITEMS))
    with pytest.raises(ValueError, match="non-negative"):
        sampler.update(torch.zeros(NUM_ITEMS + 1, DIM), -torch.ones(NUM_ITEMS + 1))
    with pytest.raises(ValueError, match="item_emb"):
        sampler.update(torch.zeros(NUM_ITEMS, DIM), torch.ones(NUM_ITEMS + 1))
    with pytest.raises(ValueError, match="smoothing"):
        PopularitySampler(NUM_ITEMS, alpha=0.75, smoothing=0.0).update(
            torch.zeros(NUM_ITEMS + 1, DIM), torch.zeros(NUM_ITEMS + 1)
        )


@pytest.mark.parametrize("make", [lambda: UniformSampler(NUM_ITEMS, 10), _popularity])
def test_malformed_inputs_raise(make) -> None:
    sampler = make()
    with pytest.raises(ValueError, match="query"):
        sampler.sample(torch.zeros(DIM), 3)
    with pytest.raises(ValueError, match="num_samples"):
        sampler.sample(torch.zeros(2, DIM), 0)
    with pytest.raises(ValueError, match="Q=2"):
        sampler.log_prob(torch.zeros(2, DIM), torch.ones(3, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="integer"):
        sampler.log_prob(torch.zeros(2, DIM), torch.ones(2, 1))
    with pytest.raises(ValueError, match="0..300"):
        sampler.log_prob(torch.zeros(2, DIM), torch.tensor([[1], [NUM_ITEMS + 1]]))


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="num_negatives"):
        UniformSampler(10, num_negatives=10)
    with pytest.raises(ValueError, match="alpha"):
        PopularitySampler(10, 2, alpha=float("nan"))
    with pytest.raises(ValueError, match="smoothing"):
        PopularitySampler(10, 2, smoothing=-1.0)
