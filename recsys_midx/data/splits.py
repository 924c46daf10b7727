"""Leave-one-out splits of chronological user sequences, stored as flat (CSR-style) arrays."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

#: A user needs a training item, a validation target and a test target.
MIN_SEQUENCE_LENGTH = 3


@dataclass(frozen=True)
class LeaveOneOutSplit:
    """Users' chronological sequences split by time: last item test, second-to-last validation.

    User ``u`` (a row index, not a raw id) owns ``items[offsets[u]:offsets[u + 1]]``; its training
    part is all but the last two items, its validation target the second-to-last, its test target
    the last. At test time the validation item is part of the history.

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
            log.info("leave-one-out: dropped %d users with < %d interactions",
                     int((~keep).sum()), MIN_SEQUENCE_LENGTH)
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
