"""Leave-one-out split by time."""

import numpy as np
import pandas as pd
import pytest

from recsys_midx.data.splits import LeaveOneOutSplit


def _frame(rows):
    return pd.DataFrame(rows, columns=["user_id", "item_id"])


def test_last_item_is_test_second_to_last_is_validation():
    frame = _frame([(1, 5), (1, 3), (1, 4), (1, 2), (2, 1), (2, 2), (2, 3)])
    split = LeaveOneOutSplit.from_interactions(frame, num_items=5)
    assert split.num_users == 2
    assert split.items.tolist() == [5, 3, 4, 2, 1, 2, 3]
    assert split.offsets.tolist() == [0, 4, 7]
    assert split.user_ids.tolist() == [1, 2]
    # Training parts are [5, 3] and [1]: validation (4, 2) and test (2, 3) items are not counted.
    assert split.train_item_counts().tolist() == [0, 1, 0, 1, 0, 1]


def test_short_users_are_dropped():
    frame = _frame([(1, 1), (1, 2), (2, 1), (2, 2), (2, 3)])
    split = LeaveOneOutSplit.from_interactions(frame, num_items=3)
    assert split.user_ids.tolist() == [2]
    assert split.items.tolist() == [1, 2, 3]


def test_unsorted_users_and_empty_split_are_errors():
    with pytest.raises(ValueError, match="sorted"):
        LeaveOneOutSplit.from_interactions(_frame([(2, 1), (1, 1)]), num_items=1)
    with pytest.raises(ValueError, match="interactions"):
        LeaveOneOutSplit.from_interactions(_frame([(1, 1), (1, 2)]), num_items=2)
    assert (
        LeaveOneOutSplit.from_interactions(
            _frame([(1, 1), (1, 2), (1, 3)]), num_items=3
        ).lengths.dtype
        == np.int64
    )
