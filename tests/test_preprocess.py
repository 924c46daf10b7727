"""Tests of the preprocessing step: filters, id maps, ordering and statistics."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from recsys_midx.data import DataError, EmptyDatasetError, PreprocessSettings, preprocess

NO_FILTER = PreprocessSettings(user_core=0, item_core=0)


def _frame(rows: list[tuple], with_rating: bool = False) -> pd.DataFrame:
    """A raw frame from (user, item, timestamp[, rating]) tuples."""
    columns = ["user", "item", "timestamp"] + (["rating"] if with_rating else [])
    frame = pd.DataFrame(rows, columns=columns)
    frame["timestamp"] = frame["timestamp"].astype(np.int64)
    return frame


def _raw_pairs(out) -> list[tuple[str, str]]:
    """The processed interactions as (raw user, raw item) pairs, in output order."""
    users = out.user_map.set_index("user_id")["raw_id"]
    items = out.item_map.set_index("item_id")["raw_id"]
    return list(zip(users[out.interactions["user_id"]], items[out.interactions["item_id"]]))


def _reference(raw: pd.DataFrame, settings: PreprocessSettings) -> list[tuple[str, str, int]]:
    """A slow, loop-based statement of the preprocessing rules, as (user, item, timestamp)."""
    rows = [
        (str(r.user), str(r.item), int(r.timestamp), i)
        for i, r in enumerate(raw.itertuples())
        if settings.min_rating is None or r.rating >= settings.min_rating
    ]
    rows.sort(key=lambda r: (r[0], r[2], r[3]))  # user, time, raw position
    if settings.dedup != "keep":
        chosen: dict[tuple[str, str], tuple] = {}
        for row in rows:
            if settings.dedup == "last" or (row[0], row[1]) not in chosen:
                chosen[(row[0], row[1])] = row
        rows = [r for r in rows if chosen[(r[0], r[1])] is r]
    while True:
        user_count: dict[str, int] = {}
        for row in rows:
            user_count[row[0]] = user_count.get(row[0], 0) + 1
        rows_u = [r for r in rows if user_count[r[0]] >= settings.user_core]
        item_count: dict[str, int] = {}
        for row in rows_u:
            item_count[row[1]] = item_count.get(row[1], 0) + 1
        kept = [r for r in rows_u if item_count[r[1]] >= settings.item_core]
        if not settings.iterative_core or len(kept) == len(rows):
            rows = kept
            break
        rows = kept
    return [(r[0], r[1], r[2]) for r in rows]


# Four users over items a..d; user u4 and item d are weak, and removing them cascades.
CASCADE = _frame(
    [
        ("u1", "a", 1),
        ("u1", "b", 2),
        ("u1", "c", 3),
        ("u2", "a", 1),
        ("u2", "b", 2),
        ("u2", "c", 3),
        ("u3", "a", 1),
        ("u3", "b", 2),
        ("u3", "d", 3),
        ("u4", "d", 1),
        ("u4", "c", 2),
    ]
)


def test_iterative_core_unravels_a_chain() -> None:
    # A chain u1-i1-i2, u2-i2-i3, ..., whose end items have one user: every pass of a 2-core
    # peels the ends off, until only the solid block (two users sharing x and y) is left.
    chain = [(f"u{k}", f"i{k + j}", j) for k in range(1, 7) for j in (0, 1)]
    block = [(user, item, t) for user in ("va", "vb") for t, item in enumerate("xy")]
    raw = _frame(chain + block)
    settings = PreprocessSettings(user_core=2, item_core=2)
    out = preprocess(raw, settings)
    assert _raw_pairs(out) == [("va", "x"), ("va", "y"), ("vb", "x"), ("vb", "y")]
    assert out.stats["core_passes"] > 3
    one_pass = preprocess(raw, PreprocessSettings(user_core=2, item_core=2, iterative_core=False))
    assert len(one_pass.interactions) == len(raw) - 2  # only the two end items go


def test_core_iterative_versus_one_pass() -> None:
    settings = dict(user_core=3, item_core=2)
    one_pass = preprocess(CASCADE, PreprocessSettings(**settings, iterative_core=False))
    iterative = preprocess(CASCADE, PreprocessSettings(**settings, iterative_core=True))
    # One pass: u4 is dropped (2 < 3), then item d (left with u3 only) is dropped, which leaves
    # u3 with 2 items, below the threshold; only the iterative filter drops u3 as well.
    assert set(_raw_pairs(one_pass)) == {
        ("u1", "a"),
        ("u1", "b"),
        ("u1", "c"),
        ("u2", "a"),
        ("u2", "b"),
        ("u2", "c"),
        ("u3", "a"),
        ("u3", "b"),
    }
    assert set(_raw_pairs(iterative)) == {
        ("u1", "a"),
        ("u1", "b"),
        ("u1", "c"),
        ("u2", "a"),
        ("u2", "b"),
        ("u2", "c"),
    }
    assert one_pass.stats["core_passes"] == 1
    assert iterative.stats["core_passes"] == 3  # two passes that remove rows, one that confirms


def test_core_below_two_disables_the_filter() -> None:
    for core in (0, 1):
        out = preprocess(CASCADE, PreprocessSettings(user_core=core, item_core=core))
        assert len(out.interactions) == len(CASCADE)
        assert out.stats["core_passes"] == 0


def test_rating_threshold_keeps_ratings_at_or_above() -> None:
    raw = _frame(
        [
            (1, 1, 1, 5.0),
            (1, 2, 2, 3.5),
            (1, 3, 3, 4.0),
            (2, 1, 1, np.nan),
            (2, 2, 2, 4.5),
        ],
        with_rating=True,
    )
    out = preprocess(raw, PreprocessSettings(min_rating=4, user_core=0, item_core=0))
    assert _raw_pairs(out) == [("1", "1"), ("1", "3"), ("2", "2")]
    assert out.interactions["rating"].tolist() == [5.0, 4.0, 4.5]
    assert out.stats["rows_after_step"] == {
        "input": 5,
        "rating": 3,
        "dedup": 3,
        "k_core": 3,
        "max_seq_len": 3,
        "min_seq_len": 3,
    }


def test_rating_threshold_is_exact_for_decimal_ratings() -> None:
    raw = _frame([(1, 1, 1, 4.1), (1, 2, 2, 4.0)], with_rating=True)
    out = preprocess(raw, PreprocessSettings(min_rating=4.1, user_core=0, item_core=0))
    assert _raw_pairs(out) == [("1", "1")]


def test_missing_ratings_become_nan_float32() -> None:
    out = preprocess(_frame([(1, 1, 1)]), NO_FILTER)
    assert out.interactions["rating"].dtype == np.float32
    assert out.interactions["rating"].isna().all()


# User 1 sees item 5 three times (the two last at the same second) and item 6 once.
DUPLICATES = _frame(
    [
        (1, 5, 20, 2.0),
        (1, 6, 15, 3.0),
        (1, 5, 10, 1.0),
        (1, 5, 20, 4.0),
    ],
    with_rating=True,
)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("keep", [(5, 10, 1.0), (6, 15, 3.0), (5, 20, 2.0), (5, 20, 4.0)]),
        ("first", [(5, 10, 1.0), (6, 15, 3.0)]),
        # The latest in time; among equal times the later raw row.
        ("last", [(6, 15, 3.0), (5, 20, 4.0)]),
    ],
)
def test_dedup_policies(policy: str, expected: list[tuple[int, int, float]]) -> None:
    out = preprocess(DUPLICATES, PreprocessSettings(user_core=0, item_core=0, dedup=policy))
    items = out.item_map.set_index("item_id")["raw_id"].astype(int)
    got = list(
        zip(
            items[out.interactions["item_id"]],
            out.interactions["timestamp"],
            out.interactions["rating"],
        )
    )
    assert got == expected


def test_dedup_runs_before_the_core_filter() -> None:
    # With duplicates kept user 1 has 3 interactions and survives a 3-core; deduplicated, 2.
    raw = _frame([(1, 1, 1), (1, 1, 2), (1, 2, 3), (2, 1, 1), (2, 2, 2), (2, 3, 3)])
    kept = preprocess(raw, PreprocessSettings(user_core=3, item_core=0))
    deduped = preprocess(raw, PreprocessSettings(user_core=3, item_core=0, dedup="first"))
    assert kept.stats["users"] == 2
    assert deduped.user_map["raw_id"].tolist() == ["2"]


def test_numeric_ids_are_numbered_in_numeric_order() -> None:
    raw = _frame([(10, 100, 1), (9, 20, 2), (100, 3, 3)])
    out = preprocess(raw, NO_FILTER)
    assert out.user_map["raw_id"].tolist() == ["9", "10", "100"]
    assert out.item_map["raw_id"].tolist() == ["3", "20", "100"]
    assert out.user_map["user_id"].tolist() == [1, 2, 3]
    assert out.user_map["user_id"].dtype == np.int32
    # Python ints in an object column count as numeric too.
    as_objects = raw.astype({"user": object, "item": object})
    assert preprocess(as_objects, NO_FILTER).user_map["raw_id"].tolist() == ["9", "10", "100"]


def test_string_ids_are_numbered_in_lexicographic_order() -> None:
    raw = _frame([("carol", "x9", 1), ("alice", "x10", 2), ("bob", "x9", 3)])
    out = preprocess(raw, NO_FILTER)
    assert out.user_map["raw_id"].tolist() == ["alice", "bob", "carol"]
    assert out.item_map["raw_id"].tolist() == ["x10", "x9"]
    assert _raw_pairs(out) == [("alice", "x10"), ("bob", "x9"), ("carol", "x9")]


def test_mixed_type_ids_are_compared_as_text() -> None:
    raw = _frame([(2, "b", 1), ("a", 1, 2)]).astype({"user": object, "item": object})
    out = preprocess(raw, NO_FILTER)
    assert out.user_map["raw_id"].tolist() == ["2", "a"]
    assert out.item_map["raw_id"].tolist() == ["1", "b"]


def test_ids_are_dense_after_filtering() -> None:
    out = preprocess(CASCADE, PreprocessSettings(user_core=3, item_core=2))
    inter = out.interactions
    assert sorted(inter["user_id"].unique()) == list(range(1, out.stats["users"] + 1))
    assert sorted(inter["item_id"].unique()) == list(range(1, out.stats["items"] + 1))
    assert inter["user_id"].dtype == np.int32 and inter["item_id"].dtype == np.int32
    assert inter["timestamp"].dtype == np.int64


def test_sorted_by_user_then_time_with_stable_ties() -> None:
    raw = _frame(
        [
            ("b", "late", 30),
            ("a", "x", 5),
            ("b", "tie1", 20),
            ("b", "early", 10),
            ("b", "tie2", 20),
            ("a", "y", 1),
            ("b", "tie3", 20),
        ]
    )
    out = preprocess(raw, NO_FILTER)
    assert _raw_pairs(out) == [
        ("a", "y"),
        ("a", "x"),
        ("b", "early"),
        ("b", "tie1"),
        ("b", "tie2"),
        ("b", "tie3"),
        ("b", "late"),
    ]
    assert out.interactions["timestamp"].tolist() == [1, 5, 10, 20, 20, 20, 30]
    assert isinstance(out.interactions.index, pd.RangeIndex)


def test_huge_timestamp_range_still_sorts_stably() -> None:
    # Spans too wide for the single-key sort exercise the fallback.
    big = np.iinfo(np.int64).max // 2
    raw = _frame([(2, 1, big), (1, 2, -big), (2, 3, -big), (2, 4, big), (1, 5, 0)])
    out = preprocess(raw, NO_FILTER)
    assert _raw_pairs(out) == [("1", "2"), ("1", "5"), ("2", "3"), ("2", "1"), ("2", "4")]


def test_stats_values() -> None:
    # Lengths per user: 1, 2, 3, 4 (10 interactions), over 4 items.
    rows = [(u, i, t) for u in range(1, 5) for t, i in enumerate(range(1, u + 1))]
    out = preprocess(_frame(rows), NO_FILTER)
    stats = out.stats
    assert (stats["users"], stats["items"], stats["interactions"]) == (4, 4, 10)
    assert stats["density"] == pytest.approx(10 / 16)
    assert stats["sequence_length"] == {
        "min": 1,
        "p25": 1.75,
        "p50": 2.5,
        "p75": 3.25,
        "p90": 3.7,
        "max": 4,
        "mean": 2.5,
    }
    assert stats["settings"] == {
        "min_rating": None,
        "user_core": 0,
        "item_core": 0,
        "iterative_core": True,
        "dedup": "keep",
        "min_seq_len": 0,
        "max_seq_len": None,
    }


@pytest.mark.parametrize(
    ("settings", "step"),
    [
        (PreprocessSettings(min_rating=6), "rating filter (min_rating=6.0)"),
        (PreprocessSettings(user_core=10, item_core=1), "k-core filter (user_core=10"),
        (PreprocessSettings(user_core=1, item_core=10, iterative_core=False), "one pass"),
    ],
)
def test_empty_result_names_the_step(settings: PreprocessSettings, step: str) -> None:
    raw = _frame([(1, 1, 1, 5.0), (1, 2, 2, 4.0), (2, 1, 3, 3.0)], with_rating=True)
    with pytest.raises(EmptyDatasetError, match="removed all 3 interactions") as info:
        preprocess(raw, settings)
    assert step in str(info.value)


def test_empty_input_is_an_error() -> None:
    with pytest.raises(EmptyDatasetError, match="raw source"):
        preprocess(_frame([]), NO_FILTER)


def test_bad_frames_are_reported() -> None:
    raw = _frame([(1, 1, 1)])
    # A frame without timestamps is in time order (test below); users and items are required.
    with pytest.raises(DataError, match=r"lacks column\(s\) \['user'\]"):
        preprocess(raw.drop(columns="user"), NO_FILTER)
    with pytest.raises(DataError, match="needs a 'rating' column"):
        preprocess(raw, PreprocessSettings(min_rating=3))
    with pytest.raises(DataError, match="integer seconds"):
        preprocess(raw.astype({"timestamp": float}), NO_FILTER)
    with pytest.raises(DataError, match="'user' has 1 missing values"):
        preprocess(_frame([(None, 1, 1)]), NO_FILTER)


def test_a_frame_without_timestamps_keeps_its_row_order() -> None:
    raw = _frame([("b", 1, 0), ("a", 2, 0), ("b", 3, 0), ("a", 1, 0), ("b", 2, 0)])
    out = preprocess(raw.drop(columns="timestamp"), NO_FILTER)
    assert _raw_pairs(out) == [("a", "2"), ("a", "1"), ("b", "1"), ("b", "3"), ("b", "2")]
    assert out.interactions["timestamp"].tolist() == [1, 3, 0, 2, 4]
    assert out.stats["timestamp"] == "row position"
    assert preprocess(raw, NO_FILTER).stats["timestamp"] == "seconds"


def test_settings_are_validated_and_normalised() -> None:
    with pytest.raises(ValueError, match="dedup"):
        PreprocessSettings(dedup="random")
    with pytest.raises(ValueError, match="core sizes"):
        PreprocessSettings(user_core=-1)
    assert PreprocessSettings(min_rating=4) == PreprocessSettings(min_rating=4.0)
    assert PreprocessSettings(min_rating=4).to_dict()["min_rating"] == 4.0


@pytest.mark.parametrize(
    ("seed", "dedup", "iterative"),
    list(itertools.product(range(3), ("keep", "first", "last"), (True, False))),
)
def test_matches_the_loop_reference_on_random_frames(
    seed: int, dedup: str, iterative: bool
) -> None:
    rng = np.random.default_rng(seed)
    n = 400
    raw = pd.DataFrame(
        {
            "user": rng.integers(0, 40, n).astype(str),
            "item": rng.integers(0, 30, n).astype(str),
            "timestamp": rng.integers(0, 20, n).astype(np.int64),  # many ties
            "rating": rng.integers(1, 6, n).astype(float),
        }
    )
    settings = PreprocessSettings(
        min_rating=2, user_core=4, item_core=5, dedup=dedup, iterative_core=iterative
    )
    out = preprocess(raw, settings)
    expected = _reference(raw, settings)
    assert _raw_pairs(out) == [(u, i) for u, i, _ in expected]
    assert out.interactions["timestamp"].tolist() == [t for _, _, t in expected]


@pytest.mark.slow
def test_a_million_rows_keep_the_invariants() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    raw = pd.DataFrame(
        {
            "user": rng.integers(0, 50_000, n),
            "item": rng.zipf(1.3, n) % 20_000,
            "timestamp": rng.integers(0, 10**9, n),
        }
    )
    out = preprocess(raw, PreprocessSettings(dedup="first"))
    user_id = out.interactions["user_id"].to_numpy()
    assert (np.diff(user_id) >= 0).all()
    assert out.stats["sequence_length"]["min"] >= 5


def test_max_seq_len_keeps_the_most_recent_interactions() -> None:
    # User a: 5 interactions (written out of order), user b: 2.
    raw = _frame([("a", f"x{t}", t) for t in (3, 1, 5, 2, 4)] + [("b", "y1", 1), ("b", "y2", 2)])
    out = preprocess(raw, PreprocessSettings(user_core=0, item_core=0, max_seq_len=3))
    assert _raw_pairs(out) == [("a", "x3"), ("a", "x4"), ("a", "x5"), ("b", "y1"), ("b", "y2")]
    assert out.stats["rows_after_step"]["max_seq_len"] == 5
    assert out.stats["items"] == 5  # items seen only in the dropped past are gone too


def test_min_seq_len_drops_short_users_after_the_core() -> None:
    raw = _frame([("a", "x", 1), ("a", "y", 2), ("a", "z", 3), ("b", "x", 1), ("b", "y", 2)])
    out = preprocess(raw, PreprocessSettings(user_core=0, item_core=0, min_seq_len=3))
    assert out.user_map["raw_id"].tolist() == ["a"]
    assert out.stats["rows_after_step"]["min_seq_len"] == 3
    # A cap below the minimum length could only empty the data: it is refused.
    with pytest.raises(ValueError, match="max_seq_len must be >= max"):
        PreprocessSettings(min_seq_len=3, max_seq_len=2)
    with pytest.raises(EmptyDatasetError, match=r"sequence length filter \(min_seq_len=4\)"):
        preprocess(raw, PreprocessSettings(user_core=0, item_core=0, min_seq_len=4))


def test_categorical_ids_are_used_as_they_are() -> None:
    # Categories in no particular order, with one that never occurs.
    users = pd.Categorical(["b", "a", "b"], categories=["b", "zz", "a"])
    items = pd.Categorical([30, 4, 4], categories=[30, 4])
    raw = pd.DataFrame({"user": users, "item": items, "timestamp": np.array([5, 7, 3])})
    out = preprocess(raw, NO_FILTER)
    assert out.user_map["raw_id"].tolist() == ["a", "b"]
    assert out.item_map["raw_id"].tolist() == ["4", "30"]
    assert _raw_pairs(out) == [("a", "4"), ("b", "4"), ("b", "30")]
    with pytest.raises(DataError, match="'user' has 1 missing values"):
        preprocess(raw.assign(user=pd.Categorical(["a", None, "b"])), NO_FILTER)
