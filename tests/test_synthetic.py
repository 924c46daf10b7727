"""Tests of the synthetic source: determinism, shape, popularity skew and sequential signal."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from recsys_midx.data import PreprocessSettings, Synthetic


@pytest.fixture(scope="module")
def default_raw() -> pd.DataFrame:
    return Synthetic().generate()


def _hit_rates(raw: pd.DataFrame, k: int = 10) -> tuple[float, float]:
    """HR@k on each user's last item of (global popularity top-k, transition-count top-k).

    Both are fitted on the items before the last ones; the transition recommender ranks the
    items that followed the user's previous item most often.
    """
    users, items = raw["user"].to_numpy(), raw["item"].to_numpy()
    is_last = np.r_[users[1:] != users[:-1], True]
    targets = items[is_last]
    contexts = items[np.flatnonzero(is_last) - 1]

    popularity = np.bincount(items[~is_last])
    top = np.argsort(-popularity, kind="stable")[:k]
    popularity_hr = float(np.isin(targets, top).mean())

    follows = (users[1:] == users[:-1]) & ~is_last[1:]
    pairs = pd.DataFrame({"prev": items[:-1][follows], "next": items[1:][follows]})
    counts = pairs.value_counts().rename("count").reset_index()
    counts = counts.sort_values(["prev", "count", "next"], ascending=[True, False, True])
    best = counts.groupby("prev").head(k)
    recommended = pd.MultiIndex.from_frame(best[["prev", "next"]])
    asked = pd.MultiIndex.from_arrays([contexts, targets])
    transition_hr = float(asked.isin(recommended).mean())
    return popularity_hr, transition_hr


def test_same_seed_same_frame_other_seed_other_frame() -> None:
    kwargs = dict(num_users=300, num_items=500, num_topics=10)
    first = Synthetic(seed=3, **kwargs).generate()
    pd.testing.assert_frame_equal(first, Synthetic(seed=3, **kwargs).generate())
    other = Synthetic(seed=4, **kwargs).generate()
    assert len(other) != len(first) or not other.equals(first)


def test_shape_ids_lengths_and_time(default_raw: pd.DataFrame) -> None:
    source = Synthetic()
    p = source.params
    assert default_raw.columns.tolist() == ["user", "item", "timestamp"]
    assert default_raw["user"].is_monotonic_increasing
    assert set(default_raw["user"].unique()) == set(range(1, p["num_users"] + 1))
    assert default_raw["item"].between(1, p["num_items"]).all()
    lengths = default_raw.groupby("user").size()
    assert lengths.min() >= p["min_length"] >= 5 and lengths.max() <= p["max_length"]
    assert lengths.mean() == pytest.approx(p["mean_length"], rel=0.1)
    assert lengths.std() > 10  # lengths really vary
    gaps = default_raw.groupby("user")["timestamp"].diff().dropna()
    assert (gaps > 0).all()
    assert default_raw["timestamp"].dtype == np.int64


def test_popularity_is_heavy_tailed(default_raw: pd.DataFrame) -> None:
    counts = np.sort(default_raw["item"].value_counts().to_numpy())[::-1]
    share = counts.cumsum() / counts.sum()
    num_items = Synthetic().params["num_items"]
    assert share[num_items // 100 - 1] > 0.05  # top 1% of the items: > 5x a uniform share
    assert share[num_items // 10 - 1] > 0.25  # top 10%
    assert counts[0] > 20 * np.median(counts)

    flat = Synthetic(popularity_exponent=0.0).generate()["item"].value_counts().to_numpy()
    assert counts.max() / counts.sum() > 5 * flat.max() / flat.sum()


def test_transitions_beat_popularity(default_raw: pd.DataFrame) -> None:
    popularity_hr, transition_hr = _hit_rates(default_raw)
    assert popularity_hr > 0.02  # a real (if weak) baseline
    assert transition_hr >= 3 * popularity_hr, (popularity_hr, transition_hr)


def _top_successor_share(raw: pd.DataFrame) -> float:
    """Median over items (with >= 20 transitions) of the share of their commonest successor."""
    users, items = raw["user"].to_numpy(), raw["item"].to_numpy()
    same_user = users[1:] == users[:-1]
    pairs = pd.DataFrame({"prev": items[:-1][same_user], "next": items[1:][same_user]})
    counts = pairs.value_counts()
    per_item = counts.groupby(level="prev")
    total, top = per_item.sum(), per_item.max()
    frequent = total >= 20
    return float((top[frequent] / total[frequent]).median())


@pytest.mark.parametrize("chain_prob", [0.3, 0.6, 0.9])
def test_chain_prob_is_the_successor_rate(chain_prob: float) -> None:
    share = _top_successor_share(Synthetic(chain_prob=chain_prob).generate())
    # Following the chain (unless the topic switches) plus the odd popular draw of the successor.
    assert chain_prob * 0.95 <= share <= chain_prob * 0.95 + 0.1


def test_scale_smoke() -> None:
    start = time.perf_counter()
    raw = Synthetic(num_users=20_000, num_items=200_000, num_topics=200).generate()
    elapsed = time.perf_counter() - start
    assert raw["user"].nunique() == 20_000
    assert raw["item"].max() <= 200_000
    assert elapsed < 10, f"generation took {elapsed:.1f} s"


def test_prepare_keeps_every_user_by_default(tmp_path: Path) -> None:
    source = Synthetic(num_users=200, num_items=300, num_topics=6)
    assert source.preprocess == PreprocessSettings(user_core=0, item_core=0)
    ds = source.prepare(tmp_path)
    raw = source.generate()
    assert ds.num_users == 200
    assert ds.num_items == raw["item"].nunique()
    assert len(ds.interactions) == len(raw)
    assert ds.interactions["rating"].isna().all()
    assert not (tmp_path / "raw").exists()  # nothing to download
    assert source.prepare(tmp_path).directory == ds.directory


def test_preprocess_mapping_overrides_the_source_defaults(tmp_path: Path) -> None:
    config = OmegaConf.create({"user_core": 5, "dedup": "first"})
    source = Synthetic(num_users=50, num_items=40, num_topics=4, preprocess=config)
    assert source.preprocess == PreprocessSettings(user_core=5, item_core=0, dedup="first")
    with pytest.raises(ValueError, match=r"unknown preprocess setting\(s\) \['min_ratings'\]"):
        Synthetic(preprocess={"min_ratings": 4})


def test_fingerprint_tracks_every_parameter(tmp_path: Path) -> None:
    base = Synthetic(num_users=40, num_items=30, num_topics=3)
    assert base.fingerprint()["seed"] == 0
    folders = {
        base.prepare(tmp_path).directory,
        Synthetic(num_users=40, num_items=30, num_topics=3, seed=1).prepare(tmp_path).directory,
        Synthetic(num_users=40, num_items=30, num_topics=3, chain_prob=0.1)
        .prepare(tmp_path)
        .directory,
    }
    assert len(folders) == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_topics=0),
        dict(num_items=5, num_topics=6),
        dict(min_length=4),
        dict(min_length=20, mean_length=10),
        dict(mean_length=300, max_length=200),
        dict(chain_prob=1.5),
        dict(topic_switch_prob=-0.1),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Synthetic(**kwargs)


def _transition_matrix(source: Synthetic) -> np.ndarray:
    """``P[c, j]``: the generator's probability that 0-based item ``j`` follows item ``c``,
    built item by item from its three ways of drawing the next item."""
    catalogue, _, _ = source._simulate(np.random.default_rng(source.params["seed"]))
    switch, chain = source.params["topic_switch_prob"], source.params["chain_prob"]
    weight, topic = catalogue.weight, catalogue.topic
    n = len(weight)
    matrix = np.zeros((n, n))
    for c in range(n):
        same = topic == topic[c]
        matrix[c] = switch * weight / weight.sum()
        matrix[c, same] += (1 - switch) * (1 - chain) * weight[same] / weight[same].sum()
        matrix[c, catalogue.successor[c]] += (1 - switch) * chain
    return matrix


def test_the_ceiling_ranks_by_the_generators_own_probabilities() -> None:
    # A skewed catalogue in which some items never occur: only occurring items are ranked.
    source = Synthetic(
        num_users=80,
        num_items=150,
        num_topics=4,
        popularity_exponent=1.6,
        min_length=5,
        mean_length=10,
        chain_prob=0.3,
    )
    raw = source.generate()
    matrix = _transition_matrix(source)
    assert np.allclose(matrix.sum(axis=1), 1.0)
    occurring = np.zeros(150, dtype=bool)
    occurring[raw["item"].to_numpy() - 1] = True
    assert not occurring.all()
    hits, gains = [], []
    for _, group in raw.groupby("user", sort=True):
        seq = group["item"].to_numpy() - 1
        target, scores = seq[-1], matrix[seq[-2]]
        competing = occurring.copy()
        competing[seq[:-1]] = False
        competing[target] = False
        rank = int((scores[competing] >= scores[target]).sum())
        hits.append(rank < 10)
        gains.append(1 / np.log2(rank + 2) if rank < 10 else 0.0)
    ceiling = source.ceiling(10)
    assert ceiling == pytest.approx({"ndcg@10": np.mean(gains), "hr@10": np.mean(hits)}, abs=1e-12)


def test_no_fitted_recommender_beats_the_ceiling(default_raw: pd.DataFrame) -> None:
    popularity_hr, transition_hr = _hit_rates(default_raw)
    assert Synthetic().ceiling(10)["hr@10"] > max(popularity_hr, transition_hr)
