"""Negatives outside each query's training sequence (negatives.exclude_window)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import FEW_STEPS, TINY_RUN, drawn_loss

from recsys_midx.app.experiment import train
from recsys_midx.app.preflight import check_negatives
from recsys_midx.errors import ConfigError
from recsys_midx.heads import DotHead
from recsys_midx.losses import (
    BCELoss,
    SoftmaxLoss,
    binary_cross_entropy_loss,
    full_softmax_loss_outside_windows,
    head_sampled_softmax_loss,
    sampled_softmax_loss,
)
from recsys_midx.negatives import (
    Negatives,
    NoNegatives,
    PerQuery,
    QueryBatch,
    SequenceWindows,
    SharedByBatch,
    draw_negatives,
    window_hits,
)
from recsys_midx.samplers import PopularitySampler, UniformSampler

NUM_ITEMS = 9

# Two sequences with padding and a repeated item; five queries, their targets in their sequence
# (the last query's target 4 appears twice in its sequence).
WINDOWS = torch.tensor([[0, 0, 2, 5, 3, 5], [4, 1, 4, 8, 6, 4]])
POSITIONS = torch.tensor([[False, True, True], [True, True, True]])
TARGETS = torch.tensor([5, 3, 4, 8, 4])
SEQUENCE_OF = [0, 0, 1, 1, 1]


def _window_items(query: int) -> set[int]:
    return set(WINDOWS[SEQUENCE_OF[query]].tolist()) - {0}


def _case() -> tuple[torch.Tensor, torch.Tensor, SequenceWindows]:
    torch.manual_seed(0)
    query = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    item_emb = torch.randn(NUM_ITEMS + 1, 3, dtype=torch.float64, requires_grad=True)
    return query, item_emb, SequenceWindows.of_batch(WINDOWS, POSITIONS)


def _reference_loss(query: torch.Tensor, item_emb: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over each target and the items outside its sequence, term by term."""
    losses = []
    for row, target in enumerate(TARGETS.tolist()):
        kept = [target] + [i for i in range(1, NUM_ITEMS + 1) if i not in _window_items(row)]
        scores = item_emb[kept] @ query[row]
        losses.append(torch.logsumexp(scores, dim=0) - scores[0])
    return torch.stack(losses)


@pytest.mark.parametrize("shared", [False, True])
def test_window_hits_are_the_negatives_in_the_query_sequence(shared: bool) -> None:
    _, _, sequences = _case()
    generator = torch.Generator().manual_seed(3)
    shape = (6,) if shared else (5, 6)
    neg_ids = torch.randint(1, NUM_ITEMS + 1, shape, generator=generator)
    hits = window_hits(neg_ids, sequences)
    per_query = neg_ids.expand(5, -1) if shared else neg_ids
    expected = [[i in _window_items(q) for i in row] for q, row in enumerate(per_query.tolist())]
    assert hits.tolist() == expected


def test_exact_loss_and_gradients_match_a_float64_derivation() -> None:
    query, item_emb, sequences = _case()
    loss = full_softmax_loss_outside_windows(query, item_emb, TARGETS, sequences, chunk_size=4)
    weights = torch.rand(5, dtype=torch.float64)
    (loss * weights).sum().backward()
    reference_query = query.detach().clone().requires_grad_(True)
    reference_table = item_emb.detach().clone().requires_grad_(True)
    reference = _reference_loss(reference_query, reference_table)
    (reference * weights).sum().backward()
    torch.testing.assert_close(loss, reference.detach())
    torch.testing.assert_close(query.grad, reference_query.grad)
    torch.testing.assert_close(item_emb.grad, reference_table.grad)


def test_a_sequence_of_one_repeated_item_leaves_the_catalog_whole() -> None:
    query, item_emb, _ = _case()
    sequences = SequenceWindows.of_batch(torch.tensor([[3, 3, 3]]), torch.tensor([[True]]))
    loss = full_softmax_loss_outside_windows(query[:1], item_emb, torch.tensor([3]), sequences)
    scores = item_emb[1:] @ query[0]
    torch.testing.assert_close(loss[0], torch.logsumexp(scores, 0) - scores[2])
    loss.sum().backward()
    assert torch.isfinite(query.grad).all() and torch.isfinite(item_emb.grad).all()


def test_sampled_loss_over_the_whole_catalog_is_the_exact_one() -> None:
    query, item_emb, sequences = _case()
    neg_ids = torch.arange(1, NUM_ITEMS + 1).expand(5, -1)
    log_q = torch.full((5, NUM_ITEMS), -math.log(NUM_ITEMS), dtype=torch.float64)
    excluded = window_hits(neg_ids, sequences)
    loss = sampled_softmax_loss(query, item_emb, TARGETS, neg_ids, log_q, log_q[:, 0], excluded)
    torch.testing.assert_close(loss, _reference_loss(query, item_emb))
    # A head's sampled loss with one query and no transform masks the same negatives.
    head_loss = head_sampled_softmax_loss(
        query, None, item_emb, TARGETS, neg_ids, log_q, log_q[:, 0], lambda s: s, excluded
    )
    torch.testing.assert_close(head_loss, loss)


def test_masked_draws_estimate_the_mass_outside_the_window_without_bias() -> None:
    # Popularity draws (q far from uniform) with the positive counted exactly: the sampled loss is
    # log(exp(s_t) + Z_hat) - s_t, where Z_hat estimates the mass of the items outside the
    # query's sequence. The window's items score highest, so leaving one of them in (or a wrong
    # log q) moves the mean of Z_hat by many standard errors.
    torch.manual_seed(0)
    item_emb = torch.randn(NUM_ITEMS + 1, 3, dtype=torch.float64)
    query = item_emb[[2, 3, 4, 8, 6]].clone() * 2.0
    sequences = SequenceWindows.of_batch(WINDOWS, POSITIONS)
    sampler = PopularitySampler(NUM_ITEMS, num_negatives=4, alpha=1.0)
    sampler.update(item_emb.float(), torch.arange(NUM_ITEMS + 1) % 4 + 1)
    target_scores = (query * item_emb[TARGETS]).sum(dim=1)
    estimates = []
    for _ in range(4000):
        drawn = draw_negatives(sampler, query.float(), TARGETS, exact_positives=True)
        loss = sampled_softmax_loss(
            query,
            item_emb,
            TARGETS,
            drawn.ids,
            drawn.log_q.double(),
            drawn.positive_log_q.double(),
            window_hits(drawn.ids, sequences),
        )
        estimates.append((loss + target_scores).exp() - target_scores.exp())
    estimates = torch.stack(estimates)
    scores = query @ item_emb[1:].T
    outside = torch.tensor(
        [[i not in _window_items(q) for i in range(1, NUM_ITEMS + 1)] for q in range(5)]
    )
    expected = (scores.exp() * outside).sum(dim=1)
    standard_error = estimates.std(dim=0) / math.sqrt(len(estimates))
    assert ((estimates.mean(dim=0) - expected).abs() < 4 * standard_error).all()


def test_bce_leaves_the_window_negatives_out() -> None:
    query, item_emb, sequences = _case()
    neg_ids = torch.tensor([[1, 2, 3], [2, 7, 5], [1, 9, 6], [4, 4, 2], [1, 3, 5]])
    excluded = window_hits(neg_ids, sequences)
    loss = binary_cross_entropy_loss(query, item_emb, TARGETS, neg_ids, 0.5, excluded)
    for row, target in enumerate(TARGETS.tolist()):
        kept = [i for i in neg_ids[row].tolist() if i not in _window_items(row)]
        positive = torch.nn.functional.softplus(-(query[row] @ item_emb[target]))
        negative = torch.nn.functional.softplus(item_emb[kept] @ query[row]).sum()
        torch.testing.assert_close(loss[row], 0.5 * positive + negative)


@pytest.mark.parametrize(
    ("loss_fn", "strategy"),
    [
        (SoftmaxLoss(), PerQuery(exclude_window=True)),
        (BCELoss(), SharedByBatch(exclude_window=True)),
        (SoftmaxLoss(), NoNegatives(exclude_window=True)),
    ],
)
def test_a_draw_without_the_sequences_is_refused(loss_fn, strategy) -> None:
    assert strategy.needs_windows and not PerQuery().needs_windows
    output, sampler = DotHead()(torch.randn(2, 4)), UniformSampler(4, 2)
    with pytest.raises(ValueError, match="negatives.exclude_window=true needs each batch's"):
        drawn_loss(loss_fn, output, torch.tensor([1, 2]), torch.randn(5, 4), sampler, strategy)


@pytest.mark.parametrize(
    "strategy", [PerQuery(exclude_window=True), SharedByBatch(exclude_window=True)]
)
def test_strategies_mark_the_drawn_ids_in_each_query_window(strategy) -> None:
    query, _, sequences = _case()
    batch = QueryBatch(query.detach().float(), TARGETS, WINDOWS, POSITIONS, NUM_ITEMS)
    drawn = strategy(batch, UniformSampler(NUM_ITEMS, 6))
    assert torch.equal(drawn.excluded, window_hits(drawn.ids, sequences))
    assert torch.equal(drawn.sequences.rows, sequences.rows)


def test_exact_loss_of_a_transforming_head_is_refused() -> None:
    query = torch.randn(1, 3)
    output = DotHead()(query)._replace(transform=torch.tanh)
    negatives = Negatives(
        "catalog",
        sequences=SequenceWindows.of_batch(torch.tensor([[2, 3]]), torch.tensor([[True]])),
    )
    with pytest.raises(ValueError, match="takes only the plain dot product"):
        SoftmaxLoss()(output, torch.tensor([3]), torch.randn(5, 3), negatives)


def test_task_xc_and_an_exact_mixture_head_are_refused(compose_config) -> None:
    with pytest.raises(ConfigError, match=r"^negatives.exclude_window=true reads each batch's"):
        check_negatives(compose_config(["task=xc", "negatives.exclude_window=true"]))
    with pytest.raises(ConfigError, match=r"^negatives.exclude_window=true takes only head=dot"):
        check_negatives(
            compose_config(["negatives.exclude_window=true", "sampler=full", "head=mos"])
        )
    check_negatives(compose_config(["negatives.exclude_window=true", "sampler=full"]))


@pytest.mark.parametrize(
    "overrides",
    [
        ["sampler=full"],
        ["sampler=uniform", "sampler.num_negatives=8", "negatives=shared"],
        ["loss=bce", "sampler=uniform", "sampler.num_negatives=2"],
    ],
)
def test_debug_run_trains_and_tests(compose_config, tmp_path, overrides: list[str]) -> None:
    cfg = compose_config([*TINY_RUN, *FEW_STEPS, *overrides, "negatives.exclude_window=true"])
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["negatives"]["exclude_window"] is True
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())


@pytest.mark.parametrize("chunk_size", [3, 32768], ids=["chunks", "one-block"])
def test_exact_loss_matches_the_derivation_in_chunks_and_in_one_block(chunk_size: int) -> None:
    query, item_emb, sequences = _case()
    loss = full_softmax_loss_outside_windows(query, item_emb, TARGETS, sequences, chunk_size)
    torch.testing.assert_close(loss, _reference_loss(query, item_emb).detach())
    grads = torch.autograd.grad(loss.sum(), (query, item_emb))
    reference = torch.autograd.grad(_reference_loss(query, item_emb).sum(), (query, item_emb))
    for got, expected in zip(grads, reference):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("chunk_size", [2, 32768], ids=["chunks", "one-block"])
def test_a_window_holding_the_whole_catalog_leaves_the_target_alone(chunk_size: int) -> None:
    query, item_emb, _ = _case()
    everything = torch.arange(1, NUM_ITEMS + 1)[None]
    sequences = SequenceWindows.of_batch(everything, torch.tensor([[True]]))
    loss = full_softmax_loss_outside_windows(
        query[:1], item_emb, torch.tensor([4]), sequences, chunk_size
    )
    assert loss.tolist() == [0.0]
    grads = torch.autograd.grad(loss.sum(), (query, item_emb))
    assert all(torch.isfinite(grad).all() and not grad.any() for grad in grads)
