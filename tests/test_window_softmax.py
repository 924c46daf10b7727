"""Negatives per training sequence, shared by its positions: drawn outside it
(``negatives=outside_window``) or from the proposal (``negatives=per_sequence``), and the softmax
that scores each position against its sequence's (:func:`window_softmax_loss`)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import TINY_RUN, drawn_loss
from goodness_of_fit import chi_square_pvalue
from test_binary_losses import FEW_STEPS

from recsys_midx.app.experiment import train
from recsys_midx.app.preflight import check_negatives
from recsys_midx.errors import ConfigError
from recsys_midx.heads import DotHead
from recsys_midx.losses import SoftmaxLoss, window_softmax_loss
from recsys_midx.negatives import (
    OutsideWindow,
    PerSequence,
    SequenceWindows,
    draw_from_proposal,
    draw_outside_windows,
    merge_repeated_draws,
)
from recsys_midx.samplers import MIDXSampler


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


@pytest.mark.parametrize("weighted", [False, True])
def test_value_and_gradient_match_a_float64_derivation(weighted: bool) -> None:
    torch.manual_seed(0)
    query = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    item_emb = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([2, 3, 6, 7])
    positions = torch.tensor([[False, True, True], [True, True, False]])
    neg_ids = torch.tensor([[5, 7], [1, 8]])
    valid = torch.tensor([[True, True], [True, False]])
    log_weights = torch.tensor([[0.5, -1.0], [2.0, 0.3]], dtype=torch.float64)
    sequence_of = [0, 0, 1, 1]
    loss = window_softmax_loss(
        query, item_emb, targets, positions, neg_ids, valid, log_weights if weighted else None
    )
    expected, grad = [], torch.zeros_like(query)
    for row, sequence in enumerate(sequence_of):
        z = query[row].detach()
        kept = [m for m, ok in enumerate(valid[sequence].tolist()) if ok]
        candidates = [targets[row].item()] + neg_ids[sequence, kept].tolist()
        offsets = torch.zeros(len(candidates), dtype=torch.float64)
        if weighted:
            offsets[1:] = log_weights[sequence, kept]
        rows = item_emb.detach()[candidates]
        probs = torch.softmax(rows @ z + offsets, dim=0)
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


# negatives=per_sequence: two sequences of a 40-item catalog, one with padding; MIDX's proposal
# depends on the query, so drawing at the wrong query or weighting by the wrong q shows.
NUM_ITEMS = 40
WINDOWS = torch.tensor([[0, 0, 3, 9, 14, 9], [5, 1, 22, 31, 6, 2]])
POSITIONS = torch.tensor([[False, True, True], [True, True, True]])
TARGETS = torch.tensor([14, 9, 31, 6, 2])
SEQUENCE_OF = [0, 0, 1, 1, 1]


def _midx_case() -> tuple[MIDXSampler, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    item_emb = torch.randn(NUM_ITEMS + 1, 4, generator=generator)
    sampler = MIDXSampler(NUM_ITEMS, 30, num_codewords=4)
    sampler.update(item_emb)
    query = 1.5 * torch.randn(len(TARGETS), 4, generator=generator)
    return sampler, item_emb, query


def test_proposal_draws_follow_the_proposal_at_the_sequence_mean_query() -> None:
    sampler, _, query = _midx_case()
    sequences = SequenceWindows.of_batch(WINDOWS, POSITIONS)
    generator = torch.Generator().manual_seed(0)
    draws = [draw_from_proposal(sampler, query, TARGETS, sequences, generator) for _ in range(300)]
    ids = torch.cat([d[0] for d in draws], dim=1)
    catalog = torch.arange(1, NUM_ITEMS + 1).expand(2, -1)
    mean_query = torch.stack([query[:2].mean(0), query[2:].mean(0)])
    probs = sampler.log_prob(mean_query, catalog).exp()
    assert chi_square_pvalue(ids, probs) > 1e-3
    # The test has the power to tell the mean query from one position's.
    last_query = query[[1, 4]]
    assert chi_square_pvalue(ids, sampler.log_prob(last_query, catalog).exp()) < 1e-6
    ids, log_weights, valid = draws[0]
    drawn_log_q = sampler.log_prob(mean_query, ids)
    torch.testing.assert_close(log_weights, -(drawn_log_q + math.log(30)))
    in_window = [[i in WINDOWS[b].tolist() for i in row] for b, row in enumerate(ids.tolist())]
    assert valid.tolist() == [[not hit for hit in row] for row in in_window]


def test_weighted_draws_estimate_the_mass_outside_the_sequence_without_bias() -> None:
    # loss = log(exp(s_t) + Z_hat) - s_t: Z_hat must average to the mass of the items outside
    # the query's sequence. The window's items are given the highest scores, so counting them
    # (or weighting by q without M, or by another query's q) moves the mean by many errors.
    sampler, item_emb, query = _midx_case()
    query, item_emb = 0.5 * query, item_emb.double()  # milder scores: a lighter-tailed estimate
    for row, sequence in enumerate(SEQUENCE_OF):
        item_emb[WINDOWS[sequence][WINDOWS[sequence] > 0]] += 0.5 * query[row].double()
    sequences = SequenceWindows.of_batch(WINDOWS, POSITIONS)
    query = query.double()
    target_scores = (query * item_emb[TARGETS]).sum(dim=1)
    generator = torch.Generator().manual_seed(1)
    estimates = []
    for _ in range(3000):
        ids, log_weights, valid = draw_from_proposal(sampler, query, TARGETS, sequences, generator)
        loss = window_softmax_loss(
            query, item_emb, TARGETS, POSITIONS, ids, valid, log_weights.double()
        )
        estimates.append((loss + target_scores).exp() - target_scores.exp())
    estimates = torch.stack(estimates)
    outside = torch.tensor(
        [[i not in WINDOWS[s].tolist() for i in range(1, NUM_ITEMS + 1)] for s in SEQUENCE_OF]
    )
    expected = ((query @ item_emb[1:].T).exp() * outside).sum(dim=1)
    standard_error = estimates.std(dim=0) / math.sqrt(len(estimates))
    assert ((estimates.mean(dim=0) - expected).abs() < 4 * standard_error).all()
    assert (standard_error < 0.05 * expected).all()  # precise enough for the check to bite


def test_merged_draws_give_the_loss_and_gradients_of_every_draw() -> None:
    # 30 draws from 40 items at a confident query: repeats, and draws inside the windows.
    sampler, item_emb, query = _midx_case()
    sequences = SequenceWindows.of_batch(WINDOWS, POSITIONS)
    draws = draw_from_proposal(sampler, query, TARGETS, sequences, torch.Generator().manual_seed(2))
    ids, log_weights, valid = merge_repeated_draws(*draws)
    for row in range(len(WINDOWS)):
        kept = ids[row][valid[row]].tolist()
        assert kept == sorted(set(draws[0][row][draws[2][row]].tolist()))
        assert not set(kept) & set(WINDOWS[row].tolist())
    assert ids.shape[1] < draws[0].shape[1]  # the repeats were scored once
    losses, gradients = [], []
    for negatives in (draws, (ids, log_weights, valid)):
        table = item_emb.double().requires_grad_(True)
        scaled = query.double().requires_grad_(True)
        neg_ids, neg_log_weights, neg_valid = negatives
        loss = window_softmax_loss(
            scaled, table, TARGETS, POSITIONS, neg_ids, neg_valid, neg_log_weights.double()
        )
        loss.sum().backward()
        losses.append(loss.detach())
        gradients.append((scaled.grad, table.grad))
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(gradients[0], gradients[1])


def test_merging_keeps_a_sequence_without_valid_draws_empty() -> None:
    ids, log_weights, valid = merge_repeated_draws(
        torch.tensor([[4, 4], [7, 2]]),
        torch.zeros(2, 2),
        torch.tensor([[False, False], [True, False]]),
    )
    assert ids.tolist() == [[0], [7]] and valid.tolist() == [[False], [True]]
    ids, _, valid = merge_repeated_draws(
        torch.tensor([[4]]), torch.zeros(1, 1), torch.tensor([[False]])
    )
    assert ids.shape == (1, 1) and not valid.any()


@pytest.mark.parametrize("strategy", [PerSequence(), OutsideWindow(30)])
def test_per_sequence_negatives_train_the_table_through_their_draws(strategy) -> None:
    sampler, item_emb, query = _midx_case()
    item_emb.requires_grad_(True)
    loss = drawn_loss(
        SoftmaxLoss(), DotHead()(query), TARGETS, item_emb, sampler, strategy, WINDOWS, POSITIONS
    )
    loss.backward()
    assert torch.isfinite(loss) and item_emb.grad[TARGETS].abs().sum() > 0


def test_the_softmax_scores_per_sequence_negatives_as_window_softmax_loss() -> None:
    sampler, item_emb, query = _midx_case()
    batch_args = (DotHead()(query), TARGETS, item_emb, sampler, PerSequence(), WINDOWS, POSITIONS)
    torch.manual_seed(5)
    loss = drawn_loss(SoftmaxLoss(), *batch_args)
    torch.manual_seed(5)
    sequences = SequenceWindows.of_batch(WINDOWS, POSITIONS)
    ids, log_weights, valid = merge_repeated_draws(
        *draw_from_proposal(sampler, query, TARGETS, sequences)
    )
    expected = window_softmax_loss(query, item_emb, TARGETS, POSITIONS, ids, valid, log_weights)
    assert torch.equal(loss, expected.mean())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["negatives=per_sequence", "sampler=full"],
            r"^negatives=per_sequence draws from a sampler and sampler=full has none",
        ),
        (
            ["negatives=outside_window", "task=xc"],
            r"^negatives=outside_window reads each batch's training sequences: it needs "
            r"task=seqrec",
        ),
        (
            ["negatives=outside_window", "sampler=midx"],
            r"^negatives=outside_window draws uniformly .* uses no sampler=midx: set "
            r"negatives=per_sequence",
        ),
        (
            ["negatives=per_sequence", "head=plif"],
            r"^negatives=per_sequence takes only head=dot or head=moe",
        ),
        (
            ["negatives=per_sequence", "loss=bce"],
            r"^loss=bce does not score negatives=per_sequence",
        ),
    ],
)
def test_settings_that_cannot_train_are_refused(
    compose_config, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_negatives(compose_config(overrides))


def test_uniform_outside_and_midx_proposal_pass(compose_config) -> None:
    check_negatives(compose_config(["negatives=outside_window", "sampler=uniform"]))
    check_negatives(compose_config(["negatives=per_sequence", "sampler=midx"]))


@pytest.mark.parametrize(
    ("train_samples", "draw"),
    [
        ("last_window", ["negatives=outside_window", "sampler=uniform"]),
        ("prefixes", ["negatives=outside_window", "sampler=uniform"]),
        ("last_window", ["negatives=per_sequence", "sampler=midx"]),
    ],
)
def test_debug_run_trains_and_tests(
    compose_config, tmp_path, train_samples: str, draw: list[str]
) -> None:
    cfg = compose_config(
        [
            *TINY_RUN,
            *FEW_STEPS,
            *draw,
            "sampler.num_negatives=20",
            f"task.datamodule.train_samples={train_samples}",
        ]
    )
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["negatives"] == draw[0].removeprefix("negatives=")
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())
