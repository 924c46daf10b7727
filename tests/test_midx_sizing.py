"""MIDX's exact top cells sized from the catalog, and the loss that follows the sampler's choice
of how to count the positive."""

from __future__ import annotations

import pytest
import torch

from recsys_midx.negatives import PerQuery, SharedByBatch
from recsys_midx.samplers import MIDXSampler, UniformSampler
from recsys_midx.samplers.exact_top import top_codewords_for_budget


@pytest.mark.parametrize(
    ("num_items", "expected"),
    [(3_706, 31), (100_000, 6), (1_000_000, 1), (3_686_400, 1), (3_686_401, 0)],
)
def test_budget_gives_the_largest_t_whose_cells_hold_at_most_the_budget(num_items, expected):
    top = top_codewords_for_budget(900, num_items, 64, 2)

    assert top == expected
    assert top**2 * num_items / 64**2 <= 900 < (top + 1) ** 2 * num_items / 64**2


def test_budget_of_half_the_catalog_or_more_leaves_the_top_cells_off():
    # ml-100k's 1,682 items: the top cells would hold most of the catalog.
    assert top_codewords_for_budget(900, 1_682, 64, 2) == 0
    assert top_codewords_for_budget(900, 1_800, 64, 2) == 0
    assert top_codewords_for_budget(0, 100, 8, 2) == 0


def _scored_per_query(num_items: int) -> float:
    return top_codewords_for_budget(900, num_items, 64, 2) ** 2 * num_items / 64**2


def test_items_scored_per_query_grow_with_the_catalog_without_a_jump():
    sizes = range(1_700, 4_001)
    scored = [_scored_per_query(n) for n in sizes]
    # Just past twice the budget the top cells hold under one item, not half the catalog.
    assert _scored_per_query(1_800) == 0 and 0 < _scored_per_query(1_801) < 1
    assert [top_codewords_for_budget(900, n, 64, 2) for n in (1_801, 1_900, 2_500, 3_600)] == [
        1,
        10,
        23,
        32,
    ]
    # Neighbouring catalogs differ by at most one t step, under 2% of these catalogs, and the
    # scored share stays within a quarter of the catalog and the budget.
    assert max(abs(b - a) for a, b in zip(scored, scored[1:])) < 64
    assert all(s <= min(900, n / 4) for s, n in zip(scored, sizes))
    # From four times the budget the whole budget is used.
    assert _scored_per_query(3_600) == 900


def test_negative_budgets_are_refused():
    with pytest.raises(ValueError, match="budget must be >= 0"):
        top_codewords_for_budget(-1, 100, 8, 2)


def test_sampler_sizes_its_top_cells_from_the_catalog_unless_told():
    # Sized by default, as sampler=midx configures it.
    sized = MIDXSampler(2_000, 10, num_codewords=16, exact_top_items=200)
    # t**2 * 2000 / 256 <= 200 gives t = 5 (25 cells, ~195 items).
    assert sized.sizing() == {"num_codewords": 16, "num_codebooks": 2, "exact_top_codewords": 5}
    assert sized.exact_top is not None and sized.exact_top.top_codewords == 5
    assert sized.prefers_exact_positives

    explicit = MIDXSampler(2_000, 10, num_codewords=16, exact_top_codewords=2, exact_top_items=200)
    assert explicit.exact_top_codewords == 2 and explicit.prefers_exact_positives
    off = MIDXSampler(2_000, 10, num_codewords=16, exact_top_codewords=None, exact_top_items=0)
    assert off.exact_top is None and not off.prefers_exact_positives
    assert off.sizing()["exact_top_codewords"] == 0
    with pytest.raises(ValueError, match="exact_top_items=-5: it must be >= 0"):
        MIDXSampler(2_000, 10, num_codewords=16, exact_top_codewords=None, exact_top_items=-5)


def test_sized_proposal_draws_follow_its_log_q():
    catalog = torch.randn(2_001, 8, generator=torch.Generator().manual_seed(0))
    sampler = MIDXSampler(
        2_000, 10, num_codewords=16, exact_top_codewords=None, exact_top_items=200
    )
    sampler.update(catalog)
    query = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    ids, log_q = sampler.sample(query, 50, generator=torch.Generator().manual_seed(2))

    torch.testing.assert_close(sampler.log_prob(query, ids), log_q)
    total = sampler.catalog_log_prob(query).double().exp().sum(1)
    torch.testing.assert_close(total, torch.ones(3, dtype=torch.float64), atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy_class", [PerQuery, SharedByBatch])
def test_strategy_left_to_choose_counts_positives_as_the_sampler_prefers(strategy_class):
    with_top = MIDXSampler(2_000, 10, num_codewords=16, exact_top_codewords=3)
    without_top = MIDXSampler(2_000, 10, num_codewords=16, exact_top_codewords=0)

    assert strategy_class().counts_positives_exactly(with_top)
    assert not strategy_class().counts_positives_exactly(without_top)
    assert not strategy_class().counts_positives_exactly(UniformSampler(2_000, 10))
    assert not strategy_class(correct_positive=True).counts_positives_exactly(with_top)
    uniform = UniformSampler(2_000, 10)
    assert strategy_class(correct_positive=False).counts_positives_exactly(uniform)


def test_configured_midx_is_sized_from_the_catalog(compose_config):
    from hydra.utils import instantiate

    cfg = compose_config(["sampler=midx"])
    assert cfg.sampler.exact_top_codewords is None and cfg.negatives.correct_positive is None
    sampler = instantiate(cfg.sampler, num_items=100_000)

    assert sampler.exact_top_codewords == 6
    assert instantiate(cfg.negatives).counts_positives_exactly(sampler)
    assert (
        instantiate(compose_config(["sampler=midx_exact"]).sampler, num_items=1_000).exact_top
        is None
    )


@pytest.mark.parametrize("items_per_query", [0, 3, 400])
def test_top_cell_scores_are_the_dot_products_at_each_querys_positions(items_per_query):
    from recsys_midx.samplers.exact_top import _scores_at

    generator = torch.Generator().manual_seed(0)
    table = torch.randn(500, 8, generator=generator)
    z = torch.randn(4, 8, generator=generator)
    positions = torch.cat(
        [torch.randperm(500, generator=generator)[:items_per_query].sort().values for _ in range(4)]
    )
    per_query = torch.full((4,), items_per_query)
    offsets = torch.cat([per_query.new_zeros(1), per_query.cumsum(0)])

    scores = _scores_at(z, table, offsets, positions)

    query_of = torch.arange(4).repeat_interleave(items_per_query)
    expected = (z[query_of] * table[positions]).sum(1)
    torch.testing.assert_close(scores, expected)
