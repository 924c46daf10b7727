"""Splits of chronological user sequences into training, validation and test queries.

A split holds every user's chronological items in flat (CSR-style) arrays and says, for each
stage, which slices of them the data module serves (:class:`Spans`): training sequences, and
evaluation queries (a history and the target right after it). This module holds the common
interface and the leave-one-out split; :mod:`recsys_midx.data.time_split` the global temporal
split. Both are chosen with the ``split`` config group (``split=leave_one_out``,
``split=global_time``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from recsys_midx.data.pipeline import PreparedDataset

log = logging.getLogger(__name__)

#: The data module's stages, each served from its own spans.
Stage = Literal["train", "val", "test"]

#: A user needs a training item, a validation target and a test target.
MIN_SEQUENCE_LENGTH = 3


@dataclass(frozen=True)
class Spans:
    """Slices ``items[starts[r]:ends[r]]`` of a split's flat item array, one row per served user.

    For training the slice is the user's training sequence; for evaluation it is the query's
    history and ``items[ends[r]]`` its target.

    Attributes:
        starts: ``int64 [R]`` first position of each row's slice.
        ends: ``int64 [R]`` end (exclusive) of each row's slice; for evaluation, the target's
            position.

    Example:
        ```python
        test = split.spans("test")
        history, target = split.items[test.starts[0]:test.ends[0]], split.items[test.ends[0]]
        ```
    """

    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


class SequenceSplit(Protocol):
    """What the data module reads from a split (see :class:`LeaveOneOutSplit`).

    Attributes:
        items: ``int64 [total]`` item ids of all users, each user's in chronological order.
        num_items: ``N``, the size of the catalog (ids ``1..N``).
    """

    items: np.ndarray
    num_items: int

    def spans(self, stage: Stage) -> Spans:
        """The slices of ``items`` served at ``stage``: training sequences or queries."""
        ...

    def train_item_counts(self) -> np.ndarray:
        """``int64 [N + 1]`` how often each item occurs in the training sequences."""
        ...


class SplitStrategy(Protocol):
    """A split's settings (a ``split`` config), checked before any data is read."""

    def build(self, dataset: PreparedDataset) -> SequenceSplit:
        """Split the processed interactions of ``dataset``."""
        ...


@dataclass(frozen=True)
class LeaveOneOut:
    """Settings of the leave-one-out split (it has none): see :class:`LeaveOneOutSplit`.

    Example:
        ```python
        split = LeaveOneOut().build(dataset)
        ```
    """

    def build(self, dataset: PreparedDataset) -> LeaveOneOutSplit:
        """Split ``dataset``'s interactions: see :meth:`LeaveOneOutSplit.from_interactions`.

        Args:
            dataset: the processed dataset.

        Returns:
            The split.

        Raises:
            ValueError: if no user has enough interactions.
        """
        return LeaveOneOutSplit.from_interactions(dataset.interactions, dataset.num_items)


@dataclass(frozen=True)
class LeaveOneOutSplit:
    """Users' chronological sequences split by time: last item test, second-to-last validation.

    User ``u`` (a row index, not a raw id) owns ``items[offsets[u]:offsets[u + 1]]``; its training
    part is all but the last two items, its validation target the second-to-last, its test target
    the last. At test time the validation item is part of the history. Every user is served at
    every stage: row ``u`` of each stage's :class:`Spans` is user row ``u``.

    Attributes:
        items: ``int64 [total]`` item ids of all users, each user's in chronological order.
        offsets: ``int64 [U + 1]`` start of each user's sequence in ``items``.
        user_ids: ``int64 [U]`` the dataset's user id of each row.
        num_items: ``N``, the size of the catalog (ids ``1..N``).
    """

    items: np.ndarray
    offsets: np.ndarray
    user_ids: np.ndarray
    num_items: int

    @classmethod
    def from_interactions(cls, interactions: pd.DataFrame, num_items: int) -> LeaveOneOutSplit:
        """Build the split from interactions sorted by user then time (the Parquet schema's order).

        Users with fewer than :data:`MIN_SEQUENCE_LENGTH` interactions are dropped (logged).

        Args:
            interactions: frame with ``user_id`` and ``item_id``, sorted by user, chronologically.
            num_items: ``N``.

        Raises:
            ValueError: if no user has enough interactions.
        """
        users = interactions["user_id"].to_numpy(np.int64)
        items = interactions["item_id"].to_numpy(np.int64)
        if len(users) and np.any(np.diff(users) < 0):
            raise ValueError("interactions must be sorted by user_id")
        starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]]) if len(users) else users
        lengths = np.diff(np.r_[starts, len(users)])
        keep = lengths >= MIN_SEQUENCE_LENGTH
        if not keep.any():
            raise ValueError(
                f"no user has the {MIN_SEQUENCE_LENGTH} interactions a leave-one-out split needs"
            )
        if not keep.all():
            log.info(
                "leave-one-out: dropped %d users with < %d interactions",
                int((~keep).sum()),
                MIN_SEQUENCE_LENGTH,
            )
        kept_rows = np.repeat(keep, lengths)
        return cls(
            items=items[kept_rows],
            offsets=np.r_[0, np.cumsum(lengths[keep])].astype(np.int64),
            user_ids=users[starts[keep]],
            num_items=int(num_items),
        )

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def train_item_counts(self) -> np.ndarray:
        """``int64 [N + 1]`` how often each item occurs in the training parts (index 0 stays 0)."""
        is_train = np.ones(len(self.items), dtype=bool)
        is_train[self.offsets[1:] - 1] = False
        is_train[self.offsets[1:] - 2] = False
        return np.bincount(self.items[is_train], minlength=self.num_items + 1)

    def spans(self, stage: Stage) -> Spans:
        """Training parts (all but the last two items), or the validation or test queries.

        Args:
            stage: ``"train"``, ``"val"`` (target: the second-to-last item) or ``"test"``
                (target: the last item).

        Returns:
            One row per user.
        """
        return self._spans[stage]

    @cached_property
    def _spans(self) -> dict[str, Spans]:
        # Computed once: training batches look rows up in them on every step.
        starts, ends = self.offsets[:-1], self.offsets[1:]
        before_validation = Spans(starts, ends - 2)
        return {
            "train": before_validation,
            "val": before_validation,
            "test": Spans(starts, ends - 1),
        }
