"""Negatives shared by the whole batch (``negatives=shared``): the draw follows the batch
mixture of the queries' proposals with its exact ``log q``, and the losses score the shared
negatives as they would score a copy of them for every query."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest
import torch
from conftest import TINY_RUN, drawn_loss, sampler_overrides
from goodness_of_fit import chi_square_pvalue
from torch import Tensor

from recsys_midx.app.experiment import train
from recsys_midx.heads import DotHead, Head, MoEHead, MoSHead, PLIFHead, SigSoftmaxHead
from recsys_midx.losses import (
    MultiLabelSoftmaxLoss,
    SoftmaxLoss,
    full_softmax_loss,
    head_sampled_softmax_loss,
    multilabel_head_sampled_softmax_loss,
    multilabel_sampled_softmax_loss,
    sampled_softmax_loss,
)
from recsys_midx.negatives import SharedByBatch, draw_shared_negatives, exact_positive_log_q
from recsys_midx.samplers import (
    InBatchSampler,
    MIDXSampler,
    PopularitySampler,
    Sampler,
    UniformSampler,
)

NUM_ITEMS = 40
DIM = 4
NUM_NEGATIVES = 20
REPEATS = 1000  # batches drawn per goodness-of-fit test: 1000 x 20 = 20k shared draws


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _popularity() -> PopularitySampler:
    ranks = torch.arange(1.0, NUM_ITEMS + 1)
    counts = torch.cat([torch.zeros(1), torch.floor(500.0 / ranks)])  # Zipf-like, none zero
    sampler = PopularitySampler(NUM_ITEMS, NUM_NEGATIVES)
    sampler.update(torch.zeros(NUM_ITEMS + 1, DIM), counts.long())
    return sampler


def _midx() -> MIDXSampler:
    sampler = MIDXSampler(NUM_ITEMS, NUM_NEGATIVES, num_codewords=4)
    sampler.update(torch.randn(NUM_ITEMS + 1, DIM, generator=_generator(1)))
    return sampler


SAMPLERS: dict[str, Callable[[], Sampler]] = {
    "uniform": lambda: UniformSampler(NUM_ITEMS, NUM_NEGATIVES),
    "popularity": _popularity,
    "inbatch": lambda: InBatchSampler(NUM_ITEMS, NUM_NEGATIVES),
    "midx": _midx,
}

#: Three distinct queries, far enough apart that their MIDX proposals differ clearly.
QUERIES = 2.0 * torch.randn(3, DIM, generator=_generator(2))
#: Positives of the three queries, padded with 0; skewed, so the in-batch proposal is not uniform.
POSITIVES = torch.tensor(
    [[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 4, 5, 6, 7, 8, 0], [1, 2, 2, 9, 10, 11, 12, 13]]
)


def _catalog(num_queries: int) -> Tensor:
    return torch.arange(1, NUM_ITEMS + 1).expand(num_queries, -1)


def _mixture_log_q(sampler: Sampler, queries: Tensor, ids: Tensor) -> Tensor:
    """Independent re-derivation: ``log`` of the mean over the queries of ``q(ids | z)``."""
    flat = queries.reshape(-1, queries.shape[-1])
    per_query = sampler.log_prob(flat, ids.reshape(1, -1).expand(len(flat), -1)).double().exp()
    return per_query.mean(0).log().view(ids.shape)


def test_only_the_query_dependent_sampler_says_so() -> None:
    assert UniformSampler.query_independent and PopularitySampler.query_independent
    assert InBatchSampler.query_independent
    assert not MIDXSampler.query_independent


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_shared_draws_follow_the_batch_mixture(kind: str) -> None:
    sampler = SAMPLERS[kind]()
    torch.manual_seed(0)
    draws = torch.stack(
        [draw_shared_negatives(sampler, QUERIES, POSITIVES).ids for _ in range(REPEATS)]
    )
    assert draws.shape == (REPEATS, NUM_NEGATIVES) and int(draws.min()) >= 1
    mixture = _mixture_log_q(sampler, QUERIES, _catalog(1)[0]).exp()
    assert chi_square_pvalue(draws.reshape(1, -1), mixture[None]) > 1e-3
    if kind != "uniform":  # the test has the power to reject a wrong distribution
        assert chi_square_pvalue(draws.reshape(1, -1), torch.ones(1, NUM_ITEMS)) < 1e-6
    if not sampler.query_independent:  # drawing from the first query's proposal alone fails
        first = sampler.log_prob(QUERIES[:1], _catalog(1)).exp()
        assert chi_square_pvalue(draws.reshape(1, -1), first) < 1e-6


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_reported_log_q_is_the_normalised_batch_mixture(kind: str) -> None:
    sampler = SAMPLERS[kind]()
    torch.manual_seed(3)
    drawn = draw_shared_negatives(sampler, QUERIES, POSITIVES)
    assert drawn.ids.shape == drawn.log_q.shape == (NUM_NEGATIVES,)
    assert int(drawn.ids.min()) >= 1
    torch.testing.assert_close(drawn.log_q.double(), _mixture_log_q(sampler, QUERIES, drawn.ids))
    expected = _mixture_log_q(sampler, QUERIES, POSITIVES)
    assert bool(torch.isneginf(drawn.positive_log_q[POSITIVES == 0]).all())
    torch.testing.assert_close(drawn.positive_log_q.double(), expected)
    # With the whole catalog as every query's positives, the positives' log q is the mixture of
    # every id: it sums to 1.
    catalog = draw_shared_negatives(sampler, QUERIES, _catalog(len(QUERIES)))
    torch.testing.assert_close(
        catalog.positive_log_q.double().exp().sum(1), torch.ones(len(QUERIES), dtype=torch.float64)
    )


def test_component_queries_pool_into_one_mixture() -> None:
    sampler = _midx()
    components = 2.0 * torch.randn(3, 2, DIM, generator=_generator(4))  # [Q, K, D]
    targets = torch.tensor([5, 6, 7])
    torch.manual_seed(5)
    drawn = draw_shared_negatives(sampler, components, targets)
    torch.testing.assert_close(drawn.log_q.double(), _mixture_log_q(sampler, components, drawn.ids))
    torch.testing.assert_close(
        drawn.positive_log_q.double(), _mixture_log_q(sampler, components, targets)
    )


def test_many_queries_are_scored_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    import recsys_midx.negatives.shared as negatives

    sampler = _midx()
    queries = torch.randn(7, DIM, generator=_generator(6))
    targets = torch.arange(1, 8)
    torch.manual_seed(7)
    whole = draw_shared_negatives(sampler, queries, targets)
    monkeypatch.setattr(negatives, "_MIXTURE_BLOCK_PAIRS", 1)  # one query per call of the sampler
    torch.manual_seed(7)
    blocked = draw_shared_negatives(sampler, queries, targets)
    assert torch.equal(whole.ids, blocked.ids)
    torch.testing.assert_close(blocked.log_q, whole.log_q)
    torch.testing.assert_close(blocked.positive_log_q, whole.positive_log_q)


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_shared_draws_take_the_given_generator_and_leave_the_global_one_alone(kind: str) -> None:
    first, second = SAMPLERS[kind](), SAMPLERS[kind]()
    torch.manual_seed(0)
    state = torch.get_rng_state()
    drawn = draw_shared_negatives(first, QUERIES, POSITIVES, generator=_generator(8))
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(1)  # another global state: the same generator gives the same draw
    again = draw_shared_negatives(second, QUERIES, POSITIVES, generator=_generator(8))
    assert torch.equal(drawn.ids, again.ids)
    torch.testing.assert_close(again.log_q, drawn.log_q)
    torch.testing.assert_close(again.positive_log_q, drawn.positive_log_q)
    other = draw_shared_negatives(second, QUERIES, POSITIVES, generator=_generator(9))
    assert not torch.equal(drawn.ids, other.ids)


class _RecordingUniform(UniformSampler):
    """A uniform proposal that records how many queries each call is given."""

    def __init__(self) -> None:
        super().__init__(NUM_ITEMS, NUM_NEGATIVES)
        self.rows: list[int] = []

    def sample(
        self, query: Tensor, num_samples: int | None = None, *, generator=None
    ) -> tuple[Tensor, Tensor]:
        self.rows.append(len(query))
        return super().sample(query, num_samples, generator=generator)

    def log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        self.rows.append(len(query))
        return super().log_prob(query, ids)


def test_query_independent_samplers_skip_the_work_per_query() -> None:
    sampler = _RecordingUniform()
    draw_shared_negatives(sampler, torch.randn(50, DIM), torch.arange(1, 51) % NUM_ITEMS + 1)
    assert sampler.rows == [1, 1]  # one draw and one log q, for a single query


def test_exact_positives_get_minus_log_m_and_are_not_scored() -> None:
    sampler = _RecordingUniform()
    targets = torch.tensor([3, 4, 5])
    drawn = draw_shared_negatives(sampler, QUERIES, targets, exact_positives=True)
    torch.testing.assert_close(drawn.positive_log_q, exact_positive_log_q(targets, NUM_NEGATIVES))
    torch.testing.assert_close(drawn.log_q, torch.full((NUM_NEGATIVES,), -math.log(NUM_ITEMS)))


# --- the losses on shared negatives -----------------------------------------------------------

# A hand-sized problem: N = 4 items in 2 dimensions, two queries, three shared negatives of
# which two are query 1's target (accidental hits).
TINY_QUERY = [[0.5, -1.0], [2.0, 0.25]]
TINY_ITEMS = [[0.0, 0.0], [1.0, 0.5], [-0.5, 1.5], [0.75, -0.25], [-1.0, -1.0]]
TINY_TARGETS = [1, 3]
TINY_NEGATIVES = [3, 2, 3]
TINY_NEG_LOG_Q = [-1.0, -2.0, -1.5]
TINY_POS_LOG_Q = [-0.5, -1.25]


def _tiny() -> tuple[Tensor, Tensor]:
    query = torch.tensor(TINY_QUERY, dtype=torch.float64, requires_grad=True)
    items = torch.tensor(TINY_ITEMS, dtype=torch.float64, requires_grad=True)
    return query, items


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


#: One loss term: query row, the query's positives, the positive it is for, and its log q.
Term = tuple[int, list[int], int, float]


def _hand_candidates(term: Term) -> list[tuple[int, float]]:
    """(id, corrected logit) of the term's positive and of the shared negatives that are none of
    the query's positives, positive first."""
    q, positives, positive, pos_log_q = term
    z = TINY_QUERY[q]
    candidates = [(positive, _dot(z, TINY_ITEMS[positive]) - pos_log_q)]
    for item, log_q in zip(TINY_NEGATIVES, TINY_NEG_LOG_Q):
        if item not in positives:
            candidates.append((item, _dot(z, TINY_ITEMS[item]) - log_q))
    return candidates


def _hand_loss_and_grads(
    terms: list[Term],
) -> tuple[list[float], list[list[float]], list[list[float]]]:
    """Losses and the explicit gradient of their sum for the ``terms``:
    ``d/dz_q = sum_c w_c v_c - v_p`` and ``d/dv_i = sum over the columns holding i of
    (w_c - [c = 0]) z_q``, with ``w`` the softmax of the corrected logits."""
    losses = []
    grad_query = [[0.0] * 2 for _ in TINY_QUERY]
    grad_items = [[0.0] * 2 for _ in TINY_ITEMS]
    for term in terms:
        q, candidates = term[0], _hand_candidates(term)
        top = max(logit for _, logit in candidates)
        total = sum(math.exp(logit - top) for _, logit in candidates)
        losses.append(top + math.log(total) - candidates[0][1])
        for column, (item, logit) in enumerate(candidates):
            weight = math.exp(logit - top) / total - (column == 0)
            for d in range(2):
                grad_query[q][d] += weight * TINY_ITEMS[item][d]
                grad_items[item][d] += weight * TINY_QUERY[q][d]
    return losses, grad_query, grad_items


def _assert_matches_hand(loss: Tensor, query: Tensor, items: Tensor, terms: list[Term]) -> None:
    losses, grad_query, grad_items = _hand_loss_and_grads(terms)
    torch.testing.assert_close(loss.detach(), torch.tensor(losses, dtype=torch.float64))
    actual_query, actual_items = torch.autograd.grad(loss.sum(), (query, items))
    torch.testing.assert_close(actual_query, torch.tensor(grad_query, dtype=torch.float64))
    torch.testing.assert_close(actual_items, torch.tensor(grad_items, dtype=torch.float64))


def test_sampled_loss_on_shared_negatives_matches_a_hand_computation() -> None:
    query, items = _tiny()
    loss = sampled_softmax_loss(
        query,
        items,
        torch.tensor(TINY_TARGETS),
        torch.tensor(TINY_NEGATIVES),
        torch.tensor(TINY_NEG_LOG_Q),
        torch.tensor(TINY_POS_LOG_Q),
    )
    # Query 1's target 3 is drawn twice: both hits are out of its normaliser.
    terms = [(0, [1], 1, -0.5), (1, [3], 3, -1.25)]
    assert len(_hand_candidates(terms[1])) == 2
    _assert_matches_hand(loss, query, items, terms)


MULTI_POSITIVES = [[1, 2], [3, 0]]
MULTI_POS_LOG_Q = [[-0.5, -0.75], [-1.25, 0.0]]


def test_multilabel_loss_on_shared_negatives_matches_a_hand_computation() -> None:
    query, items = _tiny()
    loss = multilabel_sampled_softmax_loss(
        query,
        items,
        torch.tensor(MULTI_POSITIVES),
        torch.tensor(TINY_NEGATIVES),
        torch.tensor(TINY_NEG_LOG_Q),
        torch.tensor(MULTI_POS_LOG_Q),
    )
    # A shared negative equal to any positive of the query is out of its normaliser.
    terms = [(0, [1, 2], 1, -0.5), (0, [1, 2], 2, -0.75), (1, [3], 3, -1.25)]
    _assert_matches_hand(loss, query, items, terms)


def _heads() -> dict[str, Head]:
    torch.manual_seed(0)
    return {
        "dot": DotHead(0.5),
        "sigsoftmax": SigSoftmaxHead(),
        "plif": PLIFHead(num_knots=8, bound=3.0),
        "mos": MoSHead(DIM, num_components=3),
        "moe": MoEHead(DIM, num_experts=3, activation="tanh"),
    }


def _problem(num_queries: int = 6) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Leaf query [Q, D] and item table [N+1, D], targets [Q], positives [Q, 3] padded."""
    generator = _generator(8)
    query = torch.randn(num_queries, DIM, generator=generator, dtype=torch.float64)
    items = torch.randn(NUM_ITEMS + 1, DIM, generator=generator, dtype=torch.float64)
    positives = torch.randint(1, NUM_ITEMS + 1, (num_queries, 3), generator=generator)
    positives[::2, 2] = 0
    return query.requires_grad_(), items.requires_grad_(), positives[:, 0], positives


@pytest.mark.parametrize("head_name", sorted(_heads()))
def test_head_losses_score_shared_negatives_like_a_copy_per_query(head_name: str) -> None:
    head = _heads()[head_name].double()
    query, items, targets, positives = _problem()
    # Negatives hitting the positives included, so that masking is exercised.
    neg_ids = torch.cat(
        [targets[:2], torch.randint(1, NUM_ITEMS + 1, (10,), generator=_generator(9))]
    )
    neg_log_q = -torch.rand(len(neg_ids), generator=_generator(10), dtype=torch.float64) - 3.0
    pos_log_q = torch.full(positives.shape, -3.5, dtype=torch.float64)
    copies = (neg_ids.expand(len(query), -1), neg_log_q.expand(len(query), -1))
    for loss_fn, wanted in (
        (head_sampled_softmax_loss, targets),
        (multilabel_head_sampled_softmax_loss, positives),
    ):
        wanted_log_q = pos_log_q[:, 0] if wanted.dim() == 1 else pos_log_q
        values = []
        for ids, log_q in ((neg_ids, neg_log_q), copies):
            z, log_prior, transform = head(query)
            loss = loss_fn(
                z, log_prior, items, wanted, ids, log_q, wanted_log_q, transform or (lambda s: s)
            )
            values.append([loss.detach(), *torch.autograd.grad(loss.sum(), (query, items))])
        for shared, copied in zip(*values):
            torch.testing.assert_close(shared, copied)


@pytest.mark.parametrize("head_name", sorted(_heads()))
@pytest.mark.parametrize("multilabel", [False, True])
def test_objective_draws_once_for_the_batch(head_name: str, multilabel: bool) -> None:
    head = _heads()[head_name].double()
    query, items, targets, positives = _problem()
    wanted = positives if multilabel else targets
    loss_class = MultiLabelSoftmaxLoss if multilabel else SoftmaxLoss
    sampler = _midx()
    torch.manual_seed(11)
    loss = drawn_loss(loss_class(), head(query), wanted, items, sampler, SharedByBatch())
    torch.manual_seed(11)
    z, log_prior, transform = head(query)
    drawn = draw_shared_negatives(sampler, z, wanted)
    assert drawn.ids.shape == (NUM_NEGATIVES,)
    functions = loss_class.functions
    negatives = (drawn.ids, drawn.log_q, drawn.positive_log_q)
    if z.dim() == 2 and transform is None:
        expected = functions.sampled(z, items, wanted, *negatives)
    else:
        expected = functions.head_sampled(
            z, log_prior, items, wanted, *negatives, transform or (lambda s: s)
        )
    torch.testing.assert_close(loss, expected.mean())
    loss.backward()
    assert query.grad is not None and torch.isfinite(items.grad).all()


def test_objective_with_exact_positives_counts_them_exactly() -> None:
    query, items, targets, _ = _problem()
    sampler = _midx()
    torch.manual_seed(12)
    strategy = SharedByBatch(correct_positive=False)
    loss = drawn_loss(SoftmaxLoss(), DotHead()(query), targets, items, sampler, strategy)
    torch.manual_seed(12)
    drawn = draw_shared_negatives(sampler, query, targets, exact_positives=True)
    torch.testing.assert_close(drawn.positive_log_q, exact_positive_log_q(targets, NUM_NEGATIVES))
    expected = sampled_softmax_loss(
        query, items, targets, drawn.ids, drawn.log_q, drawn.positive_log_q
    ).mean()
    torch.testing.assert_close(loss, expected)


def test_sampler_full_takes_the_whole_catalog_whatever_the_negatives_were(compose_config) -> None:
    query, items, targets, _ = _problem()
    loss = drawn_loss(SoftmaxLoss(), DotHead()(query), targets, items, None)
    torch.testing.assert_close(loss, full_softmax_loss(query, items, targets).mean())
    for overrides in ([], ["task=xc"]):
        assert compose_config([*overrides, "sampler=full"]).negatives._target_.endswith(
            "NoNegatives"
        )


def test_configs_default_to_negatives_per_query(compose_config) -> None:
    for overrides in ([], ["task=xc"]):
        assert compose_config(overrides).negatives._target_.endswith(".PerQuery")


@pytest.mark.slow
def test_seqrec_trains_with_shared_negatives(compose_config, tmp_path) -> None:
    cfg = compose_config([*TINY_RUN, *sampler_overrides("midx"), "negatives=shared"])
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["negatives"]["_target_"].endswith("SharedByBatch")
    assert saved["negatives"] == "shared"
    assert saved["epochs_run"] == 2
    assert all(
        0.0 <= value <= 1.0
        for key, value in results["metrics"].items()
        if key.startswith(("val/", "test/")) and "@" in key
    )
