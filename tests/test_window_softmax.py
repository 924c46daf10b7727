"""Negatives per training sequence, outside it, shared by its positions (loss=window_softmax)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_RUN
from test_binary_losses import FEW_STEPS

from recsys_midx.app.experiment import train
from recsys_midx.app.preflight import check_loss_negatives
from recsys_midx.errors import ConfigError
from recsys_midx.losses import draw_outside_windows, window_softmax_loss


def test_draws_are_distinct_and_outside_the_window() -> None:
    torch.manual_seed(0)
    windows = torch.tensor([[0, 0, 3, 5, 7], [1, 2, 3, 4, 5]])
    ids, valid = draw_outside_windows(windows, 12, 6)
    assert valid.all()
    for row, window in zip(ids.tolist(), windows.tolist()):
        assert len(set(row)) == 6 and not set(row) & set(window) and all(1 <= i <= 12 for i in row)


def test_every_item_outside_the_window_is_drawn_equally_often() -> None:
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(9)
    for _ in range(2000):
        ids, _ = draw_outside_windows(torch.tensor([[1, 2]]), 8, 3, generator)
        counts += torch.bincount(ids[0], minlength=9)
    # Six items left, three drawn each time: each is drawn in half of the draws.
    assert counts[:3].tolist() == [0, 0, 0]
    assert ((counts[3:] / 2000 - 0.5).abs() < 0.05).all()


def test_too_few_items_left_marks_the_extra_draws_invalid() -> None:
    ids, valid = draw_outside_windows(torch.tensor([[1, 2, 3]]), 5, 4)
    assert valid.sum() == 2 and set(ids[0][valid[0]].tolist()) == {4, 5}


def test_value_and_gradient_match_a_float64_derivation() -> None:
    torch.manual_seed(0)
    query = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    item_emb = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([2, 3, 6, 7])
    positions = torch.tensor([[False, True, True], [True, True, False]])
    neg_ids = torch.tensor([[5, 7], [1, 8]])
    valid = torch.tensor([[True, True], [True, False]])
    sequence_of = [0, 0, 1, 1]
    loss = window_softmax_loss(query, item_emb, targets, positions, neg_ids, valid)
    expected, grad = [], torch.zeros_like(query)
    for row, sequence in enumerate(sequence_of):
        z = query[row].detach()
        candidates = [targets[row].item()] + [
            i for i, ok in zip(neg_ids[sequence].tolist(), valid[sequence].tolist()) if ok
        ]
        rows = item_emb.detach()[candidates]
        probs = torch.softmax(rows @ z, dim=0)
        expected.append(-torch.log(probs[0]))
        grad[row] = probs @ rows - rows[0]
    torch.testing.assert_close(loss, torch.stack(expected))
    loss.sum().backward()
    torch.testing.assert_close(query.grad, grad)


def test_table_gradient_matches_autograd_through_the_scores() -> None:
    torch.manual_seed(1)
    query = torch.randn(5, 4, dtype=torch.float64)
    item_emb = torch.randn(12, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([2, 3, 6, 7, 9])
    positions = torch.tensor([[True, True, False], [False, True, True], [False, False, True]])
    neg_ids = torch.tensor([[5, 7, 1], [1, 8, 8], [4, 10, 11]])
    # The last sequence has no valid negative left: its query's loss is 0 with no gradient.
    valid = torch.tensor([[True, True, True], [True, False, True], [False, False, False]])
    loss = window_softmax_loss(query, item_emb, targets, positions, neg_ids, valid)
    weights = torch.rand(5, dtype=torch.float64)
    (loss * weights).sum().backward()
    reference = item_emb.detach().clone().requires_grad_(True)
    sequence_of = positions.nonzero()[:, 0]
    scores = (query[:, None, :] * reference[neg_ids[sequence_of]]).sum(-1)
    scores = scores.masked_fill(~valid[sequence_of], float("-inf"))
    positive = (query * reference[targets]).sum(-1, keepdim=True)
    expected = torch.logsumexp(torch.cat([positive, scores], dim=1), dim=1) - positive[:, 0]
    (expected * weights).sum().backward()
    torch.testing.assert_close(loss, expected.detach())
    assert loss[-1] == 0
    torch.testing.assert_close(item_emb.grad, reference.grad)


def test_sampler_full_and_task_xc_are_refused(compose_config) -> None:
    with pytest.raises(ConfigError, match=r"^loss=window_softmax trains on sampled negatives"):
        check_loss_negatives(compose_config(["loss=window_softmax", "sampler=full"]))
    with pytest.raises(ConfigError, match=r"^loss=window_softmax draws per training sequence"):
        check_loss_negatives(compose_config(["task=xc", "loss=window_softmax"]))


@pytest.mark.parametrize("train_samples", ["last_window", "prefixes"])
def test_debug_run_trains_and_tests(compose_config, tmp_path, train_samples: str) -> None:
    cfg = compose_config(
        [
            *TINY_RUN,
            *FEW_STEPS,
            "loss=window_softmax",
            "sampler=uniform",
            "sampler.num_negatives=20",
            f"task.datamodule.train_samples={train_samples}",
        ]
    )
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["loss"]["_target_"].endswith("WindowSoftmaxLoss")
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())
