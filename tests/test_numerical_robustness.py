"""Samplers and softmax losses stay finite and accurate for query and item norms up to 1e3, in
float32 and under bf16 autocast; a diverged (NaN) item table never yields NaN probabilities."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from recsys_midx.losses.full_softmax import full_softmax_loss
from recsys_midx.losses.multilabel import multilabel_sampled_softmax_loss
from recsys_midx.losses.sampled_softmax import sampled_softmax_loss
from recsys_midx.samplers import MIDXSampler, PopularitySampler, UniformSampler

N, D, Q, M = 300, 16, 12, 24
SCALES = [1.0, 1e3]


def _rows_of_norm(rows: int, norm: float, seed: int) -> torch.Tensor:
    x = torch.randn(rows, D, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=1, keepdim=True) * norm


def _precision(autocast: bool) -> contextlib.AbstractContextManager[None]:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)


SAMPLERS = {
    "midx": lambda: MIDXSampler(N, M, num_codewords=8),
    "midx_pop": lambda: MIDXSampler(N, M, num_codewords=8, last_stage="popularity"),
    "midx_exact": lambda: MIDXSampler(N, M, num_codewords=8, last_stage="residual"),
    "midx_rq": lambda: MIDXSampler(N, M, num_codewords=8, quantizer="rq"),
    "uniform": lambda: UniformSampler(N, M),
    "popularity": lambda: PopularitySampler(N, M),
}


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_samplers_stay_normalised_for_large_norms(name, scale, autocast):
    sampler = SAMPLERS[name]()
    items, query = _rows_of_norm(N + 1, scale, 0), _rows_of_norm(Q, scale, 1)
    counts = torch.randint(0, 50, (N + 1,), generator=torch.Generator().manual_seed(2))
    with _precision(autocast):
        sampler.update(items, counts)
        ids, log_q = sampler.sample(query, M, generator=torch.Generator().manual_seed(3))
        log_prob = sampler.log_prob(query, torch.arange(1, N + 1).expand(Q, -1))
    assert log_q.dtype == torch.float32 and bool(torch.isfinite(log_q).all())
    assert bool(((ids >= 1) & (ids <= N)).all())
    # Normalised, and the draws report the log q of log_prob: float32 scores of size scale**2
    # carry an absolute rounding error of about 1e-7 * scale**2 (a bf16 product would be off
    # by several nats at scale 1e3).
    tolerance = 1e-5 + 5e-8 * scale**2
    assert (log_q - log_prob.gather(1, ids - 1)).abs().max().item() < tolerance
    assert log_prob.double().logsumexp(1).abs().max().item() < tolerance


def test_midx_refuses_a_diverged_table_and_keeps_its_proposal():
    sampler = MIDXSampler(N, M, num_codewords=8)
    items, query = _rows_of_norm(N + 1, 1.0, 0), _rows_of_norm(Q, 1.0, 1)
    sampler.update(items)
    before = sampler.log_prob(query, torch.arange(1, N + 1).expand(Q, -1))
    broken = items.clone()
    broken[7, 3] = math.nan
    broken[42] = math.inf
    broken[100] *= 1e30  # k-means would square it to inf (faiss then aborts the process)
    with pytest.raises(
        ValueError,
        match=r"3 item rows with NaN or infinite values or norms "
        r"above 9\.2e\+18 \(first: item 7, norm nan\); the "
        r"model has diverged",
    ):
        sampler.update(broken)
    after = sampler.log_prob(query, torch.arange(1, N + 1).expand(Q, -1))
    assert torch.equal(before, after)


def test_midx_builds_from_norms_up_to_the_limit():
    sampler = MIDXSampler(N, M, num_codewords=8)
    sampler.update(_rows_of_norm(N + 1, 1e18, 0))
    log_prob = sampler.log_prob(_rows_of_norm(Q, 1e-18, 1), torch.arange(1, N + 1).expand(Q, -1))
    assert bool(torch.isfinite(log_prob).all())


@pytest.mark.parametrize("name", ["uniform", "popularity"])
def test_query_independent_samplers_ignore_a_nan_table(name):
    sampler = SAMPLERS[name]()
    items = _rows_of_norm(N + 1, 1.0, 0)
    items[5] = math.nan
    sampler.update(items, torch.ones(N + 1))
    query = torch.full((Q, D), math.nan)
    ids, log_q = sampler.sample(query, M)
    assert bool(torch.isfinite(log_q).all()) and bool(((ids >= 1) & (ids <= N)).all())


def _reference_sampled(query, items, targets, neg_ids, neg_log_q, pos_log_q):
    """Naive float64 sampled softmax with the logQ correction and accidental-hit masking."""
    query, items = query.double(), items.double()
    positive = (query * items[targets]).sum(1) - pos_log_q.double()
    negative = torch.einsum("qd,qmd->qm", query, items[neg_ids]) - neg_log_q.double()
    negative = negative.masked_fill(neg_ids == targets[:, None], -math.inf)
    return torch.cat([positive[:, None], negative], 1).logsumexp(1) - positive


def _tolerance(scale: float) -> float:
    """Losses are differences of scores of size ``scale**2``, of which float32 keeps about 7
    digits; the losses turn autocast off, so bf16 autocast must not lose more (bf16 products
    would be off by about 1e-2 * scale**2)."""
    return 1e-6 * max(1.0, scale**2)


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("scale", SCALES)
def test_softmax_losses_stay_finite_for_large_norms(scale, autocast):
    items = _rows_of_norm(N + 1, scale, 0).requires_grad_()
    query = _rows_of_norm(Q, scale, 1).requires_grad_()
    targets = torch.randint(1, N + 1, (Q,), generator=torch.Generator().manual_seed(2))
    sampler = UniformSampler(N, M)
    draws = torch.Generator().manual_seed(3)
    neg_ids, neg_log_q = sampler.sample(query.detach(), M, generator=draws)
    pos_log_q = sampler.log_prob(query.detach(), targets[:, None])[:, 0]

    exact = (query.double() @ items.double()[1:].T).logsumexp(1) - (
        query.double() * items.double()[targets]
    ).sum(1)
    sampled = _reference_sampled(query, items, targets, neg_ids, neg_log_q, pos_log_q)
    positives = torch.stack([targets, torch.zeros_like(targets)], 1)  # one positive, padded
    with _precision(autocast):
        losses = {
            "full": (full_softmax_loss(query, items, targets, chunk_size=64), exact),
            "sampled": (
                sampled_softmax_loss(query, items, targets, neg_ids, neg_log_q, pos_log_q),
                sampled,
            ),
            "multilabel": (
                multilabel_sampled_softmax_loss(
                    query,
                    items,
                    positives,
                    neg_ids,
                    neg_log_q,
                    torch.stack([pos_log_q, torch.full_like(pos_log_q, -math.inf)], 1),
                ),
                None,
            ),
        }
    for name, (loss, reference) in losses.items():
        assert loss.dtype == torch.float32, name
        assert bool(torch.isfinite(loss).all()), name
        grads = torch.autograd.grad(loss.sum(), [query, items])
        assert all(bool(torch.isfinite(grad).all()) for grad in grads), name
        if reference is not None:
            error = (loss.double() - reference).abs().max().item()
            assert error <= _tolerance(scale), (name, error)
