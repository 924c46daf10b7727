"""Binary cross-entropy (loss=bce) and gBCE (loss=gbce) on sampled negatives."""

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
    GBCELoss,
    binary_cross_entropy_loss,
    gbce_beta,
    prior_score,
)
from recsys_midx.negatives import Negatives
from recsys_midx.samplers import UniformSampler


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    query = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    item_emb = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([1, 4, 6])
    # Query 1 drew its own target once: that draw is left out.
    neg_ids = torch.tensor([[2, 3], [4, 5], [1, 2]])
    return query, item_emb, targets, neg_ids


@pytest.mark.parametrize(("weight", "offset"), [(1.0, 0.0), (0.3, 0.0), (0.3, -1.7)])
def test_value_and_gradient_match_a_float64_derivation(weight: float, offset: float) -> None:
    query, item_emb, targets, neg_ids = _case()
    loss = binary_cross_entropy_loss(query, item_emb, targets, neg_ids, weight, score_offset=offset)
    expected, grad = [], torch.zeros_like(query)
    for row in range(3):
        z, positive = query[row].detach(), item_emb[targets[row]].detach()
        p = torch.sigmoid(z @ positive + offset)
        value = -weight * torch.log(p)
        grad[row] -= weight * (1 - p) * positive
        for item in neg_ids[row].tolist():
            if item == targets[row]:
                continue
            n = torch.sigmoid(z @ item_emb[item].detach() + offset)
            value = value - torch.log(1 - n)
            grad[row] += n * item_emb[item].detach()
        expected.append(value)
    torch.testing.assert_close(loss, torch.stack(expected))
    loss.sum().backward()
    torch.testing.assert_close(query.grad, grad)


def test_shared_negatives_are_per_query_negatives_repeated() -> None:
    query, item_emb, targets, _ = _case()
    shared = torch.tensor([2, 4, 5])
    torch.testing.assert_close(
        binary_cross_entropy_loss(query, item_emb, targets, shared),
        binary_cross_entropy_loss(query, item_emb, targets, shared.expand(3, -1)),
    )


def test_gbce_beta_runs_from_plain_bce_to_the_sampling_rate() -> None:
    assert gbce_beta(0.0, 10, 101) == pytest.approx(1.0)
    assert gbce_beta(1.0, 10, 101) == pytest.approx(0.1)
    assert gbce_beta(0.75, 256, 3417) == pytest.approx(1 - 0.75 * (1 - 256 / 3416))


def test_gbce_weighs_the_positive_by_beta() -> None:
    torch.manual_seed(0)
    output, targets = DotHead()(torch.randn(5, 8)), torch.tensor([1, 2, 3, 4, 5])
    item_emb, sampler = torch.randn(21, 8), UniformSampler(20, 4)
    torch.manual_seed(1)
    gbce = drawn_loss(GBCELoss(calibration=0.5), output, targets, item_emb, sampler)
    torch.manual_seed(1)
    drawn = sampler.sample(output.queries)[0]
    beta = gbce_beta(0.5, 4, 20)
    expected = binary_cross_entropy_loss(
        output.queries, item_emb, targets, drawn, beta, score_offset=math.log(beta / 4)
    ).mean()
    torch.testing.assert_close(gbce, expected)


@pytest.mark.parametrize("loss", [BCELoss(), GBCELoss(0.75)])
def test_the_prior_offset_makes_zero_scores_the_best_constant(loss: BCELoss) -> None:
    # Every score equal to c: the loss is w softplus(-(c + b)) + M softplus(c + b), flat at c = 0
    # exactly when b = log(w / M); without the offset its slope there is (M - w) / 2. The few
    # accidental hits (drawn targets, left out) move either slope by less than 0.1 here.
    sampler = UniformSampler(3416, 256)
    weight = loss.positive_weight(sampler.num_negatives, sampler.num_items)
    assert prior_score(weight, 256) == pytest.approx(math.log(weight / 256))
    targets = torch.arange(1, 9)
    item_emb = torch.ones(3417, 1, dtype=torch.float64)
    slopes = []
    for offset in (True, False):
        loss.prior_offset = offset
        shift = torch.zeros(8, 1, dtype=torch.float64, requires_grad=True)
        torch.manual_seed(0)
        value = drawn_loss(loss, DotHead()(shift), targets, item_emb, sampler)  # the shift
        slopes.append(torch.autograd.grad(value, shift)[0].sum().item())
    assert abs(slopes[0]) < 0.1
    assert slopes[1] == pytest.approx((256 - weight) / 2, abs=0.1)


def test_gbce_is_binary_cross_entropy_with_the_positive_probability_raised_to_beta() -> None:
    # gSASRec's own form: the positive's logit is replaced by the logit of sigmoid(s)^beta, and
    # the positive and negatives go through ordinary binary cross-entropy with logits.
    torch.manual_seed(0)
    num_items, num_negatives = 50, 8
    query = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    item_emb = torch.randn(num_items + 1, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.arange(1, 7)
    neg_ids = torch.randint(7, num_items + 1, (6, num_negatives))  # no accidental hits
    beta = gbce_beta(0.75, num_negatives, num_items)
    ours = binary_cross_entropy_loss(query, item_emb, targets, neg_ids, beta)
    logits = torch.einsum("qd,qmd->qm", query, item_emb[torch.cat([targets[:, None], neg_ids], 1)])
    powered = torch.sigmoid(logits[:, :1]) ** beta
    labels = torch.zeros_like(logits)
    labels[:, 0] = 1
    transformed = torch.cat([torch.log(powered / (1 - powered)), logits[:, 1:]], dim=1)
    reference = torch.nn.functional.binary_cross_entropy_with_logits(
        transformed, labels, reduction="none"
    ).sum(dim=1)
    torch.testing.assert_close(ours, reference)
    ours_grads = torch.autograd.grad(ours.sum(), [query, item_emb])
    for got, expected in zip(ours_grads, torch.autograd.grad(reference.sum(), [query, item_emb])):
        torch.testing.assert_close(got, expected)


def test_calibration_outside_the_unit_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="calibration=1.5"):
        GBCELoss(calibration=1.5)


def test_the_whole_catalog_is_refused(compose_config) -> None:
    with pytest.raises(ValueError, match="loss=bce does not score negatives of scope catalog"):
        output = DotHead()(torch.randn(2, 4))
        BCELoss()(output, torch.tensor([1, 2]), torch.randn(5, 4), Negatives("catalog"))
    with pytest.raises(ConfigError, match=r"^loss=gbce trains on drawn negatives"):
        check_negatives(compose_config(["loss=gbce", "sampler=full"]))


@pytest.mark.parametrize("loss", ["bce", "gbce"])
@pytest.mark.parametrize("shared", [False, True])
def test_debug_run_trains_and_tests(compose_config, tmp_path, loss: str, shared: bool) -> None:
    cfg = compose_config(
        [
            *TINY_RUN,
            *FEW_STEPS,
            f"loss={loss}",
            f"negatives={'shared' if shared else 'per_query'}",
            "sampler=uniform",
            "sampler.num_negatives=4",
        ]
    )
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["loss"]["_target_"].endswith("BCELoss")
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())
