"""Tests of the EDRep loss: the Gaussian-mixture normaliser, its statistics, gradients, state and
end-to-end training for both tasks."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_RUN, TINY_XC_RUN, sampler_overrides
from hydra.errors import InstantiationException
from torch import Tensor

from recsys_midx.app.experiment import build, train
from recsys_midx.heads import DotHead
from recsys_midx.losses import EDRepLoss, edrep, full_softmax_loss, multilabel_full_softmax_loss
from recsys_midx.losses.edrep import cluster_statistics, gaussian_log_partition
from recsys_midx.negatives import Negatives

NUM_ITEMS = 30
DIM = 6
SINGLE = torch.tensor([3, 30, 7, 7, 12])
#: 0-padded positives: several labels, one label, labels sharing a cluster is likely.
MULTI = torch.tensor([[3, 7, 19], [30, 0, 0], [1, 2, 0], [5, 6, 8], [11, 0, 0]])
#: The head EDRep takes: queries pass through it as in the Lightning modules.
DOT = DotHead()
#: What EDRep takes: the whole catalog, whose normaliser its statistics estimate.
CATALOG = Negatives("catalog")


def _problem(dtype: torch.dtype = torch.float64, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Leaf queries ``[5, D]`` and a leaf item table ``[N+1, D]``."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(5, DIM, generator=generator, dtype=dtype)
    item_emb = torch.randn(NUM_ITEMS + 1, DIM, generator=generator, dtype=dtype)
    return query.requires_grad_(), item_emb.requires_grad_()


def _built(item_emb: Tensor, num_clusters: int, **kwargs) -> EDRepLoss:
    loss_fn = EDRepLoss(num_clusters=num_clusters, **kwargs)
    loss_fn.update(item_emb.detach())
    return loss_fn


def _naive_log_z(query: Tensor, items: Tensor, assignments: Tensor, keep: Tensor) -> Tensor:
    """``log sum_a n_a exp(z.mu_a + z^T Omega_a z / 2)`` over the kept items, one cluster at a
    time with ``torch.cov`` (population), summed directly (no log-space tricks)."""
    total = torch.zeros((), dtype=query.dtype)
    for cluster in assignments.unique():
        members = items[(assignments == cluster) & keep]
        if len(members) == 0:
            continue
        mu = members.mean(0)
        omega = (
            torch.cov(members.T, correction=0)
            if len(members) > 1
            else torch.zeros(DIM, DIM, dtype=items.dtype)
        )
        total = total + len(members) * torch.exp(query @ mu + 0.5 * query @ omega @ query)
    return total.log()


def _naive_losses(
    query: Tensor,
    item_emb: Tensor,
    stats_emb: Tensor,
    positives: Tensor,
    assignments: Tensor,
    exact: bool,
) -> Tensor:
    """Per (query, positive) pair: ``log(exp(s_p) + Z_est(without P)) - s_p`` (``exact``) or
    ``log Z_est(all items) - s_p``; scores from ``item_emb``, statistics recomputed directly
    from ``stats_emb``."""
    out = []
    for row, labels in enumerate(positives.reshape(len(query), -1)):
        labels = labels[labels > 0]
        keep = torch.ones(NUM_ITEMS, dtype=torch.bool)
        if exact:
            keep[labels - 1] = False
        log_rest = _naive_log_z(query[row], stats_emb[1:], assignments, keep)
        for label in labels:
            score = query[row] @ item_emb[label]
            normaliser = torch.logaddexp(score, log_rest) if exact else log_rest
            out.append(normaliser - score)
    return torch.stack(out)


def test_one_cluster_per_item_is_exact() -> None:
    query, item_emb = _problem()
    stats = cluster_statistics(item_emb[1:], torch.arange(NUM_ITEMS), NUM_ITEMS)
    assert torch.equal(stats.covariances, torch.zeros_like(stats.covariances))
    exact_log_z = torch.logsumexp(query @ item_emb[1:].T, dim=1)
    torch.testing.assert_close(gaussian_log_partition(query, *stats), exact_log_z)

    # Through faiss k-means: N clusters for N distinct items put each item alone.
    loss_fn = _built(item_emb, NUM_ITEMS)
    assert sorted(loss_fn.assignments.tolist()) == list(range(NUM_ITEMS))
    torch.testing.assert_close(
        loss_fn.log_partition(query).double(), exact_log_z, rtol=1e-6, atol=1e-6
    )
    single = full_softmax_loss(query, item_emb, SINGLE).mean()
    multi = multilabel_full_softmax_loss(query, item_emb, MULTI).mean()
    torch.testing.assert_close(
        loss_fn(DOT(query), SINGLE, item_emb, CATALOG), single, rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(
        loss_fn(DOT(query), MULTI, item_emb, CATALOG), multi, rtol=1e-6, atol=1e-6
    )
    loss_fn.exact_positives = False  # the bare estimate is exact too, for one target
    torch.testing.assert_close(
        loss_fn(DOT(query), SINGLE, item_emb, CATALOG), single, rtol=1e-6, atol=1e-6
    )


def test_identical_vectors_are_exact() -> None:
    generator = torch.Generator().manual_seed(1)
    centres = torch.randn(3, DIM, generator=generator, dtype=torch.float64)
    assignments = torch.arange(NUM_ITEMS) % 3
    items = centres[assignments]
    query = torch.randn(4, DIM, generator=generator, dtype=torch.float64)
    stats = cluster_statistics(items, assignments, 3)
    assert stats.counts.tolist() == [10.0, 10.0, 10.0]
    torch.testing.assert_close(stats.covariances, torch.zeros(3, DIM, DIM, dtype=torch.float64))
    torch.testing.assert_close(
        gaussian_log_partition(query, *stats), torch.logsumexp(query @ items.T, dim=1)
    )


def test_log_space_form_equals_direct_form_in_float64() -> None:
    generator = torch.Generator().manual_seed(2)
    k = 7
    counts = torch.tensor([1.0, 5.0, 0.0, 120.0, 3.0, 9.0, 40.0], dtype=torch.float64)
    means = torch.randn(k, DIM, generator=generator, dtype=torch.float64)
    factors = torch.randn(k, DIM, DIM, generator=generator, dtype=torch.float64) / DIM
    covariances = factors @ factors.transpose(1, 2)  # symmetric positive semi-definite
    query = 2.0 * torch.randn(16, DIM, generator=generator, dtype=torch.float64)
    direct = sum(
        counts[a] * torch.exp(query @ means[a] + 0.5 * ((query @ covariances[a]) * query).sum(1))
        for a in range(k)
    ).log()
    torch.testing.assert_close(gaussian_log_partition(query, counts, means, covariances), direct)


def test_cluster_statistics_match_per_cluster_reference(monkeypatch) -> None:
    # A small block forces several accumulation blocks.
    monkeypatch.setattr(edrep, "_OUTER_BLOCK_ELEMENTS", 4 * DIM * DIM)
    _, item_emb = _problem()
    items = item_emb.detach()[1:]
    assignments = torch.tensor([0] * 12 + [2] * 17 + [3])  # cluster 1 empty, cluster 3 single
    stats = cluster_statistics(items, assignments, 4)
    assert stats.counts.tolist() == [12.0, 0.0, 17.0, 1.0]
    for cluster in (0, 2):
        members = items[assignments == cluster]
        torch.testing.assert_close(stats.means[cluster], members.mean(0))
        torch.testing.assert_close(stats.covariances[cluster], torch.cov(members.T, correction=0))
    assert not stats.means[1].any() and not stats.covariances[1].any()
    torch.testing.assert_close(stats.means[3], items[-1])
    assert not stats.covariances[3].any()  # a singleton has Omega = 0


def test_relative_error_on_unit_norm_items_is_small() -> None:
    # Unit-norm items in D=32 with |z| = 4: inside a cluster z.v has variance ~ |z|^2 / D = 0.5,
    # and the estimate misses only the cumulants of order >= 3 of the scores (nearly Gaussian
    # here), about 1% of Z at worst over these queries (0.9% measured). Dropping the variance
    # term or its factor 1/2 errs by ~20-30%, so a 2% tolerance catches either.
    generator = torch.Generator().manual_seed(3)
    items = F.normalize(torch.randn(4001, 32, generator=generator, dtype=torch.float64), dim=1)
    query = 4.0 * F.normalize(torch.randn(256, 32, generator=generator, dtype=torch.float64), dim=1)
    loss_fn = _built(items, 16)
    exact = torch.logsumexp(query @ items[1:].T, dim=1)
    relative_error = (loss_fn.log_partition(query).double() - exact).exp() - 1
    assert relative_error.abs().max() < 0.02


@pytest.mark.parametrize("positives", [SINGLE, MULTI], ids=["single", "multi"])
@pytest.mark.parametrize("exact_positives", [True, False])
@pytest.mark.parametrize("grad_through_stats", [False, True])
def test_loss_and_gradients_match_the_naive_reference(
    positives: Tensor, exact_positives: bool, grad_through_stats: bool
) -> None:
    query, item_emb = _problem()
    loss_fn = _built(
        item_emb, 4, exact_positives=exact_positives, grad_through_stats=grad_through_stats
    )
    loss = loss_fn(DOT(query), positives, item_emb, CATALOG)
    # Constant statistics: the reference sees a detached table in mu and Omega.
    stats_emb = item_emb if grad_through_stats else item_emb.detach()
    reference = _naive_losses(
        query, item_emb, stats_emb, positives, loss_fn.assignments, exact_positives
    ).mean()
    # The buffers are float32, so constant statistics agree to float32 precision only.
    tolerance = {} if grad_through_stats else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(loss, reference, **tolerance)
    grads = torch.autograd.grad(loss, (query, item_emb))
    expected = torch.autograd.grad(reference, (query, item_emb))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, **tolerance)
    touched = grads[1].abs().sum(1) > 0
    is_positive = torch.zeros(NUM_ITEMS + 1, dtype=torch.bool)
    is_positive[positives[positives > 0]] = True
    if grad_through_stats:  # the normaliser reaches every item through mu and Omega
        assert touched[1:].all() and not touched[0]
    else:  # only the positives' scores depend on the table
        assert torch.equal(touched, is_positive)


def test_exact_positives_keep_the_loss_a_cross_entropy() -> None:
    # One far outlier in a big cluster: the Gaussian estimate of that cluster underrates
    # exp(s_p), and the bare estimate goes negative; the exact positive term cannot.
    items = torch.zeros(NUM_ITEMS + 1, DIM, dtype=torch.float64)
    items[1:, 0] = 0.01 * torch.arange(NUM_ITEMS, dtype=torch.float64)
    items[5, 0] = 2.0
    query = torch.zeros(1, DIM, dtype=torch.float64)
    query[0, 0] = 10.0
    bare = _built(items, 1, exact_positives=False)(DOT(query), torch.tensor([5]), items, CATALOG)
    exact = _built(items, 1)(DOT(query), torch.tensor([5]), items, CATALOG)
    assert bare < 0 <= exact
    torch.testing.assert_close(
        exact, full_softmax_loss(query, items, torch.tensor([5]))[0], rtol=1e-6, atol=1e-6
    )


def test_head_temperature_divides_the_query() -> None:
    query, item_emb = _problem()
    loss_fn = _built(item_emb, 4)
    scaled = _built(item_emb, 4)
    torch.testing.assert_close(
        scaled(DotHead(temperature=0.5)(query), MULTI, item_emb, CATALOG),
        loss_fn(DOT(2 * query), MULTI, item_emb, CATALOG),
    )


def test_statistics_are_buffers_restored_by_state_dict() -> None:
    query, item_emb = _problem(torch.float32)
    first = _built(item_emb, 4, seed=5)
    state = first.state_dict()
    assert {
        "counts",
        "means",
        "covariances",
        "clusters.codes",
        "clusters.codewords",
        "clusters.num_fits",
    } <= set(state)
    assert state["covariances"].shape == (4, DIM, DIM)
    restored = EDRepLoss(num_clusters=4, seed=5)  # never built: buffers take the saved shapes
    restored.load_state_dict(state)
    assert torch.equal(
        restored(DOT(query), MULTI, item_emb, CATALOG), first(DOT(query), MULTI, item_emb, CATALOG)
    )
    # The next rebuild (warm start, next seed) is the same for both: a resumed run continues.
    moved = item_emb.detach() + 0.1
    first.update(moved)
    restored.update(moved)
    for key, value in first.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key


def test_rejects_bad_arguments() -> None:
    query, item_emb = _problem()
    with pytest.raises(ValueError, match="call update"):
        EDRepLoss(num_clusters=4)(DOT(query), SINGLE, item_emb, CATALOG)
    with pytest.raises(ValueError, match="num_clusters=31 exceeds the 30 items"):
        EDRepLoss(num_clusters=31).update(item_emb.detach())
    with pytest.raises(ValueError, match="num_clusters must be >= 1, got 0"):
        EDRepLoss(num_clusters=0)
    with pytest.raises(ValueError, match="temperature"):
        DotHead(temperature=0.0)
    loss_fn = _built(item_emb, 4)
    with pytest.raises(ValueError, match="distinct"):
        loss_fn(
            DOT(query), torch.tensor([[1, 1], [2, 0], [3, 0], [4, 0], [5, 0]]), item_emb, CATALOG
        )
    with pytest.raises(ValueError, match="targets must lie in 1..30"):
        loss_fn(DOT(query), torch.tensor([0, 1, 2, 3, 4]), item_emb, CATALOG)
    with pytest.raises(ValueError, match="built for 30"):
        loss_fn(DOT(query), SINGLE, torch.randn(41, DIM, dtype=torch.float64), CATALOG)


EDREP = ("loss=edrep", "loss.num_clusters=8")


@pytest.mark.slow
def test_seqrec_trains_with_edrep_and_resumes_with_its_statistics(compose_config, tmp_path) -> None:
    overrides = [*TINY_RUN, *sampler_overrides("midx"), *EDREP]
    results = train(compose_config(overrides))
    assert results["config"]["loss"]["_target_"].endswith("EDRepLoss")
    assert 0.0 <= results["metrics"]["test/ndcg@10"] <= 1.0
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    saved = {
        key.removeprefix("loss."): value
        for key, value in torch.load(last, weights_only=True)["state_dict"].items()
        if key.startswith("loss.")
    }
    assert saved["covariances"].shape == (8, 16, 16)
    assert int(saved["clusters.num_fits"]) == 2  # fit start and the second epoch's refresh
    # Resuming at the end of training must keep the checkpointed statistics, not rebuild them.
    experiment = build(compose_config(overrides))
    experiment.trainer.fit(experiment.module, experiment.datamodule, ckpt_path=str(last))
    resumed = experiment.module.loss.state_dict()
    assert saved.keys() == resumed.keys()
    for key, value in saved.items():
        assert torch.equal(resumed[key], value), key


@pytest.mark.slow
def test_xc_trains_with_edrep_and_refreshes_without_a_sampler(compose_config, tmp_path) -> None:
    # loss=edrep builds no sampler; its statistics still follow the table, on the refresh
    # schedule (each epoch by default).
    cfg = compose_config([*TINY_XC_RUN, *sampler_overrides("uniform"), *EDREP])
    assert cfg.loss._target_.endswith("EDRepLoss")
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["metrics"] == pytest.approx(results["metrics"])
    for metric in ("p@1", "ndcg@5", "psp@5"):
        assert 0.0 <= saved["metrics"][f"test/{metric}"] <= 1.0
    assert saved["epochs_run"] == 2 and saved["negatives"] == "none"
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert int(state["state_dict"]["loss.clusters.num_fits"]) == 2  # fit start and epoch 2
    assert not any(key.startswith("sampler.") for key in state["state_dict"])


def test_a_head_edrep_cannot_use_is_refused(compose_config) -> None:
    refusal = r"head=plif cannot be used with loss=edrep: it takes head=dot"
    with pytest.raises(InstantiationException, match=refusal):
        build(compose_config([*TINY_RUN, *sampler_overrides("midx"), *EDREP, "head=plif"]))
