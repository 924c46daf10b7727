"""Raw time and rating columns as typed arrays: ``int64`` seconds since the epoch, ``float32``
ratings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recsys_midx.data.errors import BadValueError, DataError

# A time of day followed by a zone ("...23:55:27Z", "...23:55:27.5+02:00"); the time is part of
# the pattern so that a date's "-01" is not taken for an offset.
_ZONED = r"[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)$"
_TIME_EXPECTED = "seconds since the epoch or an ISO 8601 date/time"


def to_seconds(values: pa.Array, path: Path, column: str, rows_before: int) -> np.ndarray:
    """Times as ``int64`` seconds since the epoch (fractions of a second are dropped).

    Args:
        values: a batch of the time column: integers, floats, timestamps, dates or text (all
            numbers, or ISO 8601 dates/times; without a zone offset a time is UTC).
        path: the file, for error messages.
        column: the raw column, for error messages.
        rows_before: data rows of the file before this batch, for error messages.

    Returns:
        ``int64 [len(values)]`` seconds.

    Raises:
        BadValueError: a text value is neither a number nor an ISO 8601 date/time.
        DataError: the column has a type that is not a time.
    """
    kind = values.type
    if pa.types.is_integer(kind):
        return values.cast(pa.int64()).to_numpy()
    if pa.types.is_floating(kind):
        return _floor_seconds(values.cast(pa.float64()), path, column, rows_before)
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        micros = values.cast(pa.timestamp("us", tz=getattr(kind, "tz", None)))
        return np.floor_divide(micros.cast(pa.int64()).to_numpy(), 1_000_000)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{path}: column {column!r} holds {kind}, not times")
    try:
        return _text_seconds(values)
    except (pa.ArrowInvalid, ValueError):
        bad = _first_failure(values, _text_seconds)
        raise BadValueError(
            path, column, rows_before + bad + 1, str(values[bad].as_py()), _TIME_EXPECTED
        ) from None


def _text_seconds(values: pa.Array) -> np.ndarray:
    """Parse text times: all numbers, or all ISO 8601; raises ArrowInvalid/ValueError otherwise."""
    try:
        return values.cast(pa.int64()).to_numpy()
    except pa.ArrowInvalid:
        pass
    try:
        numbers = values.cast(pa.float64())
    except pa.ArrowInvalid:
        return _iso_seconds(values)
    if not pc.all(pc.is_finite(numbers)).as_py():
        raise ValueError("not a finite number")
    return np.floor(numbers.to_numpy()).astype(np.int64)


def _iso_seconds(values: pa.Array) -> np.ndarray:
    """Parse ISO 8601 text; values without a zone offset are UTC."""
    try:
        parsed = values.cast(pa.timestamp("us"))
    except pa.ArrowInvalid:
        # Values with a zone ("Z", "+02:00") only parse as zoned timestamps, the others only as
        # naive ones: parse each kind with its own type.
        zoned = pc.match_substring_regex(values, _ZONED).to_numpy(zero_copy_only=False)
        micros = np.empty(len(values), dtype=np.int64)
        for mask, kind in ((zoned, pa.timestamp("us", tz="UTC")), (~zoned, pa.timestamp("us"))):
            if mask.any():
                subset = values.filter(pa.array(mask)).cast(kind)
                micros[mask] = subset.cast(pa.int64()).to_numpy()
        return np.floor_divide(micros, 1_000_000)
    return np.floor_divide(parsed.cast(pa.int64()).to_numpy(), 1_000_000)


def _floor_seconds(values: pa.Array, path: Path, column: str, rows_before: int) -> np.ndarray:
    numbers = values.to_numpy(zero_copy_only=False)
    finite = np.isfinite(numbers)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise BadValueError(path, column, rows_before + bad + 1, str(numbers[bad]), _TIME_EXPECTED)
    return np.floor(numbers).astype(np.int64)


def _first_failure(values: pa.Array, convert: Callable[[pa.Array], Any]) -> int:
    """Index of the value at which ``convert`` first fails on a prefix of ``values``.

    Bisects on prefixes, so it costs O(n log n) vectorised work instead of a Python loop.
    """
    good, bad = 0, len(values)  # convert(values[:good]) succeeds, convert(values[:bad]) fails
    while bad - good > 1:
        middle = (good + bad) // 2
        try:
            convert(values.slice(0, middle))
            good = middle
        except (pa.ArrowInvalid, ValueError):
            bad = middle
    return bad - 1


def to_ratings(values: pa.Array, path: Path) -> np.ndarray:
    """Ratings as ``float32`` (NaN where empty).

    Args:
        values: a batch of the rating column (numbers, or text holding numbers).
        path: the file, for error messages.

    Returns:
        ``float32 [len(values)]`` ratings.

    Raises:
        DataError: a value is not a number.
    """
    try:
        return values.cast(pa.float32()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise DataError(f"{path}: ratings must be numbers ({e})") from e
