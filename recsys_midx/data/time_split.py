"""Global temporal split: one pair of cut-offs in time for all users (``split=global_time``).

Protocol (the one RecBole's and RePlay's time splits follow, with the first interaction after a
cut-off as the target):

* A cut-off ``c`` splits time into *before* (``timestamp < c``) and *after* (``timestamp >= c``).
  Given as a quantile ``q`` of all interactions' timestamps, ``c`` is the timestamp at position
  ``floor(q * n)`` of the ``n`` timestamps in ascending order, so that about a share ``1 - q`` of
  the interactions lies after it; given as a timestamp, ``c`` is that timestamp.
* Two cut-offs, validation before test: ``val_cutoff < test_cutoff``.
* Training: each user's interactions before the validation cut-off (users with none are not
  trained on). Nothing at or after the validation cut-off is ever trained on.
* Validation: each user with an interaction before the validation cut-off and one in
  ``[val_cutoff, test_cutoff)``; the query's history is everything before the validation
  cut-off, its target the user's FIRST interaction in ``[val_cutoff, test_cutoff)``.
* Test: each user with an interaction before the test cut-off and one at or after it; the
  history is everything before the test cut-off (the validation period included, as leave-one-out
  keeps the validation item in the test history), the target the user's FIRST interaction at or
  after the test cut-off.
* Users without history before a cut-off are not evaluated at that stage.

A dataset without times (e.g. ``dataset.columns.time=null``) has row positions as timestamps: the
cut-offs are then positions in the source's rows, and a warning says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from recsys_midx.data.splits import Spans, Stage

if TYPE_CHECKING:
    from recsys_midx.data.pipeline import PreparedDataset

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlobalTime:
    """Settings of the global temporal split (the ``split=global_time`` config), checked at once.

    Each cut-off is a quantile of all timestamps, or an absolute timestamp that then replaces the
    quantile. See the module docstring for the exact protocol.

    Args:
        quantile: the test cut-off as a quantile of all timestamps, in (0, 1).
        timestamp: the test cut-off as a timestamp (seconds since the epoch, or an ISO 8601
            date/date-time, taken as UTC without a zone); replaces ``quantile`` when set.
        val_quantile: the validation cut-off as a quantile, in (0, 1), below ``quantile``.
        val_timestamp: the validation cut-off as a timestamp; replaces ``val_quantile``.

    Raises:
        ValueError: a quantile outside (0, 1), a cut-off given neither way, an unreadable
            timestamp, or a validation cut-off not before the test cut-off (when both are given
            the same way); the message names the key as ``split.<key>``.

    Example:
        ```python
        GlobalTime(quantile=0.9, val_quantile=0.8).build(dataset)
        ```
    """

    quantile: float | None = 0.9
    timestamp: int | str | None = None
    val_quantile: float | None = 0.8
    val_timestamp: int | str | None = None

    def __post_init__(self) -> None:
        for key in ("quantile", "val_quantile"):
            object.__setattr__(self, key, _checked_quantile(key, getattr(self, key)))
        for key in ("timestamp", "val_timestamp"):
            object.__setattr__(self, key, _seconds(key, getattr(self, key)))
        for prefix in ("", "val_"):
            given = (getattr(self, f"{prefix}quantile"), getattr(self, f"{prefix}timestamp"))
            if given == (None, None):
                raise ValueError(f"split.{prefix}quantile or split.{prefix}timestamp must be set")
        # Cut-offs given the same way can be compared now; mixed ones only on the data.
        if self.timestamp is None and self.val_timestamp is None:
            _check_order("quantile", self.val_quantile, self.quantile)
        elif self.timestamp is not None and self.val_timestamp is not None:
            _check_order("timestamp", self.val_timestamp, self.timestamp)

    def build(self, dataset: PreparedDataset) -> GlobalTimeSplit:
        """Find the cut-offs in ``dataset``'s timestamps and split its interactions.

        Args:
            dataset: the processed dataset (sorted by user, then time).

        Returns:
            The split.

        Raises:
            ValueError: the validation cut-off is not before the test cut-off, or a stage would
                have no user (the message names the keys to change).
        """
        times = dataset.interactions["timestamp"].to_numpy(np.int64)
        if dataset.time_is_row_order:
            log.warning(
                "split=global_time: the dataset has no times (dataset.columns.time=null), so its "
                "row order is taken as time and the cut-offs are row positions"
            )
        test_cutoff = self._cutoff(times, "")
        val_cutoff = self._cutoff(times, "val_")
        if val_cutoff >= test_cutoff:
            raise ValueError(
                f"split.{self._key('val_')} gives the validation cut-off {val_cutoff}, not before "
                f"the test cut-off {test_cutoff} of split.{self._key('')}; choose an earlier "
                "validation cut-off"
            )
        split = GlobalTimeSplit.from_interactions(
            dataset.interactions, dataset.num_items, val_cutoff, test_cutoff
        )
        for stage in ("train", "val", "test"):
            if len(split.spans(stage)) == 0:
                raise ValueError(
                    f"split=global_time: no user has {_NEEDS[stage]} (split.{self._key('val_')} "
                    f"-> {val_cutoff}, split.{self._key('')} -> {test_cutoff}); move the cut-offs"
                )
        log.info(
            "Global time split: validation cut-off %d, test cut-off %d; %d users trained on, "
            "%d validated, %d tested",
            val_cutoff,
            test_cutoff,
            len(split.spans("train")),
            len(split.spans("val")),
            len(split.spans("test")),
        )
        return split

    def _key(self, prefix: Literal["", "val_"]) -> str:
        """The key that sets a cut-off, with its value, as the user writes it."""
        timestamp = getattr(self, f"{prefix}timestamp")
        if timestamp is not None:
            return f"{prefix}timestamp={timestamp}"
        return f"{prefix}quantile={getattr(self, f'{prefix}quantile')}"

    def _cutoff(self, times: np.ndarray, prefix: Literal["", "val_"]) -> int:
        timestamp = getattr(self, f"{prefix}timestamp")
        if timestamp is not None:
            return int(timestamp)
        position = min(int(getattr(self, f"{prefix}quantile") * len(times)), len(times) - 1)
        return int(np.partition(times, position)[position])


_NEEDS = {
    "train": "an interaction before the validation cut-off",
    "val": "interactions both before the validation cut-off and between the two cut-offs",
    "test": "interactions both before and after the test cut-off",
}


def _check_order(name: str, val: float | int, test: float | int) -> None:
    if val >= test:
        raise ValueError(
            f"split.val_{name}={val} must be below split.{name}={test}: validation comes before "
            "test"
        )


def _checked_quantile(key: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"split.{key} must be a number in (0, 1), got {value!r}")
    return float(value)


def _seconds(key: str, value: object) -> int | None:
    """A cut-off timestamp in seconds: integers as they are, ISO 8601 text parsed (UTC)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    try:
        stamp = pd.Timestamp(value)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"split.{key} must be seconds since the epoch or an ISO 8601 date, got {value!r}"
        ) from e
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize("UTC")
    return int(stamp.timestamp())


@dataclass(frozen=True)
class GlobalTimeSplit:
    """Users' chronological sequences split by two global cut-offs (see the module docstring).

    User row ``u`` owns ``items[offsets[u]:offsets[u + 1]]``, its interactions up to and
    including its test target (later ones are never served and not kept). Each stage serves only
    its own users: row ``r`` of ``spans(stage)`` is a slice of some user's sequence.

    Attributes:
        items: ``int64 [total]`` item ids of the kept users, each user's in chronological order.
        offsets: ``int64 [U + 1]`` start of each user's sequence in ``items``.
        user_ids: ``int64 [U]`` the dataset's user id of each row.
        num_items: ``N``, the size of the catalog (ids ``1..N``).
        val_cutoff: interactions with ``timestamp >= val_cutoff`` are never trained on.
        test_cutoff: test targets are the first interactions with ``timestamp >= test_cutoff``.
        train: the training sequences (interactions before ``val_cutoff``).
        val: the validation queries (target: first interaction in ``[val_cutoff, test_cutoff)``).
        test: the test queries (target: first interaction at or after ``test_cutoff``).

    Example:
        >>> frame = pd.DataFrame({"user_id": [1, 1, 1, 2, 2], "item_id": [1, 2, 3, 2, 3],
        ...                       "timestamp": [1, 5, 9, 2, 6]})
        >>> split = GlobalTimeSplit.from_interactions(frame, 3, val_cutoff=5, test_cutoff=9)
        >>> split.items[split.test.starts[0]:split.test.ends[0]], split.items[split.test.ends]
        (array([1, 2]), array([3]))
    """

    items: np.ndarray
    offsets: np.ndarray
    user_ids: np.ndarray
    num_items: int
    val_cutoff: int
    test_cutoff: int
    train: Spans
    val: Spans
    test: Spans

    @classmethod
    def from_interactions(
        cls, interactions: pd.DataFrame, num_items: int, val_cutoff: int, test_cutoff: int
    ) -> GlobalTimeSplit:
        """Split interactions sorted by user then time (the Parquet schema's order).

        Args:
            interactions: frame with ``user_id``, ``item_id`` and ``timestamp``, sorted by user,
                chronologically.
            num_items: ``N``.
            val_cutoff: the validation cut-off, below ``test_cutoff``.
            test_cutoff: the test cut-off.

        Returns:
            The split; a stage may be empty (:meth:`GlobalTime.build` refuses that).

        Raises:
            ValueError: the interactions are not sorted by user, then time.
        """
        users = interactions["user_id"].to_numpy(np.int64)
        items = interactions["item_id"].to_numpy(np.int64)
        times = interactions["timestamp"].to_numpy(np.int64)
        new_user = np.r_[True, users[1:] != users[:-1]]
        if np.any(np.diff(users) < 0) or np.any((np.diff(times) < 0) & ~new_user[1:]):
            raise ValueError("interactions must be sorted by user_id, then timestamp")
        starts = np.flatnonzero(new_user)
        lengths = np.diff(np.r_[starts, len(users)])
        # Each user's times ascend, so the counts before a cut-off locate its first interaction
        # at or after it: the target position, relative to the user's start.
        before_val = np.add.reduceat((times < val_cutoff).astype(np.int64), starts)
        before_test = np.add.reduceat((times < test_cutoff).astype(np.int64), starts)
        trained = before_val > 0
        validated = trained & (before_test > before_val)
        tested = (before_test > 0) & (before_test < lengths)
        kept = trained | tested
        # Keep each kept user's interactions up to its test target (or all, when it has none).
        kept_lengths = np.where(kept, np.minimum(lengths, before_test + 1), 0)
        rank = np.arange(len(users)) - np.repeat(starts, lengths)
        kept_rows = rank < np.repeat(kept_lengths, lengths)
        offsets = np.r_[0, np.cumsum(kept_lengths[kept])].astype(np.int64)
        row_starts = np.zeros(len(starts), dtype=np.int64)
        row_starts[kept] = offsets[:-1]
        return cls(
            items=items[kept_rows],
            offsets=offsets,
            user_ids=users[starts[kept]],
            num_items=int(num_items),
            val_cutoff=int(val_cutoff),
            test_cutoff=int(test_cutoff),
            train=Spans(row_starts[trained], row_starts[trained] + before_val[trained]),
            val=Spans(row_starts[validated], row_starts[validated] + before_val[validated]),
            test=Spans(row_starts[tested], row_starts[tested] + before_test[tested]),
        )

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    def spans(self, stage: Stage) -> Spans:
        """The training sequences, or the validation or test queries.

        Args:
            stage: ``"train"``, ``"val"`` or ``"test"``.

        Returns:
            One row per user served at ``stage``.
        """
        return {"train": self.train, "val": self.val, "test": self.test}[stage]

    def train_item_counts(self) -> np.ndarray:
        """``int64 [N + 1]`` how often each item occurs in the training sequences."""
        # The training slices do not overlap: +1 at each start, -1 at each end marks them.
        total = len(self.items)
        edges = np.bincount(self.train.starts, minlength=total + 1) - np.bincount(
            self.train.ends, minlength=total + 1
        )
        in_training = np.cumsum(edges)[:-1] > 0
        return np.bincount(self.items[in_training], minlength=self.num_items + 1)
