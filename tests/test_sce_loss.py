"""Scalable Cross-Entropy (loss=sce): buckets of queries and items, cross-entropy inside them."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_RUN, drawn_loss
from test_binary_losses import FEW_STEPS

from recsys_midx.app.experiment import train
from recsys_midx.heads import DotHead
from recsys_midx.losses import ScalableCrossEntropyLoss, bucketed_cross_entropy_loss
from recsys_midx.losses.sce import bucket_members


def _reference(query, item_emb, targets, rows, ids):
    """Per query: the largest over its buckets of -log(e^s_p / (e^s_p + sum e^s_i, i != p))."""
    losses = [None] * len(query)
    for bucket in range(rows.shape[0]):
        for row in rows[bucket].tolist():
            positive = query[row] @ item_emb[targets[row]]
            others = [query[row] @ item_emb[i] for i in ids[bucket].tolist() if i != targets[row]]
            denominator = torch.exp(positive) + sum(torch.exp(s) for s in others)
            value = torch.log(denominator) - positive
            losses[row] = value if losses[row] is None else torch.maximum(losses[row], value)
    return losses


def test_value_and_gradient_match_a_float64_derivation() -> None:
    torch.manual_seed(0)
    query = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    item_emb = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([1, 2, 3, 8, 5])
    # Query 4 is in no bucket; query 1 is in two; bucket 0 holds query 0's target.
    rows = torch.tensor([[0, 1], [1, 2], [3, 0]])
    ids = torch.tensor([[1, 4, 6], [2, 7, 8], [5, 6, 8]])
    loss, covered = bucketed_cross_entropy_loss(query, item_emb, targets, rows, ids)
    assert covered.tolist() == [True, True, True, True, False]
    expected = _reference(query, item_emb, targets, rows, ids)
    torch.testing.assert_close(loss[:4], torch.stack(expected[:4]))
    assert loss[4] == 0
    (grad_query, grad_items) = torch.autograd.grad(loss.sum(), [query, item_emb])
    (ref_query, ref_items) = torch.autograd.grad(torch.stack(expected[:4]).sum(), [query, item_emb])
    torch.testing.assert_close(grad_query, ref_query)
    torch.testing.assert_close(grad_items, ref_items)


def test_buckets_gather_the_highest_scoring_queries_and_items() -> None:
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    item_emb = torch.tensor([[0.0, 0.0], [0.0, 3.0], [1.0, 0.0], [5.0, 0.0]])
    rows, ids = bucket_members(query, item_emb, torch.tensor([[1.0, 0.0]]), 2, 2)
    assert rows.tolist() == [[2, 0]] and ids.tolist() == [[3, 2]]


def test_one_bucket_holding_everything_is_the_full_softmax() -> None:
    torch.manual_seed(0)
    query, item_emb = torch.randn(4, 3, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    targets = torch.tensor([1, 2, 3, 6])
    rows, ids = torch.arange(4)[None], torch.arange(1, 7)[None]
    loss, _ = bucketed_cross_entropy_loss(query, item_emb, targets, rows, ids)
    full = torch.nn.functional.cross_entropy(query @ item_emb[1:].T, targets - 1, reduction="none")
    torch.testing.assert_close(loss, full)


@pytest.mark.parametrize("mix_queries", [False, True])
def test_the_loss_averages_over_the_covered_queries(mix_queries: bool) -> None:
    torch.manual_seed(0)
    loss_fn = ScalableCrossEntropyLoss(4, 3, 5, mix_queries=mix_queries)
    output = DotHead()(torch.randn(6, 8, requires_grad=True))
    item_emb = torch.randn(21, 8, requires_grad=True)
    loss = drawn_loss(loss_fn, output, torch.arange(1, 7), item_emb)
    loss.backward()
    assert loss.isfinite() and item_emb.grad.abs().sum() > 0


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="bucket_items=0"):
        ScalableCrossEntropyLoss(bucket_items=0)


def test_debug_run_trains_and_tests(compose_config, tmp_path) -> None:
    cfg = compose_config(
        [
            *TINY_RUN,
            *FEW_STEPS,
            "loss=sce",
            "loss.num_buckets=8",
            "loss.bucket_queries=16",
            "loss.bucket_items=16",
        ]
    )
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["loss"]["_target_"].endswith("ScalableCrossEntropyLoss")
    # It draws its own candidates: loss=sce takes the whole catalog, and no sampler is built.
    assert saved["negatives"] == "none" and saved["sampler"]["sizing"] == {}
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())
