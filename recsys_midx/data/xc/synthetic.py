"""Seeded synthetic extreme classification data: power-law labels with feature signatures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from recsys_midx.data.xc.containers import CSR, XCData, csr_from_pairs
from recsys_midx.data.xc.sources import XCSource


class XCSynthetic(XCSource):
    """Seeded synthetic extreme classification data (no download), up to millions of labels.

    Labels have power-law frequencies (weight ``rank ** -power_law_exponent``, ranks shuffled
    over the label ids) and belong to ``num_topics`` topics; each topic owns a pool of features
    and each label a *signature* of ``signature_size`` features from its topic's pool. A point
    draws its first label by weight, and each further label (``1 + Poisson(mean_labels - 1)`` in
    all, at most ``max_labels``) from the same topic with probability ``topic_coherence``,
    otherwise from all labels, still by weight; either way a label's overall frequency stays
    proportional to its weight. The point's features are the signatures of its labels, each
    feature kept with probability ``signature_keep``, plus ``Poisson(noise_features)`` uniformly
    drawn noise features; values are positive and each point's feature vector has unit L2 norm.
    Everything is vectorised with numpy.

    Args:
        name: the dataset's name (labels the processed folder).
        num_labels: ``L``.
        num_features: ``F``; at least ``num_topics`` (each topic needs a feature pool).
        num_train: training points.
        num_test: test points.
        num_topics: topics the labels and features are grouped into.
        mean_labels: mean number of labels per point (before duplicates merge), ``>= 1``.
        max_labels: most labels per point.
        signature_size: features in a label's signature.
        signature_keep: probability that a signature feature appears in a point.
        noise_features: mean number of noise features per point.
        power_law_exponent: exponent of the label frequency power law.
        topic_coherence: probability that a further label comes from the first label's topic.
        seed: random seed; equal settings give identical data.
        propensity_a: ``A`` of the propensity model used by PSP@k.
        propensity_b: ``B`` of the propensity model.

    Raises:
        ValueError: on sizes or probabilities out of range.

    Example:
        >>> dataset = XCSynthetic(num_labels=1000, num_train=5000, num_test=500).prepare("/tmp/d")
        >>> dataset.train.num_points, dataset.num_labels
        (5000, 1000)
    """

    #: Bump when the generator's algorithm changes, so cached datasets are rebuilt.
    GENERATOR_VERSION = 1

    def __init__(
        self,
        name: str = "xc-synthetic",
        num_labels: int = 5000,
        num_features: int = 20000,
        num_train: int = 20000,
        num_test: int = 5000,
        num_topics: int = 50,
        mean_labels: float = 4.0,
        max_labels: int = 20,
        signature_size: int = 8,
        signature_keep: float = 0.7,
        noise_features: float = 10.0,
        power_law_exponent: float = 0.9,
        topic_coherence: float = 0.7,
        seed: int = 0,
        propensity_a: float = 0.55,
        propensity_b: float = 1.5,
    ) -> None:
        super().__init__(name, propensity_a, propensity_b)
        for field, value, low in (
            ("num_labels", num_labels, 2),
            ("num_train", num_train, 1),
            ("num_test", num_test, 1),
            ("num_topics", num_topics, 1),
            ("max_labels", max_labels, 1),
            ("signature_size", signature_size, 1),
        ):
            if value < low:
                raise ValueError(f"{field} must be >= {low}, got {value}")
        if num_features < num_topics:
            raise ValueError(f"num_features ({num_features}) must be >= num_topics ({num_topics})")
        if not 1.0 <= mean_labels <= max_labels:
            raise ValueError(
                f"mean_labels must be in 1..max_labels={max_labels}, got {mean_labels}"
            )
        for field, value in (
            ("signature_keep", signature_keep),
            ("topic_coherence", topic_coherence),
        ):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{field} must be in [0, 1], got {value}")
        if noise_features < 0 or not math.isfinite(power_law_exponent) or power_law_exponent < 0:
            raise ValueError("noise_features and power_law_exponent must be >= 0")
        self.settings = {
            "num_labels": int(num_labels),
            "num_features": int(num_features),
            "num_train": int(num_train),
            "num_test": int(num_test),
            "num_topics": int(num_topics),
            "mean_labels": float(mean_labels),
            "max_labels": int(max_labels),
            "signature_size": int(signature_size),
            "signature_keep": float(signature_keep),
            "noise_features": float(noise_features),
            "power_law_exponent": float(power_law_exponent),
            "topic_coherence": float(topic_coherence),
            "seed": int(seed),
        }

    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        return {"generator_version": self.GENERATOR_VERSION, **self.settings}

    def build(self, data_dir: Path) -> tuple[XCData, XCData]:
        data = generate_xc(**self.settings)
        num_train = self.settings["num_train"]
        return (
            data.take(np.arange(num_train)),
            data.take(np.arange(num_train, data.num_points)),
        )


def _weighted_draw(
    cumulative: np.ndarray, low: np.ndarray, high: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Positions drawn in proportion to weight inside ``(low, high]`` of the inclusive
    cumulative weights: one ``searchsorted`` for every draw at once."""
    target = low + (1.0 - rng.random(len(low))) * (high - low)
    return np.minimum(np.searchsorted(cumulative, target), len(cumulative) - 1)


def generate_xc(
    num_labels: int,
    num_features: int,
    num_train: int,
    num_test: int,
    num_topics: int,
    mean_labels: float,
    max_labels: int,
    signature_size: int,
    signature_keep: float,
    noise_features: float,
    power_law_exponent: float,
    topic_coherence: float,
    seed: int,
) -> XCData:
    """The points of :class:`XCSynthetic` (training points first); see its docstring.

    Returns:
        ``num_train + num_test`` points.
    """
    rng = np.random.default_rng(seed)
    num_points = num_train + num_test
    weights = (rng.permutation(num_labels) + 1.0) ** -power_law_exponent
    topic = rng.integers(num_topics, size=num_labels)

    # Labels grouped by topic, with inclusive cumulative weights in that order: topic t's labels
    # cover (cum[start_t - 1], cum[end_t - 1]], so a within-topic draw is one search.
    by_topic = np.argsort(topic, kind="stable")
    cumulative = np.cumsum(weights[by_topic])
    bounds = np.concatenate(([0.0], cumulative))
    topic_end = np.cumsum(np.bincount(topic, minlength=num_topics))
    topic_low = bounds[topic_end - np.bincount(topic, minlength=num_topics)]
    topic_high = bounds[topic_end]

    # Each topic owns a contiguous block of a shuffled feature order; signatures come from it.
    pool_size = num_features // num_topics
    feature_order = rng.permutation(num_features)
    signatures = feature_order[
        topic[:, None] * pool_size + rng.integers(pool_size, size=(num_labels, signature_size))
    ]

    # Labels of every point: the first by weight, the others by weight in its topic or overall.
    per_point = np.minimum(1 + rng.poisson(mean_labels - 1.0, size=num_points), max_labels)
    point_of = np.repeat(np.arange(num_points), per_point)
    starts = np.concatenate(([0], np.cumsum(per_point)[:-1]))
    is_first = np.zeros(len(point_of), dtype=bool)
    is_first[starts] = True
    total = cumulative[-1]
    slots = _weighted_draw(cumulative, np.zeros(len(point_of)), np.full(len(point_of), total), rng)
    first_topic = np.repeat(topic[by_topic[slots[starts]]], per_point)
    in_topic = ~is_first & (rng.random(len(point_of)) < topic_coherence)
    slots[in_topic] = _weighted_draw(
        cumulative, topic_low[first_topic[in_topic]], topic_high[first_topic[in_topic]], rng
    )
    labels = csr_from_pairs(point_of, by_topic[slots] + 1, None, num_points)

    # Features: the kept part of each label's signature, then noise; unit L2 norm per point.
    label_rows = np.repeat(np.arange(num_points), labels.row_lengths())
    signature_rows = np.repeat(label_rows, signature_size)
    signature_ids = signatures[labels.indices - 1].reshape(-1)
    kept = rng.random(len(signature_ids)) < signature_keep
    num_noise = rng.poisson(noise_features, size=num_points)
    rows = np.concatenate((signature_rows[kept], np.repeat(np.arange(num_points), num_noise)))
    ids = np.concatenate((signature_ids[kept], rng.integers(num_features, size=num_noise.sum())))
    values = np.concatenate(
        (rng.uniform(0.5, 1.5, size=int(kept.sum())), rng.uniform(0.0, 0.5, size=num_noise.sum()))
    )
    order = np.argsort(rows, kind="stable")
    features = csr_from_pairs(rows[order], ids[order], values[order], num_points)
    lengths = features.row_lengths()
    point_of_entry = np.repeat(np.arange(num_points), lengths)
    norms = np.sqrt(
        np.bincount(
            point_of_entry, weights=features.values.astype(np.float64) ** 2, minlength=num_points
        )
    )
    scaled = features.values / norms[point_of_entry]
    return XCData(
        CSR(features.indptr, features.indices, scaled.astype(np.float32)),
        labels,
        num_features,
        num_labels,
    )
