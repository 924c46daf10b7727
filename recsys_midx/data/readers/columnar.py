"""Columns assembled batch by batch: values copied into a few large segments, and ids kept as
integers or as codes into a dictionary of the distinct ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys_midx.data.errors import DataError

# Decimal integers in canonical form (no "+", no "-0", no leading zeros) that fit in int64: ids
# made only of these are ordered numerically, and printing the number gives back the raw id.
_CANONICAL_INT = r"^(0|-?[1-9][0-9]{0,17})$"


class ColumnBuffer:
    """A column assembled from batches, copied on arrival into a few large segments.

    Copying a batch lets Arrow reuse its memory for the next batch. Segments grow geometrically
    (each as large as everything before it, up to 8M values), so a small file costs little and a
    large one is held in a handful of big allocations, which the allocator returns to the system
    as soon as :meth:`finish` has joined them: at the peak a column is held about twice, one
    column at a time.

    Args:
        dtype: the numpy type of the values.

    Example:
        >>> column = ColumnBuffer(np.int64)
        >>> column.extend(np.arange(3)); column.extend(np.arange(2))
        >>> column.finish().tolist()
        [0, 1, 2, 0, 1]
    """

    _FIRST, _LARGEST = 1 << 16, 1 << 23

    def __init__(self, dtype: type) -> None:
        self._dtype = dtype
        self._segments: list[np.ndarray] = []
        self._free = 0  # unused values at the end of the last segment
        self.size = 0

    def extend(self, values: np.ndarray) -> None:
        """Append ``values`` (copied; the caller may reuse their memory)."""
        done = 0
        while done < len(values):
            if self._free == 0:
                length = min(self._LARGEST, max(self._FIRST, self.size))
                self._segments.append(np.empty(length, dtype=self._dtype))
                self._free = length
            segment = self._segments[-1]
            start = len(segment) - self._free
            count = min(self._free, len(values) - done)
            segment[start : start + count] = values[done : done + count]
            self._free -= count
            done += count
        self.size += len(values)

    def finish(self) -> np.ndarray:
        """The whole column (the segments are released)."""
        segments, self._segments = self._segments, []
        if segments:
            segments[-1] = segments[-1][: len(segments[-1]) - self._free]
        self._free = 0
        return np.concatenate(segments) if segments else np.empty(0, dtype=self._dtype)


class IdColumn:
    """Accumulates one id column batch by batch: integers as they are, text as dictionary codes.

    Text batches are dictionary-encoded on arrival, so a row costs an ``int32`` code and each
    batch its distinct ids; :meth:`finish` merges the batch dictionaries into one.

    Example:
        >>> ids = IdColumn()
        >>> ids.add(pa.array(["b", "a"]), Path("f.csv"), "user")
        >>> ids.add(pa.array(["a", "c"]), Path("f.csv"), "user")
        >>> ids.finish().tolist()
        ['b', 'a', 'a', 'c']
    """

    def __init__(self) -> None:
        self._ints: ColumnBuffer | None = None
        self._codes: ColumnBuffer | None = None
        # (first row, dictionary) of each text batch.
        self._dictionaries: list[tuple[int, pa.Array]] = []

    def add(self, values: pa.Array, path: Path, column: str) -> None:
        """Append a batch of ids.

        Args:
            values: the batch: integers, or text (any other type is refused).
            path: the file, for error messages.
            column: the raw column, for error messages.

        Raises:
            DataError: the ids are floats or booleans.
        """
        if pa.types.is_integer(values.type) and self._codes is None:
            self._ints = self._ints or ColumnBuffer(np.int64)
            self._ints.extend(values.cast(pa.int64()).to_numpy())
            return
        if pa.types.is_floating(values.type) or pa.types.is_boolean(values.type):
            raise DataError(
                f"{path}: ids in column {column!r} must be integers or text, got {values.type}"
            )
        if self._codes is None:
            self._codes = ColumnBuffer(np.int32)
            if self._ints is not None:
                # Files that disagree (numbers here, text there): compare every id as text.
                self._add_text(pa.array(self._ints.finish()))
                self._ints = None
        self._add_text(values)

    def _add_text(self, values: pa.Array) -> None:
        assert self._codes is not None
        encoded = pc.dictionary_encode(values.cast(pa.string()))
        self._dictionaries.append((self._codes.size, encoded.dictionary))
        self._codes.extend(encoded.indices.to_numpy())

    def finish(self) -> np.ndarray | pd.arrays.ArrowExtensionArray:
        """``int64`` ids if every batch was integer, otherwise a dictionary-encoded column."""
        if self._codes is None:
            return self._ints.finish() if self._ints is not None else np.empty(0, np.int64)
        return _merge_dictionaries(self._codes.finish(), self._dictionaries)


def _merge_dictionaries(
    codes: np.ndarray, dictionaries: list[tuple[int, pa.Array]]
) -> pd.arrays.ArrowExtensionArray:
    """One dictionary-encoded column from batch-local codes and batch dictionaries.

    The dictionary lists the distinct ids in order of first appearance: sorting millions of
    them would cost more than the whole read, and preprocessing sorts only the survivors. It
    stays an Arrow dictionary (a pandas ``Categorical`` would re-check millions of ids for
    uniqueness).

    Args:
        codes: every row's code into its batch's dictionary; rewritten in place.
        dictionaries: (first row, dictionary) of each batch.
    """
    # Encoding the chunked dictionaries numbers their values globally: chunk i's indices map
    # batch i's local codes to global ones.
    merged = pc.dictionary_encode(pa.chunked_array([d for _, d in dictionaries], pa.string()))
    uniques = merged.chunk(0).dictionary
    if len(uniques) and pc.all(pc.match_substring_regex(uniques, _CANONICAL_INT)).as_py():
        uniques = uniques.cast(pa.int64())
    ends = [start for start, _ in dictionaries[1:]] + [len(codes)]
    for (start, _), end, local in zip(dictionaries, ends, merged.chunks):
        codes[start:end] = local.indices.to_numpy()[codes[start:end]]
    return pd.arrays.ArrowExtensionArray(pa.DictionaryArray.from_arrays(codes, uniques))
