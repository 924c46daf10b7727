"""A seeded generator of sequential interactions with popularity skew and learnable structure.

The catalogue is split into topics of (nearly) equal size; the items of each topic form a cycle,
the *chain*, in random order. Each item has a Zipf popularity weight ``rank ** -exponent`` (ranks
shuffled over the catalogue). A user starts in a topic drawn in proportion to the topics' total
weight, then at every step

1. switches to a fresh topic (drawn the same way) with probability ``topic_switch_prob``;
2. otherwise moves to the chain successor of its current item with probability ``chain_prob``;
3. otherwise (and after a switch) draws an item of its current topic in proportion to popularity.

So the next item is very often predictable from the current one (a model of sequences wins),
while global popularity alone predicts it poorly. Users are simulated together, one time step at
a time, so the Python loop runs once per time step, not once per user.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from recsys_midx.data.preprocess import PreprocessSettings
from recsys_midx.data.sources.base import Source

#: Bump when the generator's algorithm changes, so cached datasets are rebuilt.
GENERATOR_VERSION = 1
_START_TIME = 1_600_000_000  # 2020-09-13, seconds since the epoch
_DAY = 86_400


@dataclass(frozen=True)
class _Catalogue:
    """Topics, chains and popularity of the items (0-based item indices)."""

    num_topics: int
    weight: np.ndarray  # [N] popularity weight of each item, in (0, 1]
    topic: np.ndarray  # [N] topic of each item
    successor: np.ndarray  # [N] next item on the item's chain
    by_topic: np.ndarray  # [N] items grouped by topic, each group in chain order
    topic_end: np.ndarray  # [T] end (exclusive) of each topic's group in by_topic
    within: np.ndarray  # [N] topic + cumulative in-topic popularity share, per by_topic slot
    topic_cdf: np.ndarray  # [T] cumulative topic probabilities

    def draw_topics(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` topics drawn in proportion to their total popularity."""
        topics = np.searchsorted(self.topic_cdf, rng.random(n), side="right")
        return np.minimum(topics, self.num_topics - 1)

    def draw_items(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        """One item per entry of ``topics``, drawn in proportion to popularity inside the topic."""
        # Topic k's slots of `within` cover (k, k+1], so one search over the whole catalogue
        # draws from every topic's distribution at once.
        slots = np.searchsorted(self.within, topics + rng.random(len(topics)), side="right")
        return self.by_topic[np.minimum(slots, self.topic_end[topics] - 1)]


class Synthetic(Source):
    """Synthetic sequential interactions (implicit feedback, no download).

    Args:
        name: the dataset's name (labels the processed folder).
        num_users: number of users (raw ids ``1..num_users``).
        num_items: catalogue size (raw ids ``1..num_items``; rarely drawn items may not occur).
        num_topics: number of topics the catalogue is split into.
        min_length: shortest sequence (at least 5, enough for leave-one-out splits).
        mean_length: mean sequence length before capping at ``max_length``; lengths are
            ``min_length`` plus a geometric variable.
        max_length: longest sequence.
        popularity_exponent: Zipf exponent of item popularity (larger: more skewed).
        chain_prob: probability of moving to the chain successor of the current item.
        topic_switch_prob: probability of switching topic at a step.
        seed: seed of the random generator; equal settings give identical data.
        preprocess: filters (default: none, since every user already has ``min_length`` items).

    Raises:
        ValueError: on sizes or probabilities out of range.

    Example:
        >>> raw = Synthetic(num_users=3, num_items=50, num_topics=5).generate()
        >>> list(raw.columns)
        ['user', 'item', 'timestamp']
    """

    default_preprocess: ClassVar[PreprocessSettings] = PreprocessSettings(user_core=0, item_core=0)

    def __init__(
        self,
        name: str = "synthetic",
        num_users: int = 2000,
        num_items: int = 1000,
        num_topics: int = 20,
        min_length: int = 10,
        mean_length: float = 40.0,
        max_length: int = 200,
        popularity_exponent: float = 0.8,
        chain_prob: float = 0.6,
        topic_switch_prob: float = 0.05,
        seed: int = 0,
        preprocess: Mapping[str, Any] | PreprocessSettings | None = None,
    ) -> None:
        super().__init__(name, preprocess)
        if num_users < 1 or not 1 <= num_topics <= num_items:
            raise ValueError(
                f"need num_users >= 1 and 1 <= num_topics <= num_items, got num_users={num_users}, "
                f"num_topics={num_topics}, num_items={num_items}"
            )
        if not 5 <= min_length <= mean_length <= max_length:
            raise ValueError(
                "need 5 <= min_length <= mean_length <= max_length, got "
                f"{min_length}, {mean_length}, {max_length}"
            )
        if not (0 <= chain_prob <= 1 and 0 <= topic_switch_prob <= 1):
            raise ValueError(
                f"probabilities must lie in [0, 1], got chain_prob={chain_prob}, "
                f"topic_switch_prob={topic_switch_prob}"
            )
        self.params: dict[str, Any] = {
            "num_users": int(num_users),
            "num_items": int(num_items),
            "num_topics": int(num_topics),
            "min_length": int(min_length),
            "mean_length": float(mean_length),
            "max_length": int(max_length),
            "popularity_exponent": float(popularity_exponent),
            "chain_prob": float(chain_prob),
            "topic_switch_prob": float(topic_switch_prob),
            "seed": int(seed),
        }

    def fingerprint(self) -> dict[str, Any]:
        """The generator's parameters and version."""
        return {"source": "synthetic", "generator_version": GENERATOR_VERSION, **self.params}

    def load_raw(self, data_dir: Path) -> pd.DataFrame:
        """Generate the interactions (nothing is read or written under ``data_dir``).

        Args:
            data_dir: unused; part of the :class:`Source` interface.

        Returns:
            See :meth:`generate`.
        """
        return self.generate()

    def generate(self) -> pd.DataFrame:
        """Generate the raw interactions.

        Returns:
            Columns ``user`` and ``item`` (int64, 1-based raw ids) and ``timestamp`` (int64
            seconds, strictly increasing along each user's sequence), grouped by user in order.
        """
        p = self.params
        rng = np.random.default_rng(p["seed"])
        catalogue, lengths, items = self._simulate(rng)
        return pd.DataFrame(
            {
                "user": np.repeat(np.arange(1, p["num_users"] + 1, dtype=np.int64), lengths),
                "item": items + 1,
                "timestamp": _timestamps(rng, lengths),
            }
        )

    def ceiling(self, k: int = 10) -> dict[str, float]:
        """NDCG@k and HR@k of ranking by the generator's own next-item probabilities.

        The next item depends only on the current one (its topic is the current topic), so its
        probability under the generator is known exactly; ranking by it is the best any model
        can do in expectation. The ranking is leave-one-out's test as the default evaluation
        runs it: each user's last item is the target, the items that occur in the data are
        ranked by their probability after the item before it, the user's earlier items are
        excluded (``eval.exclude_seen``) and an item scored as high as the target ranks above
        it.

        Args:
            k: the cut-off.

        Returns:
            ``{"ndcg@k": ..., "hr@k": ...}``, means over every user.

        Example:
            >>> ceiling = Synthetic(num_users=200, num_items=100, num_topics=5).ceiling()
            >>> 0 < ceiling["ndcg@10"] < ceiling["hr@10"] <= 1
            True
        """
        catalogue, lengths, items = self._simulate(np.random.default_rng(self.params["seed"]))
        ranks = _ceiling_ranks(
            catalogue,
            lengths,
            items,
            self.params["chain_prob"],
            self.params["topic_switch_prob"],
        )
        hits = ranks < k
        gains = np.where(hits, 1.0 / np.log2(ranks + 2.0), 0.0)
        return {f"ndcg@{k}": float(gains.mean()), f"hr@{k}": float(hits.mean())}

    def item_topics(self) -> np.ndarray:
        """The topic of every item, as the generated interactions were drawn.

        Returns:
            ``int64 [num_items]``: entry ``i`` is the topic (``0..num_topics - 1``) of raw item
            id ``i + 1``.

        Example:
            >>> topics = Synthetic(num_users=3, num_items=50, num_topics=5).item_topics()
            >>> topics.shape, sorted(set(topics.tolist()))
            ((50,), [0, 1, 2, 3, 4])
        """
        return self._catalogue(np.random.default_rng(self.params["seed"])).topic

    def _catalogue(self, rng: np.random.Generator) -> _Catalogue:
        """The catalogue: the first thing the seeded generator draws, so the same for a seed."""
        p = self.params
        return _build_catalogue(rng, p["num_items"], p["num_topics"], p["popularity_exponent"])

    def _simulate(self, rng: np.random.Generator) -> tuple[_Catalogue, np.ndarray, np.ndarray]:
        """The catalogue, the sequence lengths and the 0-based items, user after user."""
        p = self.params
        catalogue = self._catalogue(rng)
        lengths = _sequence_lengths(
            rng, p["num_users"], p["min_length"], p["mean_length"], p["max_length"]
        )
        return (
            catalogue,
            lengths,
            _walk(rng, catalogue, lengths, p["chain_prob"], p["topic_switch_prob"]),
        )


def _build_catalogue(
    rng: np.random.Generator, num_items: int, num_topics: int, exponent: float
) -> _Catalogue:
    """Assign items to topics, chain each topic's items, and give items Zipf popularity."""
    weight = (rng.permutation(num_items) + 1.0) ** -exponent
    # Slot j of the shuffled catalogue goes to topic j % T; a stable sort by topic then lists each
    # topic's items in shuffled order, which is its chain.
    shuffled = rng.permutation(num_items)
    slot_topic = np.arange(num_items) % num_topics
    by_topic = shuffled[np.argsort(slot_topic, kind="stable")]
    topic_of_slot = np.sort(slot_topic)
    topic_end = np.searchsorted(topic_of_slot, np.arange(num_topics), side="right")
    topic_start = np.concatenate([[0], topic_end[:-1]])

    next_slot = np.arange(1, num_items + 1)
    next_slot[topic_end - 1] = topic_start  # chains are cycles
    successor = np.empty(num_items, dtype=np.int64)
    successor[by_topic] = by_topic[next_slot]

    cumulative = np.cumsum(weight[by_topic])
    before = np.concatenate([[0.0], cumulative])[topic_start]
    topic_weight = cumulative[topic_end - 1] - before
    within = topic_of_slot + (cumulative - before[topic_of_slot]) / topic_weight[topic_of_slot]
    within[topic_end - 1] = np.arange(1, num_topics + 1)  # exact upper bounds despite rounding
    topic = np.empty(num_items, dtype=np.int64)
    topic[by_topic] = topic_of_slot
    return _Catalogue(
        num_topics=num_topics,
        weight=weight,
        topic=topic,
        successor=successor,
        by_topic=by_topic,
        topic_end=topic_end,
        within=within,
        topic_cdf=np.cumsum(topic_weight) / topic_weight.sum(),
    )


def _sequence_lengths(
    rng: np.random.Generator,
    num_users: int,
    min_length: int,
    mean_length: float,
    max_length: int,
) -> np.ndarray:
    """``min_length`` plus a geometric excess with mean ``mean_length - min_length``, capped."""
    excess = rng.geometric(1.0 / (mean_length - min_length + 1.0), num_users) - 1
    return np.minimum(min_length + excess, max_length)


def _walk(
    rng: np.random.Generator,
    catalogue: _Catalogue,
    lengths: np.ndarray,
    chain_prob: float,
    switch_prob: float,
) -> np.ndarray:
    """Simulate every user's item sequence; returns 0-based items, user after user."""
    # Longest sequences first, so the users still active at step t are a prefix.
    order = np.argsort(-lengths, kind="stable")
    remaining = -lengths[order]  # ascending, for searchsorted
    row_of = (np.cumsum(lengths) - lengths)[order]  # first row of each (ordered) user
    out = np.empty(int(lengths.sum()), dtype=np.int64)

    topics = catalogue.draw_topics(rng, len(order))
    items = catalogue.draw_items(rng, topics)
    out[row_of] = items
    for step in range(1, int(-remaining[0])):
        active = int(np.searchsorted(remaining, -step, side="left"))
        topics, items = topics[:active], items[:active]
        switch = rng.random(active) < switch_prob
        topics[switch] = catalogue.draw_topics(rng, int(switch.sum()))
        follow = ~switch & (rng.random(active) < chain_prob)
        items = np.where(follow, catalogue.successor[items], catalogue.draw_items(rng, topics))
        out[row_of[:active] + step] = items
    return out


def _timestamps(rng: np.random.Generator, lengths: np.ndarray) -> np.ndarray:
    """Per-user start times within a year, then gaps of 1 s to 1 day: strictly increasing."""
    first_row = np.cumsum(lengths) - lengths
    elapsed = np.cumsum(rng.integers(1, _DAY, int(lengths.sum())))
    start = _START_TIME + rng.integers(0, 365 * _DAY, len(lengths))
    return np.repeat(start - elapsed[first_row], lengths) + elapsed


def _ceiling_ranks(
    catalogue: _Catalogue,
    lengths: np.ndarray,
    items: np.ndarray,
    chain_prob: float,
    switch_prob: float,
) -> np.ndarray:
    """0-based rank of each user's last item under the generator's next-item probabilities
    given the item before it (see :meth:`Synthetic.ceiling`).

    After item ``c`` of topic ``t``, item ``j`` comes next with probability
    ``s w_j / W`` from a topic switch, plus ``(1 - s)(1 - chain) w_j / W_t`` when ``j`` is in
    ``t`` and ``(1 - s) chain`` when ``j`` is ``c``'s successor (``w``: popularity weights, ``W``
    their sum, ``W_t`` topic ``t``'s). So the competitors that beat the target are counted by
    binary searches over the occurring items' weights, overall and per topic, without scoring
    the catalogue for every user.
    """
    # Weights are distinct by at least 8e-7 of their value up to 1e6 items: this margin keeps
    # the target from being counted as its own competitor through rounding.
    margin = 1.0 + 1e-9
    ends = np.cumsum(lengths)
    targets, current = items[ends - 1], items[ends - 2]
    occurs = np.zeros(len(catalogue.weight), dtype=bool)
    occurs[items] = True
    weight, topic = catalogue.weight, catalogue.topic
    total = weight.sum()
    topic_total = np.bincount(topic, weights=weight, minlength=catalogue.num_topics)
    in_topic = switch_prob / total + (1 - switch_prob) * (1 - chain_prob) / topic_total
    bonus = (1 - switch_prob) * chain_prob

    def probability(candidate: np.ndarray, after: np.ndarray) -> np.ndarray:
        same = topic[candidate] == topic[after]
        base = np.where(same, in_topic[topic[after]], switch_prob / total) * weight[candidate]
        return base + bonus * (candidate == catalogue.successor[after])

    # Occurring items sorted by weight overall, and by (topic, weight) as topic + weight / 2.
    present = np.flatnonzero(occurs)
    by_weight = np.sort(weight[present])
    by_topic = np.sort(topic[present] + weight[present] / 2)

    def heavier_in_topic(t: np.ndarray, floor: np.ndarray) -> np.ndarray:
        """Occurring items of topic ``t`` weighing more than ``floor``."""
        start = np.searchsorted(by_topic, t + np.clip(floor, 0.0, 2.0) / 2, side="right")
        return np.searchsorted(by_topic, t + 1.0, side="left") - start

    tau = probability(targets, current) * margin
    t = topic[current]
    beaten = heavier_in_topic(t, tau / in_topic[t])
    if switch_prob > 0:
        floor = tau * total / switch_prob
        overall = len(by_weight) - np.searchsorted(by_weight, floor, side="right")
        beaten += overall - heavier_in_topic(t, floor)
    # The successor was counted by its weight alone; count it by its probability instead.
    successor = catalogue.successor[current]
    counted = occurs[successor] & (successor != targets)
    beaten += counted & (in_topic[t] * weight[successor] + bonus > tau)
    beaten -= counted & (in_topic[t] * weight[successor] > tau)
    # The user's earlier items (each once) are excluded from the ranking.
    user = np.repeat(np.arange(len(lengths)), lengths)
    earlier = np.ones(len(items), dtype=bool)
    earlier[ends - 1] = False
    pairs = np.unique(user[earlier] * len(weight) + items[earlier])
    seen_user, seen = np.divmod(pairs, len(weight))
    above = (seen != targets[seen_user]) & (probability(seen, current[seen_user]) > tau[seen_user])
    return beaten - np.bincount(seen_user[above], minlength=len(lengths))
