"""AdaptiveSoftmax top-k (recsys_midx.inference): guarantee, exactness, cost count, validation."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import binomtest

from recsys_midx.heads import DotHead, SigSoftmaxHead
from recsys_midx.inference import (
    AdaptiveSoftmax,
    ItemTableTopK,
    adaptive_softmax_topk,
    exact_softmax_topk,
)
from recsys_midx.inference.coordinate_sampling import CoordinateSampler


@pytest.fixture(autouse=True)
def _one_thread():
    # The algorithm runs many small tensor operations; on a shared CPU intra-op threads only
    # add synchronisation overhead to them.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def planted_instance(
    g: torch.Generator,
    n: int = 300,
    d: int = 256,
    scale: float = 6.0,
    spread: float = 1.5,
    runner_up_gap: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian rows with log-normal column scales (a few coordinates carry most of the energy)
    and a query aligned with one random row, so that row wins by a gap (median p* ~ 0.25).
    With ``runner_up_gap=(lo, hi)`` another row's logit is moved to ``U(lo, hi)`` nats below
    the winner's."""
    A = torch.randn(n, d, dtype=torch.float64, generator=g)
    column_scale = torch.exp(spread * torch.randn(d, dtype=torch.float64, generator=g))
    A = A * column_scale / column_scale.norm()
    star, second = torch.randperm(n, generator=g)[:2].tolist()
    noise = torch.randn(d, dtype=torch.float64, generator=g) / math.sqrt(d)
    x = scale * A[star] / A[star].norm() + noise
    if runner_up_gap is not None:
        logits = A @ x
        low, high = runner_up_gap
        fraction = torch.rand((), dtype=torch.float64, generator=g)
        target = logits[star] - low - (high - low) * fraction
        # A[second] . (A[second] / |A[second]|^2) = 1: only that logit moves by much.
        x = x + (target - logits[second]) * A[second] / A[second].square().sum()
    return A, x


def reference_softmax(A: torch.Tensor, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Naive float64 softmax of ``A x / temperature``."""
    logits = (A.double() * x.double()).sum(1) / temperature
    return torch.exp(logits - logits.max()) / torch.exp(logits - logits.max()).sum()


def test_exact_baseline_matches_float64_reference():
    g = torch.Generator().manual_seed(1)
    A, x = torch.randn(500, 32, generator=g), torch.randn(32, generator=g)
    result = exact_softmax_topk(A, x, k=5, temperature=2.0)
    probs = reference_softmax(A, x, 2.0)
    expected = probs.topk(5)
    assert torch.equal(result.ids, expected.indices)
    torch.testing.assert_close(result.probs.double(), expected.values, rtol=1e-5, atol=0)
    assert result.multiplications == 500 * 32


@pytest.mark.parametrize("k", [1, 4])
def test_sampling_every_coordinate_is_exact(k):
    g = torch.Generator().manual_seed(2)
    A, x = planted_instance(g, n=200, d=64, scale=3.0)
    result = adaptive_softmax_topk(A, x, k, temperature=0.5, init_pulls=64, generator=g)
    probs = reference_softmax(A, x, 0.5)
    expected = probs.topk(k)
    assert torch.equal(result.ids, expected.indices)
    torch.testing.assert_close(result.probs, expected.values, rtol=1e-12, atol=0)
    assert result.multiplications == 200 * 64


def test_zero_coordinates_cost_nothing():
    g = torch.Generator().manual_seed(3)
    A, x = planted_instance(g, n=100, d=64, scale=3.0)
    x[::4] = 0.0
    result = adaptive_softmax_topk(A, x, 2, init_pulls=64, generator=g)
    assert result.multiplications == 100 * 48
    expected = reference_softmax(A, x).topk(2).values
    torch.testing.assert_close(result.probs, expected, rtol=1e-12, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("delta", [0.1, 0.02])
def test_failure_rate_is_at_most_delta_on_planted_gaps(delta):
    eps, trials = 0.3, 200
    g = torch.Generator().manual_seed(4)
    failures, products = 0, 0
    for _ in range(trials):
        # A runner-up 0.1-1 nats behind the winner makes the identification stage matter.
        A, x = planted_instance(g, runner_up_gap=(0.1, 1.0))
        exact = exact_softmax_topk(A, x)
        result = AdaptiveSoftmax(A, eps, delta).topk(x, generator=g)
        wrong_id = result.ids.item() != exact.ids.item()
        failures += wrong_id or abs(result.probs.item() / exact.probs.item() - 1) > eps
        products += result.multiplications
    # One-sided: is the failure rate significantly above delta?
    assert binomtest(failures, trials, delta, alternative="greater").pvalue > 0.01, failures
    # The instances need sampling: the algorithm must not have answered by computing A x.
    assert products / (trials * A.numel()) < 0.5


def test_saves_products_and_finds_the_top_k_in_order():
    g = torch.Generator().manual_seed(5)
    A, x = planted_instance(g, n=2000, d=512, scale=8.0)
    head = AdaptiveSoftmax(A, 0.3, 0.1)
    exact = exact_softmax_topk(A, x, k=3)
    result = head.topk(x, k=3, generator=g)
    assert torch.equal(result.ids, exact.ids)
    torch.testing.assert_close(result.logits, exact.logits, rtol=1e-12, atol=1e-12)
    assert (result.probs / exact.probs - 1).abs().max() <= 0.3
    assert result.multiplications < 0.5 * A.numel()


def test_product_count_is_the_number_of_distinct_products():
    g = torch.Generator().manual_seed(6)
    A, x = planted_instance(g, n=50, d=100)
    sampler = CoordinateSampler(A, x, 1.0, init_pulls=8, generator=g)
    assert sampler.bounds == [8, 16, 32, 64, 100]
    sampler.pull(torch.arange(50), 0)
    sampler.advance(torch.tensor([3, 7, 9]))
    sampler.advance(torch.tensor([7, 9, 11]))  # 7, 9 to level 2; 11 to level 1
    sampler.pull(torch.tensor([9, 20]), sampler.top_level)
    expected = sum(sampler.bounds[level] for level in sampler.level.tolist())
    by_hand = 50 * 8 + 3 * 8 + 2 * 16 + 8 + (100 - 32) + (100 - 8)
    assert sampler.multiplications == expected == by_hand
    torch.testing.assert_close(sampler.estimate[[9, 20]], A[[9, 20]] @ x, rtol=1e-12, atol=1e-12)
    assert sampler.variance[[9, 20]].eq(0).all()


@pytest.mark.slow
def test_horvitz_thompson_estimate_is_unbiased_and_its_variance_calibrated():
    g = torch.Generator().manual_seed(7)
    A, x = planted_instance(g, n=4, d=64)
    column_norms = torch.linalg.vector_norm(A, dim=0)
    truth = A @ x
    estimates, variances = [], []
    for _ in range(3000):
        sampler = CoordinateSampler(A, x, 1.0, init_pulls=8, column_norms=column_norms, generator=g)
        sampler.pull(torch.arange(4), 1)  # 16 of 64 coordinates
        estimates.append(sampler.estimate.clone())
        variances.append(sampler.variance.clone())
    estimates, variances = torch.stack(estimates), torch.stack(variances)
    spread = estimates.std(0)
    assert (spread > 1e-3).all()  # the estimates are random, not exact
    z = (estimates.mean(0) - truth) / (spread / math.sqrt(len(estimates)))
    assert z.abs().max() < 4, z
    ratio = variances.mean(0) / spread**2
    assert ((ratio > 0.85) & (ratio < 1.15)).all(), ratio


def test_seeded_generator_reproduces_the_answer():
    A, x = planted_instance(torch.Generator().manual_seed(8))
    first = adaptive_softmax_topk(A, x, 2, generator=torch.Generator().manual_seed(0))
    second = adaptive_softmax_topk(A, x, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first.ids, second.ids) and torch.equal(first.probs, second.probs)
    assert first.multiplications == second.multiplications


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"A": torch.zeros(3)}, "A must be"),
        ({"A": torch.zeros(3, 4, dtype=torch.long)}, "A must be"),
        ({"x": torch.zeros(5)}, "x must have shape"),
        ({"k": 0}, "k must be"),
        ({"k": 11}, "k must be"),
        ({"eps": 1.0}, "eps must be"),
        ({"delta": 0.0}, "delta must be"),
        ({"temperature": -1.0}, "temperature must be"),
        ({"init_pulls": 0}, "init_pulls must be"),
        ({"variance_scale": float("nan")}, "variance_scale must be"),
        ({"column_norms": -torch.ones(4)}, "column_norms must be"),
        ({"column_norms": torch.ones(3)}, "column_norms must be"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    arguments = {"A": torch.randn(10, 4), "x": torch.randn(4), "k": 1} | kwargs
    with pytest.raises(ValueError, match=message):
        adaptive_softmax_topk(**arguments)


def test_item_table_wrapper_skips_padding_and_scales_queries():
    class Encoder(torch.nn.Module):
        item_table = torch.cat([torch.full((1, 16), 9.0), torch.randn(40, 16)])

    class Module(torch.nn.Module):
        encoder = Encoder()
        head = DotHead()

    head = ItemTableTopK(Module(), init_pulls=16)
    z = 4 * Encoder.item_table[5]
    adaptive, exact = head.adaptive_topk(z, k=3), head.exact_topk(z, k=3)
    assert torch.equal(adaptive.ids, exact.ids) and exact.ids[0].item() == 5
    torch.testing.assert_close(adaptive.probs, exact.probs)
    # A head that deforms the logits has a different softmax: refused.
    Module.head = SigSoftmaxHead()
    with pytest.raises(ValueError, match="transforms its logits"):
        ItemTableTopK(Module())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_cuda_tensors():
    A, x = planted_instance(torch.Generator().manual_seed(9), n=2000, d=512, scale=8.0)
    A, x = A.cuda(), x.cuda()
    result = AdaptiveSoftmax(A).topk(x, 2, generator=torch.Generator("cuda").manual_seed(0))
    exact = exact_softmax_topk(A, x, 2)
    assert result.ids.device.type == "cuda" and torch.equal(result.ids, exact.ids)
    assert (result.probs / exact.probs - 1).abs().max() <= 0.3
