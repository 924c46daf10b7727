"""Stream raw interaction files into a compact raw frame, whatever their format.

One reader serves every source: a *format* (:class:`Delimited`, :class:`JsonLines`,
:class:`Parquet`, :class:`PythonLiterals`) turns a file into a stream of Arrow record batches of
a bounded size, and :func:`read_interactions` folds the batches into typed arrays as they come.
The raw text is therefore never held in memory at once: ids become ``int64`` values (when the
format parses them as integers) or ``int32`` codes into a dictionary of the distinct ids, times
become ``int64`` seconds and ratings ``float32``, so memory follows the typed columns.

Compressed files (``.gz``, ``.bz2``, ``.zst``, ``.lz4``) are decompressed on the fly, and a
progress bar follows the bytes read when the output is a terminal.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import io
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from recsys_midx.data.errors import (
    BadValueError,
    CorruptArchiveError,
    DataError,
    MissingColumnsError,
)

log = logging.getLogger(__name__)

#: Bytes of text parsed per batch. pyarrow's streaming readers read many blocks ahead, so a small
#: block is what bounds the raw text in memory at once.
BLOCK_SIZE = 1 << 20
#: Lines parsed per batch by the formats that parse line by line in Python.
LINES_PER_BATCH = 65_536

_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}
_FIELDS = ("user", "item", "time", "rating")
# Decimal integers in canonical form (no "+", no "-0", no leading zeros) that fit in int64: ids
# made only of these are ordered numerically, and printing the number gives back the raw id.
_CANONICAL_INT = r"^(0|-?[1-9][0-9]{0,17})$"
# A time of day followed by a zone ("...23:55:27Z", "...23:55:27.5+02:00"); the time is part of
# the pattern so that a date's "-01" is not taken for an offset.
_ZONED = r"[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)$"
_TIME_EXPECTED = "seconds since the epoch or an ISO 8601 date/time"


@dataclass(frozen=True)
class ColumnMap:
    """Which raw column holds each field of an interaction.

    A field may name several columns: the first non-empty one of each row is taken (e.g. a track
    id, or the artist id where the track id is missing).

    Attributes:
        user: column(s) of the user id.
        item: column(s) of the item id.
        time: column(s) of the time: seconds since the epoch (integer or decimal) or an ISO 8601
            date or date-time (``2010-10-19``, ``2010-10-19 23:55:27``, ``2010-10-19T23:55:27Z``,
            with or without a zone offset; without one it is taken as UTC).
        rating: column(s) of the rating, or None when there is none.

    Example:
        >>> ColumnMap(user="uid", item="sku", time="ts").wanted()
        ['uid', 'sku', 'ts']
    """

    user: str | tuple[str, ...]
    item: str | tuple[str, ...]
    time: str | tuple[str, ...]
    rating: str | tuple[str, ...] | None = None

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> ColumnMap:
        """Build from a mapping such as a Hydra ``DictConfig`` (lists become tuples).

        Args:
            mapping: ``user``, ``item``, ``time`` and optionally ``rating``.

        Returns:
            The column map.

        Raises:
            ValueError: a field is unknown, or ``user``, ``item`` or ``time`` is missing.
        """
        fields = dict(mapping)
        unknown = sorted(set(fields) - set(_FIELDS))
        missing = [name for name in _FIELDS[:3] if not fields.get(name)]
        if unknown or missing:
            raise ValueError(
                f"columns must map user, item, time (and optionally rating); unknown: {unknown}, "
                f"missing: {missing}"
            )
        return cls(**{
            name: value if isinstance(value, str) or value is None else tuple(value)
            for name, value in fields.items()
        })

    def sources(self) -> dict[str, tuple[str, ...]]:
        """The raw columns of each mapped field, in order of preference."""
        out = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = (value,) if isinstance(value, str) else tuple(value)
        return out

    def wanted(self) -> list[str]:
        """Every raw column the map reads, each once, in field order."""
        return list(dict.fromkeys(c for columns in self.sources().values() for c in columns))

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (part of a source's fingerprint)."""
        return {name: list(columns) for name, columns in self.sources().items()}


class Format(Protocol):
    """How to read one kind of file as a stream of Arrow record batches."""

    def columns(self, path: Path) -> list[str]:
        """The names of the file's columns (for checking a column map before reading)."""

    def batches(
        self, path: Path, wanted: Sequence[str], advance: Callable[[int], None]
    ) -> Iterator[pa.RecordBatch]:
        """Batches of the ``wanted`` columns.

        ``advance`` is called with the number of bytes of the file (compressed bytes for a
        compressed file) consumed by each read, for progress reports.
        """


@dataclass(frozen=True)
class Delimited:
    """Delimited text (CSV, TSV, ``::``-separated...), read with pyarrow's streaming CSV reader.

    Attributes:
        delimiter: one character. A ``::`` separator is read with ``":"`` and ``names`` that
            skip the empty fields in between.
        header: the first line names the columns; otherwise ``names`` must.
        names: the column names of a file without a header line, one per field; a None entry
            names a field that is never read.
        quoted: fields may be quoted with ``"``; False for formats whose values contain quotes
            that are not quoting (names of songs, movie titles).
        int_columns: columns known to hold decimal integers, parsed as ``int64`` straight away
            (faster than text, and ids stay numbers); every other id is read as text.

    Example:
        >>> Delimited("\\t", header=False, names=("user", "item", None)).columns(Path("u.data"))
        ['user', 'item']
    """

    delimiter: str = ","
    header: bool = True
    names: tuple[str | None, ...] | None = None
    quoted: bool = True
    int_columns: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if len(self.delimiter) != 1:
            raise ValueError(f"the delimiter must be one character, got {self.delimiter!r}")
        if not self.header and not self.names:
            raise ValueError("a delimited file without a header line needs column names")

    def _column_names(self) -> list[str] | None:
        if self.header:
            return None
        assert self.names is not None
        return [name if name is not None else f"_unused{i}" for i, name in enumerate(self.names)]

    def columns(self, path: Path) -> list[str]:
        if not self.header:
            return [name for name in self._column_names() or () if not name.startswith("_unused")]
        with _open_text(path) as stream:
            line = stream.readline().decode("utf-8-sig", errors="replace").rstrip("\r\n")
        quoting = csv.QUOTE_MINIMAL if self.quoted else csv.QUOTE_NONE
        return next(csv.reader([line], delimiter=self.delimiter, quoting=quoting), [])

    def batches(
        self, path: Path, wanted: Sequence[str], advance: Callable[[int], None]
    ) -> Iterator[pa.RecordBatch]:
        types = {name: pa.int64() if name in self.int_columns else pa.string() for name in wanted}
        read_options = pacsv.ReadOptions(block_size=BLOCK_SIZE, column_names=self._column_names())
        parse_options = pacsv.ParseOptions(
            delimiter=self.delimiter, quote_char='"' if self.quoted else False,
        )
        # Only empty fields are missing: an id such as "NA" or "null" is a real id.
        convert_options = pacsv.ConvertOptions(
            include_columns=list(wanted), column_types=types, null_values=[""],
            strings_can_be_null=True, quoted_strings_can_be_null=False,
        )
        with _tracked_stream(path, advance) as stream:
            yield from pacsv.open_csv(stream, read_options, parse_options, convert_options)


@dataclass(frozen=True)
class JsonLines:
    """One JSON object per line; fields that are not read are skipped without being converted.

    The columns, and the type of each wanted field, are those of the first object, so a field
    must keep its JSON type (number or string) throughout the file.
    """

    def columns(self, path: Path) -> list[str]:
        return list(self._first_object(path))

    @staticmethod
    def _first_object(path: Path) -> dict[str, Any]:
        with _open_text(path) as stream:
            for line in stream:
                if line.strip():
                    try:
                        value = json.loads(line)
                    except ValueError as e:
                        raise DataError(f"{path}: the first line is not JSON ({e})") from e
                    if not isinstance(value, dict):
                        raise DataError(f"{path}: the first line is not a JSON object")
                    return value
        return {}

    def batches(
        self, path: Path, wanted: Sequence[str], advance: Callable[[int], None]
    ) -> Iterator[pa.RecordBatch]:
        first = self._first_object(path)
        schema = pa.schema([(name, _json_type(first.get(name))) for name in wanted])
        options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        with _tracked_stream(path, advance) as stream:
            yield from pajson.open_json(
                stream, read_options=pajson.ReadOptions(block_size=BLOCK_SIZE),
                parse_options=options,
            )


def _json_type(value: Any) -> pa.DataType:
    """The Arrow type that reads a JSON field whose first value is ``value``."""
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


@dataclass(frozen=True)
class Parquet:
    """A Parquet file, read in batches of at most ``batch_rows`` rows.

    Attributes:
        batch_rows: rows per batch.
    """

    batch_rows: int = 1 << 20

    def columns(self, path: Path) -> list[str]:
        try:
            return pq.read_schema(path).names
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{path} is not a readable Parquet file ({e})") from e

    def batches(
        self, path: Path, wanted: Sequence[str], advance: Callable[[int], None]
    ) -> Iterator[pa.RecordBatch]:
        size = path.stat().st_size
        with pq.ParquetFile(path) as parquet:
            rows, done, reported = max(parquet.metadata.num_rows, 1), 0, 0
            for batch in parquet.iter_batches(batch_size=self.batch_rows, columns=list(wanted)):
                # Parquet is read by column chunks, not front to back: count bytes pro rata.
                done += batch.num_rows
                advance(size * done // rows - reported)
                reported = size * done // rows
                yield batch


@dataclass(frozen=True)
class PythonLiterals:
    """One Python ``dict`` literal per line (single-quoted strings; not JSON).

    Each line is parsed with :func:`ast.literal_eval`, which evaluates literals only and never
    runs code.
    """

    def columns(self, path: Path) -> list[str]:
        with _open_text(path) as stream:
            for number, line in enumerate(stream, start=1):
                if line.strip():
                    return list(self._parse(path, number, line))
        return []

    @staticmethod
    def _parse(path: Path, number: int, line: bytes) -> dict[str, Any]:
        try:
            value = ast.literal_eval(line.decode("utf-8").strip())
        except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as e:
            raise DataError(
                f"{path}, line {number}: not a Python dict literal ({type(e).__name__}: {e}): "
                f"{line[:120]!r}"
            ) from e
        if not isinstance(value, dict):
            raise DataError(f"{path}, line {number}: not a Python dict literal: {line[:120]!r}")
        return value

    def batches(
        self, path: Path, wanted: Sequence[str], advance: Callable[[int], None]
    ) -> Iterator[pa.RecordBatch]:
        with _tracked_stream(path, advance, native=False) as stream:
            number, rows = 0, []
            for line in stream:
                number += 1
                if not line.strip():
                    continue
                record = self._parse(path, number, line)
                missing = [name for name in wanted if name not in record]
                if missing:
                    raise MissingColumnsError(path, missing, list(record))
                rows.append([record[name] for name in wanted])
                if len(rows) == LINES_PER_BATCH:
                    yield _rows_to_batch(rows, wanted)
                    rows = []
            if rows:
                yield _rows_to_batch(rows, wanted)


def _rows_to_batch(rows: list[list[Any]], names: Sequence[str]) -> pa.RecordBatch:
    """A record batch from row lists; values of mixed Python types are kept as text."""
    arrays = []
    for values in zip(*rows):
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arrays.append(pa.array([None if v is None else str(v) for v in values]))
    return pa.RecordBatch.from_arrays(arrays, names=list(names))


def format_for(path: Path) -> Format:
    """The format of a file, chosen by its name (a compression suffix is looked through).

    ``.csv`` is comma-separated with a header line, ``.tsv``/``.tab`` tab-separated with a header
    line, ``.parquet``/``.pq`` Parquet, ``.jsonl``/``.ndjson``/``.json`` JSON lines.

    Args:
        path: the file.

    Returns:
        The format.

    Raises:
        DataError: the suffix is none of those.
    """
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    suffix = suffixes[-1] if suffixes else ""
    if suffix == ".csv":
        return Delimited(",")
    if suffix in (".tsv", ".tab"):
        return Delimited("\t")
    if suffix in (".parquet", ".pq"):
        return Parquet()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return JsonLines()
    raise DataError(
        f"cannot tell the format of {path} from its name: expected .csv, .tsv, .parquet or "
        ".jsonl (optionally compressed); set the format explicitly"
    )


def read_interactions(
    paths: Sequence[Path] | Path,
    fmt: Format,
    columns: ColumnMap,
    *,
    drop_incomplete: bool = False,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Read interaction files into a raw frame, streaming them batch by batch.

    Args:
        paths: the file, or files read one after the other as if concatenated.
        fmt: their format.
        columns: which columns hold the user, item, time and rating.
        drop_incomplete: drop rows whose user, item or time is empty (their number is logged);
            by default an empty value is an error.
        progress: show a progress bar (None: only when the output is a terminal).

    Returns:
        Columns ``user`` and ``item`` (``int64`` when ``fmt`` parses them as integers, otherwise
        an Arrow dictionary column: ``int32`` codes into the distinct ids in order of
        appearance, which are integers when every id is a canonical decimal integer and strings
        otherwise), ``timestamp`` (``int64`` seconds) and, when mapped, ``rating``
        (``float32``, NaN where empty); rows in file order.

    Raises:
        MissingColumnsError: a mapped column is not in a file (the message lists those found).
        BadValueError: a time that is neither a number nor an ISO date (quoted in the message).
        CorruptArchiveError: a compressed file is truncated or corrupt.
        DataError: the files hold no rows, or any other unreadable content (the message names
            the file).

    Example:
        >>> raw = read_interactions(  # doctest: +SKIP
        ...     Path("ratings.csv"), Delimited(","),
        ...     ColumnMap(user="userId", item="movieId", time="timestamp", rating="rating"))
    """
    start = time.perf_counter()
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    sources = columns.sources()
    wanted = columns.wanted()
    ids = {name: _Ids() for name in ("user", "item")}
    times, ratings = _Buffer(np.int64), _Buffer(np.float32)
    rows, dropped = 0, 0
    with _Progress(paths, progress) as tracker:
        for path in paths:
            found = fmt.columns(path)
            missing = [name for name in wanted if name not in found]
            if missing:
                raise MissingColumnsError(path, missing, found)
            rows_before = 0
            with _errors_naming(path):
                for batch in fmt.batches(path, wanted, tracker.advance):
                    fields = {name: _coalesce(batch, names) for name, names in sources.items()}
                    keep = _complete_rows(fields, path, rows_before, drop_incomplete)
                    if keep is not None:
                        dropped += len(keep) - int(np.count_nonzero(keep))
                        mask = pa.array(keep)
                        fields = {name: values.filter(mask) for name, values in fields.items()}
                    rows += len(fields["time"])
                    for name in ("user", "item"):
                        ids[name].add(fields[name], path, sources[name][0])
                    times.extend(_seconds(fields["time"], path, sources["time"][0], rows_before))
                    if "rating" in fields:
                        ratings.extend(_ratings(fields["rating"], path))
                    rows_before += batch.num_rows
    if dropped:
        log.warning("Dropped %d rows without a user, item or time", dropped)
    if rows == 0:
        raise DataError(f"no interactions in {', '.join(str(p) for p in paths)}")
    data = {name: ids.pop(name).finish() for name in ("user", "item")}
    data["timestamp"] = times.finish()
    if "rating" in sources:
        data["rating"] = ratings.finish()
    log.info("Read %d interactions from %d file(s) in %.1f s", rows, len(paths),
             time.perf_counter() - start)
    # The frame takes the arrays as they are, without consolidating them into a copy.
    return pd.DataFrame(data, copy=False)


class _Progress:
    """A progress bar over the bytes of all the files."""

    def __init__(self, paths: Sequence[Path], enabled: bool | None) -> None:
        label = paths[0].name if len(paths) == 1 else f"{len(paths)} files"
        self._bar = tqdm(
            total=sum(path.stat().st_size for path in paths if path.is_file()), unit="B",
            unit_scale=True, desc=f"reading {label}", leave=False,
            disable=None if enabled is None else not enabled,
        )

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._bar.close()

    def advance(self, count: int) -> None:
        self._bar.update(count)


class _Buffer:
    """A column assembled from batches, copied on arrival into a few large segments.

    Copying a batch lets Arrow reuse its memory for the next batch. Segments grow geometrically
    (each as large as everything before it, up to 8M values), so a small file costs little and a
    large one is held in a handful of big allocations, which the allocator returns to the system
    as soon as :meth:`finish` has joined them: at the peak a column is held about twice, one
    column at a time.
    """

    _FIRST, _LARGEST = 1 << 16, 1 << 23

    def __init__(self, dtype: type) -> None:
        self._dtype = dtype
        self._segments: list[np.ndarray] = []
        self._free = 0  # unused values at the end of the last segment
        self.size = 0

    def extend(self, values: np.ndarray) -> None:
        done = 0
        while done < len(values):
            if self._free == 0:
                length = min(self._LARGEST, max(self._FIRST, self.size))
                self._segments.append(np.empty(length, dtype=self._dtype))
                self._free = length
            segment = self._segments[-1]
            start = len(segment) - self._free
            count = min(self._free, len(values) - done)
            segment[start:start + count] = values[done:done + count]
            self._free -= count
            done += count
        self.size += len(values)

    def finish(self) -> np.ndarray:
        """The whole column (the segments are released)."""
        segments, self._segments = self._segments, []
        if segments:
            segments[-1] = segments[-1][:len(segments[-1]) - self._free]
        self._free = 0
        return np.concatenate(segments) if segments else np.empty(0, dtype=self._dtype)


@contextlib.contextmanager
def _errors_naming(path: Path) -> Iterator[None]:
    """Turn the readers' parse and decompression failures into errors that name the file."""
    try:
        yield
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise DataError(f"cannot parse {path}: {e}") from e
    except (OSError, EOFError) as e:
        codec = _COMPRESSION.get(path.suffix.lower())
        if codec is None:
            raise
        raise CorruptArchiveError(path, str(e), kind=codec) from e


def _coalesce(batch: pa.RecordBatch, names: tuple[str, ...]) -> pa.Array:
    """The first non-empty value of ``names`` in each row (just the column for one name)."""
    arrays = [batch.column(name) for name in names]
    if len(arrays) == 1:
        return arrays[0]
    return pc.coalesce(*[a if pa.types.is_string(a.type) else a.cast(pa.string()) for a in arrays])


def _complete_rows(
    fields: dict[str, pa.Array], path: Path, rows_before: int, drop: bool
) -> np.ndarray | None:
    """Mask of the rows whose user, item and time are present; None if all are.

    Raises:
        DataError: a value is missing and ``drop`` is False.
    """
    keep: np.ndarray | None = None
    for name in ("user", "item", "time"):
        values = fields[name]
        if values.null_count == 0:
            continue
        present = values.is_valid().to_numpy(zero_copy_only=False)
        if not drop:
            first = rows_before + int(np.argmin(present)) + 1
            raise DataError(
                f"{path}: the {name} is empty in {values.null_count} rows of a batch, first in "
                f"data row {first}"
            )
        keep = present if keep is None else keep & present
    return keep


class _Ids:
    """Accumulates one id column batch by batch: integers as they are, text as dictionary codes.

    Text batches are dictionary-encoded on arrival, so a row costs an ``int32`` code and each
    batch its distinct ids; :meth:`finish` merges the batch dictionaries into one.
    """

    def __init__(self) -> None:
        self._ints: _Buffer | None = None
        self._codes: _Buffer | None = None
        # (first row, dictionary) of each text batch.
        self._dictionaries: list[tuple[int, pa.Array]] = []

    def add(self, values: pa.Array, path: Path, column: str) -> None:
        if pa.types.is_integer(values.type) and self._codes is None:
            self._ints = self._ints or _Buffer(np.int64)
            self._ints.extend(values.cast(pa.int64()).to_numpy())
            return
        if pa.types.is_floating(values.type) or pa.types.is_boolean(values.type):
            raise DataError(
                f"{path}: ids in column {column!r} must be integers or text, got {values.type}"
            )
        if self._codes is None:
            self._codes = _Buffer(np.int32)
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


def _seconds(values: pa.Array, path: Path, column: str, rows_before: int) -> np.ndarray:
    """Times as ``int64`` seconds since the epoch (fractions of a second are dropped).

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
        raise BadValueError(path, column, rows_before + bad + 1, str(numbers[bad]),
                            _TIME_EXPECTED)
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


def _ratings(values: pa.Array, path: Path) -> np.ndarray:
    try:
        return values.cast(pa.float32()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise DataError(f"{path}: ratings must be numbers ({e})") from e


@contextlib.contextmanager
def _open_text(path: Path) -> Iterator[IO[bytes]]:
    """A binary stream of the file's (decompressed) content, for peeking at its first lines."""
    codec = _COMPRESSION.get(path.suffix.lower())
    try:
        with pa.input_stream(str(path), compression=codec) as native:
            yield io.BufferedReader(native)
    except FileNotFoundError:
        raise
    except OSError as e:
        if codec:
            raise CorruptArchiveError(path, str(e), kind=codec) from e
        raise


@contextlib.contextmanager
def _tracked_stream(
    path: Path, advance: Callable[[int], None], native: bool = True
) -> Iterator[Any]:
    """The (decompressed) content of ``path``, reporting the file bytes consumed to ``advance``.

    Args:
        path: the file.
        advance: called with the number of bytes of each read from the file.
        native: yield an Arrow stream (for Arrow's readers) rather than a binary Python file.
    """
    codec = _COMPRESSION.get(path.suffix.lower())
    with open(path, "rb") as raw:
        stream: Any = pa.PythonFile(_Counting(raw, advance), mode="r")
        if codec:
            stream = pa.CompressedInputStream(stream, codec)
        yield stream if native else io.BufferedReader(stream, buffer_size=1 << 20)


class _Counting(io.RawIOBase):
    """A read-only file that reports the size of every read."""

    def __init__(self, raw: IO[bytes], advance: Callable[[int], None]) -> None:
        super().__init__()
        self._raw = raw
        self._advance = advance

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._raw.readinto(buffer)
        self._advance(count)
        return count

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._advance(len(data))
        return data


def file_signature(paths: Sequence[Path]) -> dict[str, list[int] | None]:
    """Size and modification time of each file (None if absent), to key caches of local files.

    Args:
        paths: the files.

    Returns:
        ``{str(path): [size, mtime_ns] or None}``.
    """
    out: dict[str, list[int] | None] = {}
    for path in paths:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            out[str(path)] = None
        else:
            out[str(path)] = [info.st_size, info.st_mtime_ns]
    return out

