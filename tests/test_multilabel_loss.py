"""Tests of the multi-label softmax losses (exact, sampled, and the module on drawn negatives)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import drawn_loss
from torch import Tensor

from recsys_midx.heads import DotHead
from recsys_midx.losses import (
    MultiLabelSoftmaxLoss,
    full_softmax_loss,
    multilabel_full_softmax_loss,
    multilabel_sampled_softmax_loss,
)
from recsys_midx.samplers import InBatchSampler, UniformSampler

NUM_ITEMS = 40
DIM = 5
#: Positives of 5 points, 0-padded: several labels, one label, and a repeated layout.
POSITIVES = torch.tensor([[3, 7, 19], [40, 0, 0], [1, 2, 0], [5, 6, 7], [11, 0, 0]])


def _problem(dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Leaf query [Q, D] and leaf item table [N+1, D]."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(len(POSITIVES), DIM, generator=generator, dtype=dtype)
    item_emb = torch.randn(NUM_ITEMS + 1, DIM, generator=generator, dtype=dtype)
    return query.requires_grad_(), item_emb.requires_grad_()


def _reference(query: Tensor, item_emb: Tensor, positives: Tensor) -> Tensor:
    """Per (point, positive) pair in row-major order, the cross-entropy over items 1..N with the
    point's other positives left out."""
    rows, columns = (positives > 0).nonzero(as_tuple=True)
    targets = positives[rows, columns]
    logits = query[rows] @ item_emb.T
    others = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, positives[rows], True)
    others[:, 0] = True  # padding is never a label
    others[torch.arange(len(rows)), targets] = False
    return F.cross_entropy(logits.masked_fill(others, float("-inf")), targets, reduction="none")


def _whole_catalog(num_queries: int) -> tuple[Tensor, Tensor]:
    """Every item drawn once per query under the uniform proposal."""
    ids = torch.arange(1, NUM_ITEMS + 1).expand(num_queries, -1)
    return ids, torch.full(ids.shape, -math.log(NUM_ITEMS))


def _grads(loss: Tensor, *leaves: Tensor) -> list[Tensor]:
    return [loss.detach(), *torch.autograd.grad(loss.sum(), leaves)]


@pytest.mark.parametrize("chunk_size", [1, 7, 40, 1000])
def test_exact_loss_is_one_cross_entropy_per_positive_without_the_others(chunk_size: int) -> None:
    query, item_emb = _problem()
    loss = multilabel_full_softmax_loss(query, item_emb, POSITIVES, chunk_size)
    expected = _reference(query, item_emb, POSITIVES)
    for actual, wanted in zip(_grads(loss, query, item_emb), _grads(expected, query, item_emb)):
        torch.testing.assert_close(actual, wanted, rtol=1e-5, atol=1e-6)


def test_exact_loss_gradcheck() -> None:
    query, item_emb = _problem(torch.float64)
    assert torch.autograd.gradcheck(
        lambda q, v: multilabel_full_softmax_loss(q, v, POSITIVES, chunk_size=9), (query, item_emb)
    )


def test_single_positive_is_the_single_label_cross_entropy() -> None:
    query, item_emb = _problem()
    targets = POSITIVES[:, 0]
    loss = multilabel_full_softmax_loss(query, item_emb, targets[:, None], chunk_size=8)
    torch.testing.assert_close(loss, full_softmax_loss(query, item_emb, targets))


def test_exact_loss_stays_finite_when_other_positives_take_all_the_mass() -> None:
    item_emb = torch.zeros(NUM_ITEMS + 1, 2)
    item_emb[1] = torch.tensor([60.0, 0.0])  # label 1 dominates the softmax completely
    loss = multilabel_full_softmax_loss(torch.ones(1, 2), item_emb, torch.tensor([[1, 2]]))
    expected_2 = math.log(1 + (NUM_ITEMS - 2))  # label 2 against the 38 other zero scores
    assert loss.tolist() == pytest.approx(
        [math.log1p((NUM_ITEMS - 2) * math.exp(-60)), expected_2], rel=1e-5
    )


def test_whole_catalog_under_uniform_proposal_equals_exact_loss() -> None:
    query, item_emb = _problem()
    neg_ids, neg_log_q = _whole_catalog(len(POSITIVES))
    pos_log_q = torch.full(POSITIVES.shape, -math.log(NUM_ITEMS))
    sampled = multilabel_sampled_softmax_loss(
        query, item_emb, POSITIVES, neg_ids, neg_log_q, pos_log_q
    )
    exact = multilabel_full_softmax_loss(query, item_emb, POSITIVES)
    for actual, wanted in zip(_grads(sampled, query, item_emb), _grads(exact, query, item_emb)):
        torch.testing.assert_close(actual, wanted, rtol=1e-5, atol=1e-5)


def test_negatives_hitting_any_positive_are_masked() -> None:
    query, item_emb = _problem()
    positives = torch.tensor([[3, 7]]).expand(len(POSITIVES), -1)
    # Columns 1 and 3 hit the first and the second positive; 0 and 2 are true negatives.
    with_hits = torch.tensor([[12, 3, 25, 7]]).expand(len(POSITIVES), -1)
    log_q = torch.tensor([[-3.0, -3.5, -4.0, -4.5]]).expand(len(POSITIVES), -1)
    pos_log_q = torch.full(positives.shape, -2.0)
    keep = torch.tensor([0, 2])
    loss = multilabel_sampled_softmax_loss(query, item_emb, positives, with_hits, log_q, pos_log_q)
    without = multilabel_sampled_softmax_loss(
        query, item_emb, positives, with_hits[:, keep], log_q[:, keep], pos_log_q
    )
    torch.testing.assert_close(loss, without)
    # By hand: each positive competes with the two true negatives only.
    scores = query @ item_emb.T
    negatives = torch.stack([scores[:, 12] + 3.0, scores[:, 25] + 4.0], dim=1)
    expected = [
        torch.logsumexp(torch.cat([own[:, None], negatives], dim=1), dim=1) - own
        for own in (scores[:, 3] + 2.0, scores[:, 7] + 2.0)
    ]
    torch.testing.assert_close(loss, torch.stack(expected, dim=1).reshape(-1))


def test_padding_and_label_free_points_add_nothing() -> None:
    query, item_emb = _problem()
    padded = torch.cat([POSITIVES, torch.zeros(len(POSITIVES), 2, dtype=torch.long)], dim=1)
    with_empty_point = padded.clone()
    with_empty_point[2] = 0
    loss = multilabel_full_softmax_loss(query, item_emb, padded)
    torch.testing.assert_close(loss, multilabel_full_softmax_loss(query, item_emb, POSITIVES))
    rows = (with_empty_point > 0).sum(dim=1)
    assert len(multilabel_full_softmax_loss(query, item_emb, with_empty_point)) == int(rows.sum())
    (grad,) = torch.autograd.grad(loss.sum(), item_emb)
    assert torch.equal(grad[0], torch.zeros(DIM)), "padding row must get no gradient"


def test_sampled_loss_computes_bf16_in_float32() -> None:
    query, item_emb = _problem()
    neg_ids, neg_log_q = _whole_catalog(len(POSITIVES))
    loss = multilabel_sampled_softmax_loss(
        query.bfloat16(),
        item_emb.bfloat16(),
        POSITIVES,
        neg_ids,
        neg_log_q,
        torch.full(POSITIVES.shape, -math.log(NUM_ITEMS)),
    )
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all()


def test_losses_reject_bad_inputs() -> None:
    query, item_emb = _problem()
    neg_ids, neg_log_q = _whole_catalog(len(POSITIVES))
    pos_log_q = torch.zeros(POSITIVES.shape)
    with pytest.raises(ValueError, match="no label"):
        multilabel_full_softmax_loss(query, item_emb, torch.zeros_like(POSITIVES))
    with pytest.raises(ValueError, match="1..N"):
        multilabel_full_softmax_loss(query, item_emb, -POSITIVES)
    with pytest.raises(ValueError, match="1..40"):
        multilabel_full_softmax_loss(query, item_emb, POSITIVES + 1)
    with pytest.raises(ValueError, match="positives"):
        multilabel_full_softmax_loss(query, item_emb, POSITIVES[:2])
    with pytest.raises(ValueError, match="pos_log_q"):
        multilabel_sampled_softmax_loss(
            query, item_emb, POSITIVES, neg_ids, neg_log_q, pos_log_q[:, :1]
        )
    with pytest.raises(ValueError, match="neg_log_q"):
        multilabel_sampled_softmax_loss(
            query, item_emb, POSITIVES, neg_ids, neg_log_q[:, :3], pos_log_q
        )


# --- MultiLabelSoftmaxLoss --------------------------------------------------------------------


def test_module_on_the_whole_catalog_is_the_mean_exact_loss() -> None:
    query, item_emb = _problem()
    loss = drawn_loss(
        MultiLabelSoftmaxLoss(chunk_size=16),
        DotHead(temperature=0.5)(query),
        POSITIVES,
        item_emb,
        None,
    )
    torch.testing.assert_close(loss, _reference(query / 0.5, item_emb, POSITIVES).mean())


class _RecordingUniform(UniformSampler):
    """A uniform proposal that records the targets and queries it is shown."""

    def __init__(self) -> None:
        super().__init__(NUM_ITEMS, num_negatives=12)
        self.targets: list[Tensor] = []
        self.queries: list[Tensor] = []

    def observe_targets(self, targets: Tensor) -> None:
        self.targets.append(targets)

    def sample(
        self, query: Tensor, num_samples: int | None = None, **kwargs
    ) -> tuple[Tensor, Tensor]:
        self.queries.append(query)
        return super().sample(query, num_samples, **kwargs)


def test_module_shows_the_sampler_the_positives_and_the_scaled_query() -> None:
    query, item_emb = _problem()
    sampler = _RecordingUniform()
    loss = drawn_loss(
        MultiLabelSoftmaxLoss(), DotHead(temperature=0.25)(query), POSITIVES, item_emb, sampler
    )
    loss.backward()
    (observed,) = sampler.targets
    assert sorted(observed.tolist()) == sorted(POSITIVES[POSITIVES > 0].tolist())
    (seen,) = sampler.queries
    assert seen.dtype == torch.float32 and not seen.requires_grad
    torch.testing.assert_close(seen, query.detach() / 0.25)
    for grad in (query.grad, item_emb.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_module_works_with_in_batch_negatives() -> None:
    query, item_emb = _problem()
    loss = drawn_loss(
        MultiLabelSoftmaxLoss(), DotHead()(query), POSITIVES, item_emb, InBatchSampler(NUM_ITEMS, 8)
    )
    assert loss.shape == () and torch.isfinite(loss)


def test_gradients_stay_finite_when_every_competitor_is_masked() -> None:
    query, item_emb = _problem()
    positives = torch.tensor([[2, 5]])  # one point: the batch's labels are all its own
    exact = multilabel_full_softmax_loss(query[:1], item_emb, positives)
    hits_only = torch.tensor([[5, 2, 2]])  # every negative hits a positive
    sampled = multilabel_sampled_softmax_loss(
        query[:1], item_emb, positives, hits_only, torch.zeros(1, 3), torch.zeros(1, 2)
    )
    assert sampled.tolist() == [0.0, 0.0]
    for loss in (exact, sampled):
        grads = torch.autograd.grad(loss.sum(), (query, item_emb), allow_unused=True)
        assert all(g is None or torch.isfinite(g).all() for g in grads)
