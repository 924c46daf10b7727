"""Tests of the extreme classification metrics: P@k, nDCG@k, PSP@k and the chunked top-k."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from recsys_midx.data.xc import XCDataModule, XCSynthetic
from recsys_midx.lit import XCModule
from recsys_midx.metrics import XCMetrics, inverse_propensities, top_labels, xc_metrics

LOG2_3, LOG2_4 = math.log2(3), math.log2(4)


def test_precision_and_ndcg_by_hand() -> None:
    top = torch.tensor([[5, 2, 9], [1, 2, 3], [4, 6, 8]])
    positives = torch.tensor([[2, 9, 7, 0], [3, 0, 0, 0], [0, 0, 0, 0]])
    metrics = xc_metrics(top, positives, torch.ones(10), ks=(1, 3))
    # Point 1: hits at ranks 2 and 3 of 3 positives; point 2: hit at rank 3 of 1 positive;
    # point 3 has no positive and scores 0.
    assert metrics["p@1"].item() == pytest.approx(0.0)
    assert metrics["p@3"].item() == pytest.approx((2 / 3 + 1 / 3 + 0) / 3)
    ndcg_1 = (1 / LOG2_3 + 1 / LOG2_4) / (1 + 1 / LOG2_3 + 1 / LOG2_4)
    ndcg_2 = (1 / LOG2_4) / 1
    assert metrics["ndcg@1"].item() == pytest.approx(0.0)
    assert metrics["ndcg@3"].item() == pytest.approx((ndcg_1 + ndcg_2 + 0) / 3)


def test_psp_by_hand() -> None:
    # Inverse propensities 1/p of labels 1..4 (index 0 is padding).
    weights = torch.tensor([0.0, 1.0, 4.0, 2.0, 8.0])
    top = torch.tensor([[1, 2], [3, 1]])
    positives = torch.tensor([[1, 2, 4], [4, 0, 0]])
    metrics = xc_metrics(top, positives, weights, ks=(1, 2))
    # Gains of the predictions: point 1 hits 1 (w 1) then 2 (w 4); point 2 hits nothing.
    # Best achievable: point 1 predicts 4 then 2 (8, 4); point 2 predicts 4 (8), then nothing.
    assert metrics["psp@1"].item() == pytest.approx((1 / 1 + 0) / (8 / 1 + 8 / 1))
    assert metrics["psp@2"].item() == pytest.approx(((1 + 4) / 2 + 0) / ((8 + 4) / 2 + 8 / 2))
    assert metrics["p@2"].item() == pytest.approx((1.0 + 0.0) / 2)


def test_perfect_prediction_scores_one() -> None:
    positives = torch.tensor([[3, 1, 2], [2, 0, 0]])
    weights = torch.tensor([0.0, 1.5, 2.5, 3.5])
    # The best PSP order: labels by decreasing weight; the positives fill the top for P@k.
    top = torch.tensor([[3, 2, 1], [2, 1, 3]])
    metrics = xc_metrics(top, positives, weights, ks=(1, 2))
    for name in ("p@1", "ndcg@1", "psp@1", "ndcg@2", "psp@2"):
        assert metrics[name].item() == pytest.approx(1.0), name
    assert metrics["p@2"].item() == pytest.approx((1.0 + 0.5) / 2)


def test_inverse_propensities_follow_jain_et_al() -> None:
    counts = torch.tensor([0, 0, 1, 10, 100])
    num_points, a, b = 500, 0.6, 2.6
    weights = inverse_propensities(counts, num_points, a, b)
    c = (math.log(num_points) - 1) * (b + 1) ** a
    expected = [0.0] + [1 + c * (n + b) ** -a for n in (0, 1, 10, 100)]
    assert weights.tolist() == pytest.approx(expected, rel=1e-6)
    assert (weights[1:].diff() < 0).all(), "rarer labels weigh more"
    with pytest.raises(ValueError, match="num_points"):
        inverse_propensities(counts, 0)


def test_inverse_propensities_match_hand_computed_values() -> None:
    # N = 1000, A = 0.55, B = 1.5: C = (ln 1000 - 1) * 2.5 ** 0.55 = 9.7788887, and
    # 1 / p_l = 1 + C * (N_l + 1.5) ** -0.55; a label seen once weighs exactly ln N.
    weights = inverse_propensities(torch.tensor([0, 0, 1, 9, 99, 999]), num_points=1000)
    assert weights.dtype == torch.float32
    expected = [0.0, 8.8241886, 6.9077553, 3.6830909, 1.7746369, 1.2188619]
    assert weights.tolist() == pytest.approx(expected, rel=1e-6)
    assert weights[2].item() == pytest.approx(math.log(1000), rel=1e-6)


def test_xc_module_weighs_psp_by_the_data_module_label_counts(tmp_path: Path) -> None:
    source = XCSynthetic(
        num_labels=40,
        num_features=100,
        num_train=150,
        num_test=30,
        seed=1,
        propensity_a=0.6,
        propensity_b=2.6,
    )
    dm = XCDataModule(source, tmp_path, val_fraction=0.2)
    dm.setup("fit")
    module = SimpleNamespace(trainer=SimpleNamespace(datamodule=dm), inv_propensity=torch.ones(41))
    XCModule.setup(module, "fit")  # type: ignore[arg-type]
    counts = dm.splits["train"].label_counts()
    c = (math.log(dm.num_train_points) - 1) * 3.6**0.6
    expected = [0.0] + [1 + c * (n + 2.6) ** -0.6 for n in counts[1:].tolist()]
    assert module.inv_propensity.tolist() == pytest.approx(expected, rel=1e-6)
    assert torch.equal(
        module.inv_propensity, inverse_propensities(dm.item_counts, dm.num_train_points, 0.6, 2.6)
    )

    alone = SimpleNamespace(trainer=SimpleNamespace(datamodule=None), inv_propensity=torch.ones(41))
    XCModule.setup(alone, "fit")  # type: ignore[arg-type]
    assert torch.equal(alone.inv_propensity, torch.ones(41)), "no data module: every label weighs 1"
    other = SimpleNamespace(trainer=SimpleNamespace(datamodule=object()), inv_propensity=None)
    with pytest.raises(TypeError, match="XCDataModule"):
        XCModule.setup(other, "fit")  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk_size", [1, 3, 16, 100])
def test_chunked_top_labels_match_brute_force(chunk_size: int) -> None:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(7, 4, generator=generator)
    item_emb = torch.randn(31, 4, generator=generator)
    scores, ids = top_labels(query, item_emb, k=5, chunk_size=chunk_size)
    expected_scores, expected_ids = (query @ item_emb[1:].T).topk(5, dim=1)
    torch.testing.assert_close(scores, expected_scores)
    assert torch.equal(ids, expected_ids + 1)


def test_top_labels_never_returns_padding() -> None:
    item_emb = torch.zeros(4, 2)
    item_emb[0] = 100.0  # a huge padding row must not be predicted
    _, ids = top_labels(torch.ones(2, 2), item_emb, k=3, chunk_size=2)
    assert sorted(ids[0].tolist()) == [1, 2, 3]
    with pytest.raises(ValueError, match="k must be"):
        top_labels(torch.ones(2, 2), item_emb, k=4)


def test_accumulator_over_batches_equals_one_batch() -> None:
    generator = torch.Generator().manual_seed(1)
    top = torch.randint(1, 20, (12, 5), generator=generator)
    positives = torch.randint(0, 20, (12, 4), generator=generator)
    weights = torch.rand(20, generator=generator) + 1.0
    weights[0] = 0.0
    metric = XCMetrics(ks=(1, 3, 5))
    for rows in (slice(0, 5), slice(5, 6), slice(6, 12)):
        metric.update(top[rows], positives[rows], weights)
    batched = metric.compute()
    whole = xc_metrics(top, positives, weights, ks=(1, 3, 5))
    assert batched.keys() == whole.keys()
    for name in whole:
        torch.testing.assert_close(batched[name], whole[name])
    metric.reset()
    assert metric.count.item() == 0


def test_metrics_need_enough_predictions() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        xc_metrics(
            torch.ones(2, 3, dtype=torch.long),
            torch.ones(2, 1, dtype=torch.long),
            torch.ones(2),
            ks=(1, 5),
        )
