"""Full-ranking evaluation: ranks against hand-computed cases and a brute-force reference."""

import doctest
import functools
import math

import pytest
import torch
from allocations import LargestAllocation

from recsys_midx.heads import DotHead, MoSHead
from recsys_midx.lit.seqrec import SeqRecModule
from recsys_midx.losses.softmax import SoftmaxLoss
from recsys_midx.metrics import RankingMetrics, metric_names, ranking_metrics, target_ranks
from recsys_midx.metrics import ranking as ranking_module
from recsys_midx.models.sasrec import SASRec
from recsys_midx.samplers.uniform import UniformSampler

# Five items in two dimensions; row 0 is padding. Query (1, 0) scores items by their first
# coordinate (0.5, 2, 1, -1, 3), query (0, 1) by their second (4, 1, 3, 2, 0).
ITEMS = torch.tensor([[0.0, 0.0], [0.5, 4.0], [2.0, 1.0], [1.0, 3.0], [-1.0, 2.0], [3.0, 0.0]])
X_QUERY, Y_QUERY = [1.0, 0.0], [0.0, 1.0]


def _ranks(queries, targets, exclude=None, items=ITEMS, **kwargs):
    exclude = None if exclude is None else torch.tensor(exclude)
    return target_ranks(torch.tensor(queries), items, torch.tensor(targets), exclude, **kwargs)


def _brute_force_ranks(query, item_emb, targets, exclude):
    """Reference: the full [B, N+1] score matrix in float64 and explicit competitor masks."""
    scores = query.double() @ item_emb.double().T
    rows = torch.arange(len(targets))
    competes = scores >= scores[rows, targets].unsqueeze(1)
    competes[:, 0] = False
    competes[rows, targets] = False
    competes.scatter_(1, exclude, False)
    return competes.sum(dim=1)


def _assert_metrics(ranks, ks, expected):
    out = ranking_metrics(ranks, ks)
    assert list(out) == metric_names(ks)
    for name, values in expected.items():
        torch.testing.assert_close(out[name], torch.tensor(values), rtol=0, atol=1e-7)


def test_hand_computed_five_items():
    # Target 3 under X is beaten by items 2 and 5; target 1 under Y is the best; target 4 under X
    # is the worst of five.
    ranks = _ranks([X_QUERY, Y_QUERY, X_QUERY], [3, 1, 4])
    assert ranks.dtype == torch.long
    assert ranks.tolist() == [2, 0, 4]
    _assert_metrics(
        ranks,
        (1, 3),
        {
            "hr@1": [0.0, 1.0, 0.0],
            "ndcg@1": [0.0, 1.0, 0.0],
            "mrr@1": [0.0, 1.0, 0.0],
            "hr@3": [1.0, 1.0, 0.0],
            "ndcg@3": [0.5, 1.0, 0.0],  # 1 / log2(2 + 2)
            "mrr@3": [1.0 / 3.0, 1.0, 0.0],
        },
    )


def test_metrics_at_rank_zero_are_exactly_one():
    out = ranking_metrics(torch.zeros(4, dtype=torch.long), ks=(1, 10))
    for values in out.values():
        assert values.dtype == torch.float32
        assert torch.equal(values, torch.ones(4))


def test_metrics_follow_formulas_for_every_rank():
    ranks = torch.arange(30)
    out = ranking_metrics(ranks, ks=(5, 20))
    for k in (5, 20):
        for r in ranks.tolist():
            hit = r < k
            assert out[f"hr@{k}"][r] == float(hit)
            assert out[f"ndcg@{k}"][r] == pytest.approx(hit / math.log2(r + 2))
            assert out[f"mrr@{k}"][r] == pytest.approx(hit / (r + 1))


def test_ties_count_against_the_target():
    items = torch.tensor([[0.0], [2.0], [2.0], [5.0], [2.0], [0.0]])
    # Items 2 and 4 tie with target 1 and item 3 beats it: rank 3, not 1.
    assert _ranks([[1.0]], [1], items=items).tolist() == [3]


@pytest.mark.parametrize(
    "items",
    [torch.full((6, 2), 0.75), torch.zeros(6, 2)],
    ids=["identical-items", "zero-items"],
)
def test_constant_scorer_ranks_target_last(items):
    queries = torch.tensor([[1.5, -2.25], [0.0, 0.0], [-0.5, 3.0]])
    ranks = target_ranks(queries, items, torch.tensor([1, 3, 5]))
    assert ranks.tolist() == [4, 4, 4]
    assert all(values.sum() == 0 for values in ranking_metrics(ranks, ks=(1, 3)).values())


def test_constant_scorer_with_inexact_floats_ranks_target_last():
    # Scores that float32 cannot represent exactly: a target score computed apart from the item
    # scores (another kernel, another rounding) would beat some of its ties and even rank first.
    # Reading it from the same product keeps every tie, given a kernel that returns equal values
    # for equal columns of one product, as evaluation-sized batches get on common BLAS builds.
    gen = torch.Generator().manual_seed(0)
    num_items = 1000
    item_emb = torch.randn(1, 64, generator=gen).expand(num_items + 1, 64).contiguous()
    query = torch.randn(64, 64, generator=gen)
    targets = torch.randint(1, num_items + 1, (64,), generator=gen)
    for chunk_size in (300, 65536):
        ranks = target_ranks(query, item_emb, targets, chunk_size=chunk_size)
        assert torch.equal(ranks, torch.full((64,), num_items - 1))


def test_exclusion_removes_items_above_the_target():
    # Target 3 under X: items 2 and 5 beat it. Excluding item 2 (twice) leaves item 5; the target
    # in its own history and padding are ignored, and excluding item 4 (below it) changes nothing.
    exclude = [[2, 2, 0, 3, 4, 0], [5, 1, 1, 4, 0, 0], [0, 0, 0, 0, 0, 0]]
    ranks = _ranks([X_QUERY, X_QUERY, X_QUERY], [3, 4, 3], exclude)
    # Target 4 under X is beaten by 1, 2, 3, 5; excluding 5 and 1 (twice) leaves two.
    assert ranks.tolist() == [1, 2, 2]


def test_target_in_history_is_still_ranked():
    # Target 3 under Y is beaten by item 1 only; its own (repeated) history entries change nothing.
    ranks = _ranks([Y_QUERY, Y_QUERY], [3, 3], [[3, 3, 3], [3, 0, 1]])
    assert ranks.tolist() == [1, 0]


def test_padding_row_is_never_ranked():
    items = ITEMS.clone()
    items[0] = 100.0  # the padding row would win every ranking if it took part
    ranks = target_ranks(
        torch.tensor([Y_QUERY, X_QUERY]),
        items,
        torch.tensor([1, 5]),
        torch.tensor([[0, 0], [0, 2]]),
    )
    assert ranks.tolist() == [0, 0]


def test_nan_scores_rank_last():
    items = ITEMS.clone()
    items[5] = float("nan")  # item 5 would otherwise beat target 3 under X
    ranks = target_ranks(
        torch.tensor([X_QUERY, [float("nan"), 0.0], [float("nan"), 0.0]]),
        items,
        torch.tensor([3, 3, 2]),
        torch.tensor([[0, 0], [0, 0], [1, 1]]),
    )
    # A NaN query puts its target behind all 4 competitors (3 once item 1 is excluded).
    assert ranks.tolist() == [1, 4, 3]


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 1000, 5000])
@pytest.mark.parametrize("data", ["dyadic-gaussian", "small-integers"])
def test_chunked_ranks_match_brute_force(chunk_size, data):
    gen = torch.Generator().manual_seed(0)
    num_queries, num_items, dim, history = 64, 1000, 16, 40
    if data == "small-integers":  # many exact ties
        query = torch.randint(-2, 3, (num_queries, dim), generator=gen).float()
        item_emb = torch.randint(-2, 3, (num_items + 1, dim), generator=gen).float()
    else:  # values on a 1/16 grid: float32 products and sums are exact, as in the reference
        query = (torch.randn(num_queries, dim, generator=gen) * 16).round() / 16
        item_emb = (torch.randn(num_items + 1, dim, generator=gen) * 16).round() / 16
    targets = torch.randint(1, num_items + 1, (num_queries,), generator=gen)
    # Histories drawn from a small id range repeat ids; some contain padding or the target.
    exclude = torch.randint(0, 60, (num_queries, history), generator=gen)
    exclude[::4, 0] = targets[::4]

    expected = _brute_force_ranks(query, item_emb, targets, exclude)
    assert expected.float().std() > 0  # the data exercise a spread of ranks
    assert torch.equal(target_ranks(query, item_emb, targets, exclude, chunk_size), expected)
    no_history = _brute_force_ranks(query, item_emb, targets, torch.zeros_like(exclude))
    assert torch.equal(target_ranks(query, item_emb, targets, None, chunk_size), no_history)


def test_low_precision_inputs_are_scored_in_float32():
    query = torch.tensor([X_QUERY, Y_QUERY, X_QUERY])
    targets = torch.tensor([3, 1, 4])
    low = target_ranks(query.bfloat16(), ITEMS.bfloat16(), targets.int())
    assert torch.equal(low, target_ranks(query, ITEMS, targets))


@pytest.mark.parametrize(
    ("targets", "exclude", "kwargs", "error"),
    [
        ([0, 1], None, {}, ValueError),
        ([1, 6], None, {}, ValueError),
        ([1, 2], [[6], [0]], {}, ValueError),
        ([1, 2], [[-1], [0]], {}, ValueError),
        ([1, 2, 3], None, {}, ValueError),
        ([1, 2], None, {"chunk_size": 0}, ValueError),
        ([1.0, 2.0], None, {}, TypeError),
    ],
)
def test_invalid_inputs_raise(targets, exclude, kwargs, error):
    with pytest.raises(error):
        _ranks([X_QUERY, Y_QUERY], targets, exclude, **kwargs)


@pytest.mark.parametrize("ks", [(), (0,), (5, 5)])
def test_invalid_cutoffs_raise(ks):
    with pytest.raises(ValueError):
        ranking_metrics(torch.zeros(2, dtype=torch.long), ks)
    with pytest.raises(ValueError):
        RankingMetrics(ks)


def test_accumulator_equals_mean_over_all_updates():
    batches = [torch.tensor([0, 3, 12]), torch.tensor([1]), torch.tensor([[7, 0], [25, 2]])]
    metric = RankingMetrics(ks=(1, 5, 10))
    for ranks in batches:
        metric.update(ranks)
    result = metric.compute()
    expected = ranking_metrics(torch.cat([ranks.flatten() for ranks in batches]), ks=(1, 5, 10))
    assert list(result) == list(expected)
    for name, values in expected.items():
        torch.testing.assert_close(result[name], values.mean())


def test_accumulator_states_merge_like_processes():
    # Summed states, as a distributed all-reduce would combine them, count each user once.
    ranks = torch.tensor([0, 4, 9, 30, 2, 2, 11])
    whole, first, second = RankingMetrics(), RankingMetrics(), RankingMetrics()
    whole.update(ranks)
    first.update(ranks[:3])
    second.update(ranks[3:])
    first.merge_state(second)
    for name, value in whole.compute().items():
        torch.testing.assert_close(first.compute()[name], value)
    whole.reset()
    whole.update(torch.tensor([0]))
    assert whole.compute()["ndcg@20"] == 1.0


def test_docstring_examples():
    assert doctest.testmod(ranking_module).failed == 0


@pytest.mark.parametrize("components", [1, 3])
def test_an_evaluation_batch_allocates_one_chunk_of_scores_whatever_the_catalog(
    components: int,
) -> None:
    """A validation step over a catalog 25 times larger allocates nothing larger: its largest
    tensor is the ``[B, chunk + B]`` score block (``B * K`` rows for a mixture of ``K``), never an
    ``[N, D]`` copy of the table or a ``[B, N]`` score matrix."""
    batch_size, chunk, dim = 16, 512, 8
    largest = []
    for num_items in (2_000, 50_000):
        torch.manual_seed(0)
        encoder = SASRec(num_items=num_items, dim=dim, max_len=10)
        head = DotHead() if components == 1 else MoSHead(dim=dim, num_components=components)
        module = SeqRecModule(
            encoder,
            head,
            UniformSampler(num_items),
            SoftmaxLoss(),
            functools.partial(torch.optim.Adam),
            eval_chunk_size=chunk,
        ).eval()
        generator = torch.Generator().manual_seed(1)
        batch = {
            "inputs": torch.randint(1, num_items + 1, (batch_size, 10), generator=generator),
            "targets": torch.randint(1, num_items + 1, (batch_size,), generator=generator),
            "history": torch.randint(0, num_items + 1, (batch_size, 10), generator=generator),
        }
        with torch.no_grad(), LargestAllocation() as allocation:
            module.validation_step(batch, 0)
        largest.append(allocation.nbytes)
    assert largest[0] == largest[1] <= 4 * components * batch_size * (chunk + batch_size)
