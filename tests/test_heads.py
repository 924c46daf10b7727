"""Output heads (dot, sigsoftmax, PLIF, MoS, MoE) and the objectives that apply them."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import drawn_loss
from goodness_of_fit import chi_square_pvalue
from torch import Tensor

from recsys_midx.heads import (
    DotHead,
    Head,
    MoEHead,
    MoSHead,
    MoSPLIFHead,
    PLIFFunction,
    PLIFHead,
    SigSoftmaxHead,
    optimizer_param_groups,
)
from recsys_midx.lit import SeqRecModule
from recsys_midx.losses import (
    EDRepLoss,
    MultiLabelSoftmaxLoss,
    SoftmaxLoss,
    full_softmax_loss,
    head_full_softmax_loss,
    head_sampled_softmax_loss,
    multilabel_head_full_softmax_loss,
    multilabel_head_sampled_softmax_loss,
    sampled_softmax_loss,
)
from recsys_midx.metrics import target_ranks, top_labels
from recsys_midx.models import SASRec
from recsys_midx.negatives import draw_mixture_negatives, draw_negatives
from recsys_midx.samplers import MIDXSampler, UniformSampler
from recsys_midx.scoring import catalog_scores, log_probs, ranking_queries

NUM_ITEMS = 40
DIM = 5


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _problem(dtype: torch.dtype = torch.float32, num_queries: int = 7, seed: int = 0):
    """Leaf query [Q, D], leaf item table [N+1, D] and targets [Q] in 1..N."""
    generator = _generator(seed)
    query = torch.randn(num_queries, DIM, generator=generator, dtype=dtype).requires_grad_()
    item_emb = torch.randn(NUM_ITEMS + 1, DIM, generator=generator, dtype=dtype).requires_grad_()
    targets = torch.randint(1, NUM_ITEMS + 1, (num_queries,), generator=generator)
    return query, item_emb, targets


def _random_plif(
    num_knots: int = 12, bound: float = 3.0, seed: int = 0, temperature: float = 1.0
) -> PLIFHead:
    """A PLIF head far from the identity: slopes between about 0.1 and 3."""
    head = PLIFHead(num_knots=num_knots, bound=bound, temperature=temperature)
    with torch.no_grad():
        head.raw_slopes.copy_(torch.randn(num_knots, generator=_generator(seed)) * 1.5)
    return head


def _random_mos_plif(temperature: float = 1.0) -> MoSPLIFHead:
    """A mixture of three softmaxes whose PLIF is far from the identity."""
    head = MoSPLIFHead(DIM, num_components=3, num_knots=12, bound=3.0, temperature=temperature)
    with torch.no_grad():
        head.plif.raw_slopes.copy_(_random_plif().raw_slopes)
    return head


def _heads(temperature: float = 1.0) -> dict[str, Head]:
    torch.manual_seed(0)
    return {
        "dot": DotHead(temperature),
        "sigsoftmax": SigSoftmaxHead(temperature),
        "plif": _random_plif(temperature=temperature),
        "mos": MoSHead(DIM, num_components=3, temperature=temperature),
        "mos_plif": _random_mos_plif(temperature),
        "moe": MoEHead(DIM, num_experts=3, activation="tanh", temperature=temperature),
    }


def _naive_plif(x: Tensor, slopes: Tensor, bound: float) -> Tensor:
    """PLIF as a sum of clipped ramps, with a dense [#x, K] tensor (reference only)."""
    num_bins = slopes.shape[0]
    width = 2 * bound / num_bins
    knots = -bound + width * torch.arange(num_bins, dtype=x.dtype)
    ramps = (x[..., None] - knots).clamp(0, width)  # [..., K]
    inside = -bound + (ramps * slopes).sum(-1)
    below = -bound + slopes[0] * (x + bound)
    above = -bound + width * slopes.sum() + slopes[-1] * (x - bound)
    return torch.where(x < -bound, below, torch.where(x > bound, above, inside))


def _dense_log_probs(head: Head, query: Tensor, item_emb: Tensor, temperature: float = 1.0):
    """[Q, N] log p over the catalog, computed densely (reference only)."""
    queries, log_prior = head.queries(query)
    z = (queries if queries.dim() == 3 else queries[:, None]) / temperature
    log_p = torch.log_softmax(head.transform(z @ item_emb[1:].T), dim=-1)  # [Q, K, N]
    if log_prior is None:
        return log_p[:, 0]
    return torch.logsumexp(log_p + log_prior[..., None], dim=1)


# --- pointwise heads ------------------------------------------------------------------------


def test_plif_at_init_is_the_identity_and_trains_as_plain_softmax() -> None:
    head = PLIFHead()  # default 10^4 knots on [-20, 20]
    scores = torch.cat([torch.linspace(-30, 30, 1001), torch.randn(500) * 5])
    torch.testing.assert_close(head.transform(scores), scores, rtol=0, atol=2e-5)
    query, item_emb, targets = _problem()
    sampler = UniformSampler(NUM_ITEMS, 15)
    for loss_sampler in (None, sampler):
        values = []
        for head in (PLIFHead(), DotHead()):
            torch.manual_seed(3)  # the same negatives for both
            values.append(drawn_loss(SoftmaxLoss(), head(query), targets, item_emb, loss_sampler))
        torch.testing.assert_close(values[0], values[1], rtol=1e-5, atol=1e-5)


def test_sigsoftmax_matches_the_naive_formula_where_it_is_finite() -> None:
    scores = torch.linspace(-30, 30, 601, dtype=torch.float64)
    naive = torch.log(scores.exp() * torch.sigmoid(scores))
    torch.testing.assert_close(SigSoftmaxHead().transform(scores), naive)
    extreme = torch.tensor([-1e4, -200.0, 200.0, 1e4])
    with torch.no_grad():
        naive_extreme = torch.log(extreme.exp() * torch.sigmoid(extreme))
    assert not naive_extreme.isfinite().all()  # the naive formula over- or underflows here
    stable = SigSoftmaxHead().transform(extreme)
    assert stable.isfinite().all()
    torch.testing.assert_close(stable, torch.tensor([-2e4, -400.0, 200.0, 1e4]))


@pytest.mark.parametrize("name", ["sigsoftmax", "plif"])
def test_monotone_heads_keep_rankings(name: str) -> None:
    head = _heads()[name]
    scores = torch.randn(6, 300, generator=_generator(1)) * 6  # inside and outside PLIF's range
    transformed = head.transform(scores)
    assert torch.equal(transformed.argsort(dim=1), scores.argsort(dim=1))
    ordered = head.transform(scores.flatten().sort().values)
    assert bool((ordered.diff() > 0).all()), "the transform must be strictly increasing"
    # Evaluation ranks by the plain query, which the head returns unchanged.
    query, item_emb, _ = _problem()
    queries, log_weights, transform = ranking_queries(head, query, item_emb)
    assert queries is query and log_weights is None and transform is None


def test_plif_gradcheck_in_float64() -> None:
    generator = _generator(2)
    # Logits inside and outside [-2, 2], none on a knot.
    x = (torch.rand(40, generator=generator, dtype=torch.float64) * 7 - 3.5).requires_grad_()
    slopes = (torch.rand(8, generator=generator, dtype=torch.float64) * 2 + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: PLIFFunction.apply(a, b, 2.0), (x, slopes))


def test_plif_matches_a_dense_reference_in_value_and_gradient() -> None:
    head = _random_plif(num_knots=9, bound=2.5).double()
    x = (torch.randn(5, 30, generator=_generator(3), dtype=torch.float64) * 2).requires_grad_()
    upstream = torch.randn(5, 30, generator=_generator(4), dtype=torch.float64)
    value = head.transform(x)
    reference = _naive_plif(x, head.slopes(), head.bound)
    torch.testing.assert_close(value, reference)
    grads = torch.autograd.grad(value, (x, head.raw_slopes), upstream)
    expected = torch.autograd.grad(reference, (x, head.raw_slopes), upstream)
    for actual, wanted in zip(grads, expected):
        torch.testing.assert_close(actual, wanted)


def test_plif_in_float32_matches_float64_in_value_and_gradient() -> None:
    # Float32 logits sum their gradients per bin in float32: close to float64, where each bin
    # holds thousands of logits (2e5 logits in 50 bins).
    head = _random_plif(num_knots=50, bound=4.0)
    x = torch.randn(400, 500, generator=_generator(6)) * 1.5
    upstream = torch.randn(400, 500, generator=_generator(7)) * 1e-3
    grads = []
    for dtype in (torch.float32, torch.float64):
        raw = head.raw_slopes.detach().to(dtype).requires_grad_()
        logits = x.to(dtype).requires_grad_()
        value = PLIFFunction.apply(logits, F.softplus(raw), head.bound)
        grads.append((value, *torch.autograd.grad(value, (logits, raw), upstream.to(dtype))))
    for single, double in zip(*grads):
        torch.testing.assert_close(single.double(), double, rtol=1e-5, atol=1e-6)


def test_plif_backward_never_materialises_logits_by_knots() -> None:
    # A [#logits, K] tensor here would hold 2.5e5 * 4e6 = 1e12 floats (4 TB): only an
    # O(#logits + K) backward can run this.
    head = PLIFHead(num_knots=4_000_000, bound=20.0)
    scores = (torch.randn(500, 500, generator=_generator(5)) * 8).requires_grad_()
    head.transform(scores).sum().backward()
    assert scores.grad is not None and head.raw_slopes.grad is not None
    torch.testing.assert_close(scores.grad, torch.ones_like(scores), atol=1e-5, rtol=0)
    # Each slope's gradient counts the bin widths it spans to the right of it, summed over
    # logits: their total is sum_x (x + T) for logits inside the range, times d softplus.
    sigmoid_init = 1 - math.exp(-1)  # d softplus / d r at softplus(r) = 1
    inside = scores.detach().clamp(-20, 20)
    expected_total = float((inside + 20).double().sum()) * sigmoid_init
    assert float(head.raw_slopes.grad.double().sum()) == pytest.approx(expected_total, rel=1e-4)


# --- MoE and MoS ----------------------------------------------------------------------------


@pytest.mark.parametrize("gate", ["constant", "softmax"])
@pytest.mark.parametrize("activation", ["identity", "tanh", "relu"])
def test_moe_with_one_expert_is_a_dense_layer(gate: str, activation: str) -> None:
    head = MoEHead(DIM, num_experts=1, activation=activation, gate=gate)
    x = torch.randn(9, DIM, generator=_generator(6))
    dense = F.linear(x, head.experts.weight, head.experts.bias)
    expected = {"identity": dense, "tanh": torch.tanh(dense), "relu": torch.relu(dense)}
    projected, log_prior = head.queries(x)
    assert log_prior is None
    torch.testing.assert_close(projected, expected[activation])


def test_moe_gates_weigh_the_experts() -> None:
    head = MoEHead(DIM, num_experts=3, activation="tanh")
    x = torch.randn(4, DIM, generator=_generator(7))
    gates = torch.softmax(head.gate(x), dim=-1)
    experts = torch.tanh(head.experts(x)).view(4, 3, DIM)
    torch.testing.assert_close(head.queries(x)[0], (gates[..., None] * experts).sum(1))
    assert torch.allclose(MoEHead(DIM, 3, gate="constant").gates(x), torch.full((4, 3), 1 / 3))


def test_mos_queries_and_prior() -> None:
    head = MoSHead(DIM, num_components=3)
    x = torch.randn(4, DIM, generator=_generator(8))
    queries, log_prior = head.queries(x)
    torch.testing.assert_close(queries, torch.tanh(head.projection(x)).view(4, 3, DIM))
    torch.testing.assert_close(log_prior.exp().sum(1), torch.ones(4))


@pytest.mark.parametrize("name", ["sigsoftmax", "plif", "mos", "mos_plif", "moe"])
def test_exact_loss_matches_a_dense_reference_with_gradients(name: str) -> None:
    head = _heads(temperature=0.7)[name].double()
    query, item_emb, targets = _problem(torch.float64)
    loss_fn = SoftmaxLoss(chunk_size=7)
    loss = drawn_loss(loss_fn, head(query), targets, item_emb, None)
    reference = -_dense_log_probs(head, query, item_emb, 0.7)[
        torch.arange(len(targets)), targets - 1
    ].mean()
    leaves = [query, item_emb, *head.parameters()]
    torch.testing.assert_close(loss, reference)
    for actual, wanted in zip(
        torch.autograd.grad(loss, leaves), torch.autograd.grad(reference, leaves)
    ):
        torch.testing.assert_close(actual, wanted)


@pytest.mark.parametrize("name", ["sigsoftmax", "plif", "mos", "mos_plif"])
def test_multilabel_exact_loss_matches_a_dense_reference(name: str) -> None:
    head = _heads()[name].double()
    query, item_emb, _ = _problem(torch.float64, num_queries=4)
    positives = torch.tensor([[3, 7, 0], [7, 0, 0], [1, 2, 40], [5, 9, 0]])
    loss = drawn_loss(MultiLabelSoftmaxLoss(chunk_size=5), head(query), positives, item_emb, None)
    queries, log_prior = head.queries(query)
    z = queries if queries.dim() == 3 else queries[:, None]
    scores = head.transform(z @ item_emb[1:].T)  # [Q, K, N]
    terms = []
    for row, label in (positives > 0).nonzero().tolist():
        label = int(positives[row, label])
        others = torch.ones(NUM_ITEMS, dtype=torch.bool)
        others[positives[row][positives[row] > 0] - 1] = False
        others[label - 1] = True
        log_p = scores[row, :, label - 1] - torch.logsumexp(scores[row][:, others], dim=-1)
        terms.append(log_p[0] if log_prior is None else torch.logsumexp(log_p + log_prior[row], 0))
    reference = -torch.stack(terms).mean()
    torch.testing.assert_close(loss, reference)
    leaves = [query, item_emb, *head.parameters()]
    for actual, wanted in zip(
        torch.autograd.grad(loss, leaves), torch.autograd.grad(reference, leaves)
    ):
        torch.testing.assert_close(actual, wanted)


@pytest.mark.parametrize("name", ["plif", "mos", "mos_plif"])
def test_exact_loss_keeps_no_catalog_sized_scores_for_backward(name: str) -> None:
    head = _heads()[name]
    num_items, num_queries, chunk_size = 3000, 16, 64
    generator = _generator(13)
    query = torch.randn(num_queries, DIM, generator=generator, requires_grad=True)
    item_emb = torch.randn(num_items + 1, DIM, generator=generator, requires_grad=True)
    targets = torch.randint(1, num_items + 1, (num_queries,), generator=generator)
    positives = torch.stack([targets, targets % num_items + 1], dim=1)
    # Scores over the whole catalog: [Q, K, N] floats. Without chunked recomputation, backward
    # would keep them (and their transforms and exponentials) for every chunk.
    catalog_scores = num_queries * getattr(head, "num_components", 1) * num_items
    sizes: list[int] = []

    def record(tensor: Tensor) -> Tensor:
        sizes.append(tensor.numel())
        return tensor

    for loss_fn, labels in (
        (SoftmaxLoss(chunk_size=chunk_size), targets),
        (MultiLabelSoftmaxLoss(chunk_size=chunk_size), positives),
    ):
        sizes.clear()
        with torch.autograd.graph.saved_tensors_hooks(record, lambda tensor: tensor):
            loss = drawn_loss(loss_fn, head(query), labels, item_emb, None)
        loss.backward()  # the chunks are recomputed one at a time
        # Everything kept for backward together is less than one copy of the scores.
        assert sum(sizes) < catalog_scores, (type(loss_fn).__name__, sum(sizes))
    assert all(p.grad is not None and p.grad.isfinite().all() for p in head.parameters())


@pytest.mark.parametrize("name", ["mos", "mos_plif", "plif"])
def test_sampled_loss_over_the_whole_catalog_drawn_uniformly_is_exact(name: str) -> None:
    head = _heads()[name].double()
    query, item_emb, targets = _problem(torch.float64)
    queries, log_prior = head.queries(query)
    neg_ids = torch.arange(1, NUM_ITEMS + 1).expand(len(targets), -1)
    log_q = torch.full(neg_ids.shape, -math.log(NUM_ITEMS), dtype=torch.float64)
    sampled = head_sampled_softmax_loss(
        queries, log_prior, item_emb, targets, neg_ids, log_q, log_q[:, 0], head.transform
    )
    exact = head_full_softmax_loss(queries, log_prior, item_emb, targets, head.transform, 9)
    torch.testing.assert_close(sampled, exact)
    positives = torch.tensor(
        [[1, 2, 0], [3, 0, 0], [4, 5, 6], [7, 0, 0], [8, 9, 0], [10, 0, 0], [11, 40, 0]]
    )
    sampled = multilabel_head_sampled_softmax_loss(
        queries, log_prior, item_emb, positives, neg_ids, log_q, log_q[:, :3], head.transform
    )
    exact = multilabel_head_full_softmax_loss(
        queries, log_prior, item_emb, positives, head.transform, 9
    )
    torch.testing.assert_close(sampled, exact)


def test_mixture_negatives_follow_the_equal_weight_mixture_of_component_proposals() -> None:
    num_items, components, contexts = 30, 3, 1500
    generator = _generator(9)
    item_emb = torch.randn(num_items + 1, 4, generator=generator)
    sampler = MIDXSampler(num_items, num_negatives=6, num_codewords=4, last_stage="residual")
    sampler.update(item_emb)
    # Three different component queries, repeated for many identical contexts.
    component_queries = torch.randn(components, 4, generator=generator) * 1.5
    queries = component_queries.expand(contexts, -1, -1)
    torch.manual_seed(10)
    drawn = draw_mixture_negatives(sampler, queries, torch.ones(contexts, dtype=torch.long))
    assert drawn.ids.shape == (contexts, 6)  # ceil(6 / 3) = 2 draws per component
    all_ids = torch.arange(1, num_items + 1)[None]
    per_component = torch.stack([sampler.log_prob(z[None], all_ids)[0] for z in component_queries])
    mixture = torch.logsumexp(per_component, 0) - math.log(components)  # [N]
    torch.testing.assert_close(drawn.log_q, mixture[drawn.ids - 1])
    torch.testing.assert_close(drawn.positive_log_q, mixture[0].expand(contexts))
    assert chi_square_pvalue(drawn.ids.reshape(1, -1), mixture.exp()[None]) > 1e-3
    # The first component's proposal alone is far from the pooled draws.
    assert chi_square_pvalue(drawn.ids.reshape(1, -1), per_component[0].exp()[None]) < 1e-6


def test_mos_sampled_loss_through_the_objective_uses_shared_negatives() -> None:
    torch.manual_seed(0)
    head = MoSHead(DIM, num_components=3)
    query, item_emb, targets = _problem()
    loss_fn = SoftmaxLoss()
    torch.manual_seed(11)
    loss = drawn_loss(loss_fn, head(query), targets, item_emb, UniformSampler(NUM_ITEMS, 10))
    torch.manual_seed(11)
    queries, log_prior = head.queries(query)
    drawn = draw_mixture_negatives(UniformSampler(NUM_ITEMS, 10), queries, targets)
    assert drawn.ids.shape == (len(targets), 12)
    expected = head_sampled_softmax_loss(
        queries,
        log_prior,
        item_emb,
        targets,
        drawn.ids,
        drawn.log_q,
        drawn.positive_log_q,
        torch.nn.Identity(),
    )
    torch.testing.assert_close(loss, expected.mean())
    loss.backward()
    assert all(p.grad is not None for p in head.parameters())


# --- evaluation -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mos", "mos_plif"])
def test_mixture_evaluation_ranks_and_predicts_by_the_mixture(name: str) -> None:
    head = _heads(temperature=0.5)[name]
    query, item_emb, targets = _problem(num_queries=12)
    query, item_emb = query.detach() * 3, item_emb.detach() * 2
    queries, log_weights, transform = ranking_queries(head, query, item_emb, chunk_size=8)
    log_p = _dense_log_probs(head, query, item_emb, 0.5).detach()
    ranks = target_ranks(
        queries, item_emb, targets, chunk_size=9, log_weights=log_weights, transform=transform
    )
    target_log_p = log_p[torch.arange(12), targets - 1]
    assert torch.equal(ranks, (log_p > target_log_p[:, None]).sum(1))
    _, top_ids = top_labels(queries, item_emb, 5, 9, log_weights, transform)
    assert torch.equal(top_ids, log_p.topk(5, dim=1).indices + 1)
    # The plain scores of any single component rank differently.
    assert not torch.equal(ranks, target_ranks(queries[:, 0], item_emb, targets))
    with pytest.raises(ValueError, match="log_weights"):
        target_ranks(queries, item_emb, targets)


def test_mos_plif_ranks_by_its_exact_log_probabilities_which_the_transform_changes() -> None:
    head = _random_mos_plif(temperature=0.5)
    query, item_emb, _ = _problem(num_queries=12)
    query, item_emb = query.detach() * 3, item_emb.detach() * 2
    ranking = ranking_queries(head, query, item_emb, chunk_size=8)
    assert ranking.transform is not None
    scores = catalog_scores(ranking.queries, item_emb[1:], ranking.log_weights, ranking.transform)
    exact = log_probs(head, query, item_emb, torch.arange(1, NUM_ITEMS + 1))
    torch.testing.assert_close(scores, exact)
    # Inside the mixture's log-sum-exp the increasing transform does reorder the catalog.
    plain = catalog_scores(ranking.queries, item_emb[1:], ranking.log_weights)
    assert not torch.equal(plain.argsort(dim=1), scores.argsort(dim=1))


def test_mos_plif_starts_as_the_plain_mixture_and_trains_as_one_head() -> None:
    torch.manual_seed(0)
    head = MoSPLIFHead(DIM, num_components=3, lr=0.1)
    mos = MoSHead(DIM, num_components=3)
    mos.load_state_dict(head.state_dict(), strict=False)
    query, item_emb, _ = _problem()
    ids = torch.arange(1, NUM_ITEMS + 1)
    torch.testing.assert_close(
        log_probs(head, query, item_emb, ids), log_probs(mos, query, item_emb, ids)
    )
    # The slopes train with the rest of the head, at its learning rate.
    model = torch.nn.ModuleDict({"encoder": torch.nn.Linear(2, 2), "head": head})
    groups = optimizer_param_groups(model)
    assert [len(group["params"]) for group in groups] == [2, 5] and groups[1]["lr"] == 0.1


def test_single_query_heads_rank_by_their_query() -> None:
    query, item_emb, _ = _problem()
    assert ranking_queries(DotHead(), query, item_emb)[0] is query
    moe = MoEHead(DIM, 2)
    projected, log_weights, transform = ranking_queries(moe, query, item_emb)
    assert log_weights is None and transform is None
    torch.testing.assert_close(projected, moe.queries(query)[0])


# --- robustness -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dot", "sigsoftmax", "plif", "mos", "mos_plif", "moe"])
@pytest.mark.parametrize("autocast", [False, True])
def test_heads_stay_finite_for_large_norms_and_under_bf16_autocast(name: str, autocast: bool):
    head = _heads()[name]
    query, item_emb, targets = _problem()
    with torch.no_grad():  # norms of about 1e3
        query.mul_(1e3 / query.norm(dim=1, keepdim=True))
        item_emb.mul_(1e3 / item_emb.norm(dim=1, keepdim=True))
    positives = torch.stack([targets, torch.zeros_like(targets)], dim=1)
    for loss_fn, labels in ((SoftmaxLoss(), targets), (MultiLabelSoftmaxLoss(), positives)):
        for sampler in (None, UniformSampler(NUM_ITEMS, 10)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = drawn_loss(loss_fn, head(query), labels, item_emb, sampler)
            leaves = [query, item_emb, *head.parameters()]
            grads = torch.autograd.grad(loss, leaves)
            assert loss.isfinite(), (name, type(loss_fn).__name__, sampler)
            assert all(g.isfinite().all() for g in grads), (name, type(loss_fn).__name__, sampler)


# --- plumbing -------------------------------------------------------------------------------


def test_dot_head_takes_the_plain_code_path_bit_for_bit() -> None:
    query, item_emb, targets = _problem()
    head, loss_fn = DotHead(temperature=0.5), SoftmaxLoss(chunk_size=16)
    assert head(query).transform is None and head(query).log_prior is None
    z = query / 0.5
    exact = drawn_loss(loss_fn, head(query), targets, item_emb, None)
    assert torch.equal(exact, full_softmax_loss(z, item_emb, targets, 16).mean())
    sampler = UniformSampler(NUM_ITEMS, 10)
    torch.manual_seed(12)
    sampled = drawn_loss(loss_fn, head(query), targets, item_emb, sampler)
    torch.manual_seed(12)
    drawn = draw_negatives(sampler, z, targets)
    expected = sampled_softmax_loss(
        z, item_emb, targets, drawn.ids, drawn.log_q, drawn.positive_log_q
    ).mean()
    assert torch.equal(sampled, expected)


def test_heads_with_their_own_lr_get_their_own_optimizer_group() -> None:
    plif = PLIFHead(num_knots=50, lr=0.05)
    module = SeqRecModule(
        SASRec(num_items=NUM_ITEMS, dim=8, max_len=5),
        plif,
        UniformSampler(NUM_ITEMS, 10),
        SoftmaxLoss(),
        functools.partial(torch.optim.Adam, lr=1e-3),
    )
    optimizer = module.configure_optimizers()
    assert [group["lr"] for group in optimizer.param_groups] == [1e-3, 0.05]
    assert optimizer.param_groups[1]["params"] == [plif.raw_slopes]
    total = sum(len(group["params"]) for group in optimizer.param_groups)
    assert total == len(list(module.parameters()))
    # Without such a head, one group with every parameter in order.
    groups = optimizer_param_groups(MoSHead(DIM))
    assert len(groups) == 1 and len(groups[0]["params"]) == 4


def test_heads_reject_bad_arguments() -> None:
    for make, match in (
        (lambda: PLIFHead(num_knots=0), "num_knots"),
        (lambda: PLIFHead(bound=-1.0), "bound"),
        (lambda: PLIFHead(lr=0.0), "lr"),
        (lambda: MoSHead(DIM, num_components=0), "num_components"),
        (lambda: MoSHead(0), "dim"),
        (lambda: MoEHead(DIM, num_experts=0), "num_experts"),
        (lambda: MoEHead(DIM, activation="gelu"), "activation"),
        (lambda: MoEHead(DIM, gate="top1"), "gate"),
        (lambda: MoSHead(DIM, temperature=0.0), "temperature"),
        (lambda: MoSPLIFHead(DIM, num_knots=0), "num_knots"),
        (lambda: MoSPLIFHead(DIM, bound=float("inf")), "bound"),
    ):
        with pytest.raises(ValueError, match=match):
            make()
    # A loss refuses, when the module is built, a head it cannot use.
    with pytest.raises(TypeError, match="head=mos cannot be used with loss=edrep"):
        SeqRecModule(
            SASRec(num_items=NUM_ITEMS, dim=8, max_len=5),
            MoSHead(8),
            None,
            EDRepLoss(),
            functools.partial(torch.optim.Adam, lr=1e-3),
        )
