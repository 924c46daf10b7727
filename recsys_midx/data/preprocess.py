"""Turn a raw interaction frame into filtered, chronologically sorted interactions with dense ids.

A raw frame without a ``timestamp`` column is taken to be in time order: each row's position
(0, 1, ...) becomes its timestamp, so every step that orders by time keeps the rows' order.

The steps run in a fixed order: rating threshold, de-duplication of (user, item) pairs, k-core
filtering, truncation of each user's sequence to its most recent ``max_seq_len`` interactions, and
removal of users left with fewer than ``min_seq_len``; then users and items get dense ids ``1..U``
and ``1..N`` (``0`` is padding) assigned in ascending order of their raw ids. Everything is
vectorised (numpy/pandas) and sorts only what it must (the rows that survive the k-core, the raw
ids of the users and items that remain), so tens of millions of rows take seconds, not minutes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from recsys_midx.data.errors import DataError, EmptyDatasetError

log = logging.getLogger(__name__)

_DEDUP_POLICIES = ("keep", "first", "last")
_QUANTILES = {"p25": 25, "p50": 50, "p75": 75, "p90": 90}

#: ``stats["timestamp"]``: what the processed timestamps count.
TIMESTAMP_SECONDS = "seconds"
TIMESTAMP_ROW_POSITION = "row position"


@dataclass(frozen=True)
class PreprocessSettings:
    """How raw interactions are filtered.

    Attributes:
        min_rating: keep rows with ``rating >= min_rating``; None keeps every row (implicit
            feedback) and then a rating column is not needed.
        user_core: users need at least this many interactions (0 or 1 disables the filter).
        item_core: items need at least this many interactions (0 or 1 disables the filter).
        iterative_core: repeat the k-core filter until no user or item falls below its threshold
            (the true k-core); False makes one pass, users first, then items.
        dedup: repeated (user, item) pairs: ``"keep"`` them all, or keep only the ``"first"``
            or ``"last"`` one in time.
        min_seq_len: after the k-core filter (and truncation), drop users with fewer
            interactions than this (0 keeps everyone). Unlike ``user_core`` it does not cascade
            to items.
        max_seq_len: after the k-core filter, keep only each user's most recent ``max_seq_len``
            interactions (None keeps all). Items are not re-checked against ``item_core``.

    Raises:
        ValueError: on a negative core or length, ``max_seq_len < max(min_seq_len, 1)``, or an
            unknown dedup policy.
    """

    min_rating: float | None = None
    user_core: int = 5
    item_core: int = 5
    iterative_core: bool = True
    dedup: str = "keep"
    min_seq_len: int = 0
    max_seq_len: int | None = None

    def __post_init__(self) -> None:
        # Configs may give 4 for 4.0 (or "5" from a command line); normalise so that equal
        # settings always hash to the same cache key.
        if self.min_rating is not None:
            object.__setattr__(self, "min_rating", float(self.min_rating))
        object.__setattr__(self, "user_core", int(self.user_core))
        object.__setattr__(self, "item_core", int(self.item_core))
        object.__setattr__(self, "min_seq_len", int(self.min_seq_len))
        if self.max_seq_len is not None:
            object.__setattr__(self, "max_seq_len", int(self.max_seq_len))
        if self.user_core < 0 or self.item_core < 0:
            raise ValueError(
                f"core sizes must be >= 0, got user_core={self.user_core}, "
                f"item_core={self.item_core}"
            )
        if self.min_seq_len < 0:
            raise ValueError(f"min_seq_len must be >= 0, got {self.min_seq_len}")
        if self.max_seq_len is not None and self.max_seq_len < max(self.min_seq_len, 1):
            raise ValueError(
                f"max_seq_len must be >= max(min_seq_len, 1), got max_seq_len="
                f"{self.max_seq_len}, min_seq_len={self.min_seq_len}"
            )
        if self.dedup not in _DEDUP_POLICIES:
            raise ValueError(f"dedup must be one of {_DEDUP_POLICIES}, got {self.dedup!r}")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-compatible dict."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, eq=False)
class ProcessedData:
    """The result of :func:`preprocess`.

    Attributes:
        interactions: ``user_id`` (int32, 1..U), ``item_id`` (int32, 1..N), ``timestamp``
            (int64 seconds, or the row's position in the raw frame when it has no time),
            ``rating`` (float32, NaN when the source has none); sorted by ``user_id`` then
            ``timestamp``, ties in the order of the raw frame.
        user_map: ``user_id`` (int32) -> ``raw_id`` (string), one row per user, by ``user_id``.
        item_map: ``item_id`` (int32) -> ``raw_id`` (string), one row per item, by ``item_id``.
        stats: sizes, density, sequence-length quantiles, rows left after each step, settings,
            and ``timestamp``: :data:`TIMESTAMP_SECONDS` or :data:`TIMESTAMP_ROW_POSITION`.
    """

    interactions: pd.DataFrame
    user_map: pd.DataFrame
    item_map: pd.DataFrame
    stats: dict[str, Any]


def preprocess(raw: pd.DataFrame, settings: PreprocessSettings) -> ProcessedData:
    """Filter raw interactions and give users and items dense ids.

    Args:
        raw: columns ``user`` and ``item`` (ints or strings, also as a ``Categorical`` or an
            Arrow dictionary column), optionally ``timestamp`` (integer seconds; without it the
            rows are taken to be in time order and their positions become the timestamps) and
            optionally ``rating`` (float).
        settings: the filters to apply.

    Returns:
        The processed interactions, the id maps and statistics.

    Raises:
        DataError: a required column is missing, has missing values or the wrong type, or
            ``min_rating`` is set but there is no rating column.
        EmptyDatasetError: a step (named in the message) removed every interaction.

    Example:
        >>> raw = pd.DataFrame({"user": ["b", "a", "a"], "item": [10, 2, 10],
        ...                     "timestamp": [5, 7, 3]})
        >>> out = preprocess(raw, PreprocessSettings(user_core=0, item_core=0))
        >>> out.interactions[["user_id", "item_id", "timestamp"]].values.tolist()
        [[1, 2, 3], [1, 1, 7], [2, 2, 5]]
    """
    start = time.perf_counter()
    _check_columns(raw, settings)
    steps: dict[str, int] = {"input": len(raw)}
    if len(raw) == 0:
        raise EmptyDatasetError("the raw source", 0)

    # Work on integer codes, numbered in any order: the users are put in raw-id order after the
    # k-core filter and the items at the end, so only the survivors' raw ids are ever sorted.
    user_codes, user_raw = _codes(raw["user"])
    item_codes, item_raw = _codes(raw["item"])
    timed = "timestamp" in raw.columns
    rows = {
        "user": user_codes,
        "item": item_codes,
        "timestamp": (
            raw["timestamp"].to_numpy(np.int64) if timed else np.arange(len(raw), dtype=np.int64)
        ),
        "rating": (
            raw["rating"].to_numpy(np.float32)
            if "rating" in raw.columns
            else np.full(len(raw), np.nan, dtype=np.float32)
        ),
    }
    # Without our reference, a frame passed as a temporary (as the pipeline does) is freed as
    # soon as the steps below replace its columns: tens of millions of rows need that headroom.
    del raw

    if settings.min_rating is not None:
        # Compare in float32 like the stored ratings: 4.1 must pass min_rating=4.1.
        _keep(
            rows,
            rows["rating"] >= np.float32(settings.min_rating),
            f"rating filter (min_rating={settings.min_rating})",
        )
    steps["rating"] = len(rows["user"])

    if settings.dedup != "keep":
        # "first"/"last" are meant in time: order each user's rows chronologically first.
        _select(rows, _chronological_order(rows["user"], rows["timestamp"]))
        pairs = pd.Series(rows["user"] * np.int64(len(item_raw)) + rows["item"])
        _keep(
            rows,
            ~pairs.duplicated(keep=settings.dedup).to_numpy(),
            f"dedup (dedup={settings.dedup!r})",
        )
    steps["dedup"] = len(rows["user"])

    core, passes = _k_core(rows["user"], rows["item"], len(user_raw), len(item_raw), settings)
    _keep(rows, core, _describe_core(settings))
    steps["k_core"] = len(rows["user"])

    # Sorting after the k-core sorts only the rows that survive it. The sort is stable, so equal
    # times keep the raw order (which the dedup sort above preserved as well).
    rows["user"], user_raw = _rank(rows["user"], user_raw)
    _select(rows, _chronological_order(rows["user"], rows["timestamp"]))

    if settings.max_seq_len is not None:
        _keep(rows, _most_recent(rows["user"], settings.max_seq_len), "max_seq_len")
    steps["max_seq_len"] = len(rows["user"])
    if settings.min_seq_len > 1:
        lengths = np.bincount(rows["user"], minlength=len(user_raw))
        _keep(
            rows,
            lengths[rows["user"]] >= settings.min_seq_len,
            f"sequence length filter (min_seq_len={settings.min_seq_len})",
        )
    steps["min_seq_len"] = len(rows["user"])

    # Users are ranked already, so their dense ids keep the rows' order.
    rows["user"], user_map = _dense_ids(rows["user"], user_raw, "user_id")
    rows["item"], item_map = _dense_ids(rows["item"], item_raw, "item_id")
    user_id = rows["user"]
    interactions = pd.DataFrame(
        {
            "user_id": user_id,
            "item_id": rows["item"],
            "timestamp": rows["timestamp"],
            "rating": rows["rating"],
        },
        copy=False,
    )
    stats = _stats(user_id, len(user_map), len(item_map), steps, passes, settings)
    stats["timestamp"] = TIMESTAMP_SECONDS if timed else TIMESTAMP_ROW_POSITION
    log.info(
        "Preprocessed %d raw rows -> %d users, %d items, %d interactions in %.1f s",
        steps["input"],
        stats["users"],
        stats["items"],
        stats["interactions"],
        time.perf_counter() - start,
    )
    return ProcessedData(interactions, user_map, item_map, stats)


def _check_columns(raw: pd.DataFrame, settings: PreprocessSettings) -> None:
    """Raise a DataError describing the first problem with the raw frame's columns."""
    missing = [c for c in ("user", "item") if c not in raw.columns]
    if missing:
        raise DataError(f"raw frame lacks column(s) {missing}; it has {list(raw.columns)}")
    if settings.min_rating is not None and "rating" not in raw.columns:
        raise DataError(
            f"min_rating={settings.min_rating} needs a 'rating' column, but the raw frame has "
            f"only {list(raw.columns)}"
        )
    if "timestamp" in raw.columns and not pd.api.types.is_integer_dtype(raw["timestamp"]):
        raise DataError(
            f"'timestamp' must hold integer seconds, got dtype {raw['timestamp'].dtype}"
        )
    for column in [c for c in ("user", "item", "timestamp") if c in raw.columns]:
        nulls = int(raw[column].isna().sum())
        if nulls:
            raise DataError(f"column {column!r} has {nulls} missing values")


def _codes(column: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """Integer codes of a raw id column and the unique raw ids they index (in any order).

    Codes are ``int32`` (a catalogue never has 2**31 ids): on tens of millions of rows that
    halves the memory of the two code columns; arithmetic on them goes through ``np.int64``.
    """
    if isinstance(column.dtype, pd.ArrowDtype) and pa.types.is_dictionary(
        column.dtype.pyarrow_dtype
    ):
        # Streamed sources deliver text ids dictionary-encoded: reuse the codes instead of
        # hashing the values again.
        encoded = pa.array(column.array)
        return (
            encoded.indices.to_numpy().astype(np.int32, copy=False),
            pd.Index(encoded.dictionary.to_pandas()),
        )
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy().astype(np.int32, copy=False), column.cat.categories
    if pd.api.types.is_object_dtype(column) and pd.api.types.infer_dtype(column) == "integer":
        column = column.astype(np.int64)
    elif not (pd.api.types.is_numeric_dtype(column) or pd.api.types.is_string_dtype(column)):
        # Mixed columns (e.g. ints and strings) cannot be sorted as they are; compare as text.
        column = column.astype(str)
    codes, uniques = pd.factorize(column)
    return codes.astype(np.int32), pd.Index(uniques)


def _chronological_order(users: np.ndarray, timestamps: np.ndarray) -> np.ndarray:
    """Stable sort order by user, then timestamp: equal timestamps keep their row order."""
    start = int(timestamps.min())
    span = int(timestamps.max()) - start + 1
    if (int(users.max()) + 1) * span < 2**63:
        # A single int64 key sorts faster than lexsort's two passes, and the stable sort
        # (timsort) is linear on the already sorted files many datasets ship.
        key = users * np.int64(span)
        key += timestamps
        key -= start
        return np.argsort(key, kind="stable")
    return np.lexsort((timestamps, users))


def _most_recent(users: np.ndarray, limit: int) -> np.ndarray:
    """Mask of each user's last ``limit`` rows, for rows grouped by user in time order."""
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    lengths = np.diff(np.r_[starts, len(users)])
    position_from_end = np.repeat(starts + lengths, lengths) - np.arange(len(users))
    return position_from_end <= limit


def _select(rows: dict[str, np.ndarray], index: np.ndarray) -> None:
    """Index every column in place, one column at a time: only one is ever held twice."""
    for name in rows:
        rows[name] = rows[name][index]


def _keep(rows: dict[str, np.ndarray], mask: np.ndarray, step: str) -> None:
    """Keep the rows selected by ``mask`` (in place); EmptyDatasetError naming ``step`` if none."""
    if not mask.any():
        raise EmptyDatasetError(step, len(mask))
    if not mask.all():
        _select(rows, mask)


def _describe_core(settings: PreprocessSettings) -> str:
    mode = "iterative" if settings.iterative_core else "one pass"
    return f"k-core filter (user_core={settings.user_core}, item_core={settings.item_core}, {mode})"


def _k_core(
    users: np.ndarray,
    items: np.ndarray,
    num_users: int,
    num_items: int,
    settings: PreprocessSettings,
) -> tuple[np.ndarray, int]:
    """Mask of the rows that survive the k-core filter, and the number of passes it took.

    One pass drops users below ``user_core``, then items below ``item_core`` among the remaining
    rows. The iterative filter repeats passes until one removes nothing; the result (the largest
    subset in which every user and item meets its threshold) does not depend on the order.
    """
    keep = np.ones(len(users), dtype=bool)
    if settings.user_core <= 1 and settings.item_core <= 1:
        return keep, 0
    # Passes work on the surviving rows only: on sparse data the first pass removes most rows,
    # and the later ones then cost a fraction of it.
    alive = np.arange(len(users), dtype=np.int32 if len(users) < 2**31 else np.int64)
    columns = [
        (ids, size, core)
        for ids, size, core in (
            (users, num_users, settings.user_core),
            (items, num_items, settings.item_core),
        )
        if core > 1
    ]
    passes = 0
    while True:
        passes += 1
        before = len(alive)
        for position in range(len(columns)):
            ids, size, core = columns[position]
            survives = np.bincount(ids, minlength=size)[ids] >= core
            if not survives.all():
                alive = alive[survives]
                columns = [
                    (other[survives], other_size, other_core)
                    for other, other_size, other_core in columns
                ]
        if not settings.iterative_core or len(alive) in (before, 0):
            keep[:] = False
            keep[alive] = True
            return keep, passes


def _rank(codes: np.ndarray, raw_ids: pd.Index) -> tuple[np.ndarray, pd.Index]:
    """Renumber the codes that occur 0..K-1 in ascending raw-id order.

    Raw ids compare as numbers when they are numbers, as text otherwise. Only the ids that
    occur are sorted.

    Returns:
        The new codes and the raw id of each (a sorted index of K ids).
    """
    present = np.flatnonzero(np.bincount(codes, minlength=len(raw_ids)))
    present = present[raw_ids[present].argsort()]
    lookup = np.zeros(len(raw_ids), dtype=np.int32)
    lookup[present] = np.arange(len(present), dtype=np.int32)
    return lookup[codes], raw_ids[present]


def _dense_ids(
    codes: np.ndarray, raw_ids: pd.Index, id_column: str
) -> tuple[np.ndarray, pd.DataFrame]:
    """Dense ids 1..K in ascending raw-id order for the codes that occur, and the id map."""
    ranks, ordered = _rank(codes, raw_ids)
    mapping = pd.DataFrame(
        {
            id_column: np.arange(1, len(ordered) + 1, dtype=np.int32),
            "raw_id": ordered.astype(str),
        }
    )
    return ranks + np.int32(1), mapping


def _stats(
    user_id: np.ndarray,
    num_users: int,
    num_items: int,
    steps: dict[str, int],
    passes: int,
    settings: PreprocessSettings,
) -> dict[str, Any]:
    """JSON-compatible statistics of the processed interactions."""
    lengths = np.bincount(user_id, minlength=num_users + 1)[1:]
    sequence_length: dict[str, float] = {"min": int(lengths.min())}
    sequence_length.update(
        {name: float(np.percentile(lengths, q)) for name, q in _QUANTILES.items()}
    )
    sequence_length.update({"max": int(lengths.max()), "mean": float(lengths.mean())})
    interactions = len(user_id)
    return {
        "users": num_users,
        "items": num_items,
        "interactions": interactions,
        "density": interactions / (num_users * num_items),
        "sequence_length": sequence_length,
        "rows_after_step": steps,
        "core_passes": passes,
        "settings": settings.to_dict(),
    }
