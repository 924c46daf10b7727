"""Tests of the exact, sampled and combined softmax losses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import drawn_loss
from torch import Tensor

from recsys_midx.heads import DotHead
from recsys_midx.losses import SoftmaxLoss, full_softmax, full_softmax_loss, sampled_softmax_loss
from recsys_midx.negatives import PerQuery, exact_positive_log_q
from recsys_midx.samplers import PopularitySampler, UniformSampler

NUM_ITEMS = 50
DIM = 6
NUM_QUERIES = 9


def _problem(dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Leaf query [Q, D], leaf item table [N+1, D] and targets [Q] in 1..N."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(NUM_QUERIES, DIM, generator=generator, dtype=dtype).requires_grad_()
    item_emb = torch.randn(NUM_ITEMS + 1, DIM, generator=generator, dtype=dtype).requires_grad_()
    targets = torch.randint(1, NUM_ITEMS + 1, (NUM_QUERIES,), generator=generator)
    return query, item_emb, targets


def _reference_loss(query: Tensor, item_emb: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(query @ item_emb[1:].T, targets - 1, reduction="none")


def _values_and_grads(loss: Tensor, *leaves: Tensor) -> list[Tensor]:
    """The loss and its gradients w.r.t. ``leaves`` for a random upstream gradient."""
    upstream = torch.randn(loss.shape, generator=torch.Generator().manual_seed(1), dtype=loss.dtype)
    return [loss.detach(), *torch.autograd.grad(loss, leaves, upstream)]


def _whole_catalog_negatives(num_queries: int) -> tuple[Tensor, Tensor]:
    neg_ids = torch.arange(1, NUM_ITEMS + 1).expand(num_queries, -1)
    return neg_ids, torch.full(neg_ids.shape, -math.log(NUM_ITEMS))


# --- full softmax -----------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [7, 50, 51, 32768])
def test_full_softmax_matches_cross_entropy(chunk_size: int) -> None:
    query, item_emb, targets = _problem()
    loss = full_softmax_loss(query, item_emb, targets, chunk_size)
    actual = _values_and_grads(loss, query, item_emb)
    expected = _values_and_grads(_reference_loss(query, item_emb, targets), query, item_emb)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert torch.equal(actual[2][0], torch.zeros(DIM)), "padding row must get no gradient"


def test_full_softmax_gradcheck_with_several_chunks() -> None:
    query, item_emb, targets = _problem(torch.float64)
    assert torch.autograd.gradcheck(
        lambda q, v: full_softmax_loss(q, v, targets, chunk_size=8), (query, item_emb)
    )


def test_full_softmax_computes_half_precision_in_float32() -> None:
    query, item_emb, targets = _problem()
    loss = full_softmax_loss(query.bfloat16(), item_emb.bfloat16(), targets, chunk_size=16)
    assert loss.dtype == torch.float32
    loss.sum().backward()
    assert query.grad is not None and item_emb.grad is not None


def test_full_softmax_only_query_requires_grad() -> None:
    query, item_emb, targets = _problem()
    loss = full_softmax_loss(query, item_emb.detach(), targets, chunk_size=16)
    (grad,) = torch.autograd.grad(loss.sum(), query)
    (expected,) = torch.autograd.grad(_reference_loss(query, item_emb, targets).sum(), query)
    torch.testing.assert_close(grad, expected)


def test_full_softmax_rejects_bad_inputs() -> None:
    query, item_emb, targets = _problem()
    with pytest.raises(ValueError, match="1..50"):
        full_softmax_loss(query, item_emb, torch.zeros_like(targets))
    with pytest.raises(ValueError, match="item_emb"):
        full_softmax_loss(query, item_emb[:, :3], targets)
    with pytest.raises(ValueError, match="targets"):
        full_softmax_loss(query, item_emb, targets[:3])
    with pytest.raises(ValueError, match="chunk_size"):
        full_softmax_loss(query, item_emb, targets, chunk_size=0)


# --- sampled softmax --------------------------------------------------------------------------


def test_sampled_softmax_over_whole_catalog_equals_full_cross_entropy() -> None:
    query, item_emb, targets = _problem()
    neg_ids, neg_log_q = _whole_catalog_negatives(NUM_QUERIES)
    pos_log_q = torch.full((NUM_QUERIES,), -math.log(NUM_ITEMS))
    sampled = sampled_softmax_loss(query, item_emb, targets, neg_ids, neg_log_q, pos_log_q)
    actual = _values_and_grads(sampled, query, item_emb)
    expected = _values_and_grads(_reference_loss(query, item_emb, targets), query, item_emb)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_accidental_hits_are_masked() -> None:
    query, item_emb, _ = _problem()
    targets = torch.full((NUM_QUERIES,), 4)
    log_q = torch.linspace(-3.0, -5.0, 4).expand(NUM_QUERIES, -1)
    with_hit = torch.tensor([7, 4, 9, 4]).expand(NUM_QUERIES, -1)
    keep = torch.tensor([0, 2])
    pos_log_q = torch.full((NUM_QUERIES,), -2.0)
    loss_with_hit = sampled_softmax_loss(query, item_emb, targets, with_hit, log_q, pos_log_q)
    loss_without = sampled_softmax_loss(
        query, item_emb, targets, with_hit[:, keep], log_q[:, keep], pos_log_q
    )
    torch.testing.assert_close(loss_with_hit, loss_without)


def test_exact_positives_keep_the_gradient_a_proposal_missing_the_positive_loses() -> None:
    # A peaked softmax (p(target) ~ 0.6) and a proposal equal to it except at the target, where
    # it is 1e-4: the proposal a coarse sampler gives a confident model. Averaged over many
    # draws, the exact-positive estimator recovers the full gradient; the usual correction,
    # dominated by exp(s_p) / q_p, loses most of it.
    generator = torch.Generator().manual_seed(0)
    item_emb = torch.randn(NUM_ITEMS + 1, DIM, generator=generator)
    target = 7
    query = (2.5 * item_emb[target] / item_emb[target].norm() ** 2 * 2.0).requires_grad_()
    logits = query.detach() @ item_emb[1:].T
    p = logits.softmax(0)
    assert 0.5 < float(p[target - 1]) < 0.9
    q = p.clone()
    q[target - 1] = 1e-4
    q /= q.sum()
    draws, num_negatives = 400, 32
    neg_ids = torch.multinomial(q, draws * num_negatives, True, generator=generator) + 1
    neg_ids = neg_ids.view(draws, num_negatives)
    neg_log_q = q.log()[neg_ids - 1]
    queries, targets = query.expand(draws, -1), torch.full((draws,), target)

    def mean_query_grad(pos_log_q: Tensor) -> Tensor:
        loss = sampled_softmax_loss(queries, item_emb, targets, neg_ids, neg_log_q, pos_log_q)
        return torch.autograd.grad(loss.mean(), query)[0]

    full = torch.autograd.grad(_reference_loss(query[None], item_emb, targets[:1]).sum(), query)[0]
    exact = mean_query_grad(exact_positive_log_q(targets, num_negatives))
    corrected = mean_query_grad(torch.full((draws,), float(q[target - 1].log())))
    assert float((exact - full).norm() / full.norm()) < 0.1
    assert float(corrected.norm() / full.norm()) < 0.2


def test_exact_positive_log_q_is_minus_log_m_and_minus_inf_at_padding() -> None:
    log_q = exact_positive_log_q(torch.tensor([[3, 5], [2, 0]]), 32)
    expected = torch.tensor([[-math.log(32)] * 2, [-math.log(32), -math.inf]])
    torch.testing.assert_close(log_q, expected)


def test_softmax_loss_with_exact_positives_does_not_score_positives_under_q() -> None:
    query, item_emb, targets = _problem()
    sampler = _RecordingSampler()
    strategy = PerQuery(correct_positive=False)
    drawn_loss(SoftmaxLoss(), DotHead()(query), targets, item_emb, sampler, strategy)
    assert len(sampler.seen) == 1  # sample() only, no log_prob() of the targets


def test_sampled_softmax_computes_bf16_in_float32() -> None:
    query, item_emb, targets = _problem()
    neg_ids, neg_log_q = _whole_catalog_negatives(NUM_QUERIES)
    loss = sampled_softmax_loss(
        query.bfloat16(), item_emb.bfloat16(), targets, neg_ids, neg_log_q, neg_log_q[:, 0]
    )
    assert loss.dtype == torch.float32
    loss.sum().backward()
    assert item_emb.grad is not None and torch.isfinite(item_emb.grad).all()


def test_sampled_softmax_rejects_bad_shapes() -> None:
    query, item_emb, targets = _problem()
    neg_ids, neg_log_q = _whole_catalog_negatives(NUM_QUERIES)
    pos_log_q = neg_log_q[:, 0]
    with pytest.raises(ValueError, match="neg_ids"):
        sampled_softmax_loss(query, item_emb, targets, neg_ids[:2], neg_log_q, pos_log_q)
    with pytest.raises(ValueError, match="neg_log_q"):
        sampled_softmax_loss(query, item_emb, targets, neg_ids, neg_log_q[:, :3], pos_log_q)
    with pytest.raises(ValueError, match="pos_log_q"):
        sampled_softmax_loss(query, item_emb, targets, neg_ids, neg_log_q, pos_log_q[:2])


# --- SoftmaxLoss ------------------------------------------------------------------------------


def _updated(sampler: PopularitySampler) -> PopularitySampler:
    sampler.update(torch.zeros(NUM_ITEMS + 1, DIM), torch.arange(NUM_ITEMS + 1))
    return sampler


class _RecordingSampler(UniformSampler):
    """A uniform proposal that records the queries it is given."""

    def __init__(self) -> None:
        super().__init__(NUM_ITEMS, num_negatives=10)
        self.seen: list[Tensor] = []

    def sample(
        self, query: Tensor, num_samples: int | None = None, **kwargs
    ) -> tuple[Tensor, Tensor]:
        self.seen.append(query)
        return super().sample(query, num_samples, **kwargs)

    def log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        self.seen.append(query)
        return super().log_prob(query, ids)


def test_softmax_loss_on_the_whole_catalog_is_full_cross_entropy() -> None:
    query, item_emb, targets = _problem()
    loss = drawn_loss(SoftmaxLoss(chunk_size=16), DotHead()(query), targets, item_emb)
    torch.testing.assert_close(loss, _reference_loss(query, item_emb, targets).mean())


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda: UniformSampler(NUM_ITEMS, num_negatives=10),
        lambda: _updated(PopularitySampler(NUM_ITEMS, num_negatives=10)),
    ],
)
def test_softmax_loss_with_sampler_backpropagates(make_sampler) -> None:
    query, item_emb, targets = _problem()
    loss = drawn_loss(
        SoftmaxLoss(), DotHead(temperature=0.5)(query), targets, item_emb, make_sampler()
    )
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    for grad in (query.grad, item_emb.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


@pytest.mark.parametrize("make_sampler", [lambda: None, lambda: UniformSampler(NUM_ITEMS, 10)])
def test_temperature_scales_logits(make_sampler) -> None:
    query, item_emb, targets = _problem()
    temperature = 0.3
    torch.manual_seed(0)
    scaled = drawn_loss(
        SoftmaxLoss(), DotHead(temperature)(query), targets, item_emb, make_sampler()
    )
    torch.manual_seed(0)
    unscaled = DotHead(1.0)(query / temperature)
    reference = drawn_loss(SoftmaxLoss(), unscaled, targets, item_emb, make_sampler())
    torch.testing.assert_close(scaled, reference)


def test_sampler_gets_the_scaled_detached_float32_query() -> None:
    query, item_emb, targets = _problem()
    sampler = _RecordingSampler()
    output = DotHead(temperature=0.25)(query.bfloat16())
    drawn_loss(SoftmaxLoss(), output, targets, item_emb.bfloat16(), sampler)
    assert len(sampler.seen) == 2
    for seen in sampler.seen:
        assert seen.dtype == torch.float32 and not seen.requires_grad
        torch.testing.assert_close(seen, (query.bfloat16() / 0.25).float())


def test_head_rejects_bad_temperature() -> None:
    for temperature in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            DotHead(temperature)


@pytest.mark.parametrize("components", [None, 3])
def test_candidates_scored_through_the_catalog_match_the_gathered_rows(monkeypatch, components):
    torch.manual_seed(0)
    shape = (6, 4) if components is None else (6, components, 4)
    query = torch.randn(*shape, dtype=torch.float64)
    item_emb = torch.randn(9, 4, dtype=torch.float64)
    ids = torch.randint(0, 9, (6, 5))
    weights = torch.randn(*shape[:-1], 5, dtype=torch.float64)

    def scores_and_grads():
        q, table = query.clone().requires_grad_(True), item_emb.clone().requires_grad_(True)
        scores = full_softmax.score_candidates(q, table, ids, torch.float64)
        (scores * weights).sum().backward()
        return scores.detach(), q.grad, table.grad

    dense = scores_and_grads()  # 8 items <= 5 candidates x 4 dims: one product with the catalog
    monkeypatch.setattr(full_softmax, "_DENSE_PICK_MAX_SCORES", 0)
    gathered = scores_and_grads()
    for got, expected in zip(dense, gathered):
        torch.testing.assert_close(got, expected)
    equation = "qd,qcd->qc" if components is None else "qkd,qcd->qkc"
    torch.testing.assert_close(gathered[0], torch.einsum(equation, query, item_emb[ids]))
