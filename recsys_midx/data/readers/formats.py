"""File formats of raw interactions: each turns a file into a stream of Arrow record batches."""

from __future__ import annotations

import ast
import csv
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from recsys_midx.data.errors import DataError, MissingColumnsError
from recsys_midx.data.readers.streams import COMPRESSION, open_text, tracked_stream

#: Bytes of text parsed per batch. pyarrow's streaming readers read many blocks ahead,
#: so this bounds the raw text held in memory at once.
BLOCK_SIZE = 1 << 20
#: Lines parsed per batch by the formats that parse line by line in Python.
LINES_PER_BATCH = 65_536


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
        with open_text(path) as stream:
            line = stream.readline().decode("utf-8-sig", errors="replace").rstrip("\r\n")
        quoting = csv.QUOTE_MINIMAL if self.quoted else csv.QUOTE_NONE
        return next(csv.reader([line], delimiter=self.delimiter, quoting=quoting), [])

    def batches(
        self, path: Path, wanted: Sequence[str], advance: Callable[[int], None]
    ) -> Iterator[pa.RecordBatch]:
        types = {name: pa.int64() if name in self.int_columns else pa.string() for name in wanted}
        read_options = pacsv.ReadOptions(block_size=BLOCK_SIZE, column_names=self._column_names())
        parse_options = pacsv.ParseOptions(
            delimiter=self.delimiter,
            quote_char='"' if self.quoted else False,
        )
        # Only empty fields are missing: an id such as "NA" or "null" is a real id.
        convert_options = pacsv.ConvertOptions(
            include_columns=list(wanted),
            column_types=types,
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        )
        with tracked_stream(path, advance) as stream:
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
        with open_text(path) as stream:
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
        with tracked_stream(path, advance) as stream:
            yield from pajson.open_json(
                stream,
                read_options=pajson.ReadOptions(block_size=BLOCK_SIZE),
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
        with open_text(path) as stream:
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
        with tracked_stream(path, advance, native=False) as stream:
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


@dataclass(frozen=True)
class Sequences:
    """One user per line: the user's id, then the ids of its items in time order.

    The layout of the sequential benchmarks as S3-Rec published them (``Beauty.txt``,
    ``Yelp.txt``, ...) and of LightGCN's ``train.txt``. Each line becomes one ``(user, item)`` row
    per item, in the line's order, under the columns ``user`` and ``item``; a line with a user and
    no items adds no row. Ids are read as text (ids that are all canonical integers are then
    ordered as numbers, as for the other formats).

    Attributes:
        delimiter: the separator between ids; None: any run of whitespace.

    Example:
        >>> Sequences().columns(Path("Beauty.txt"))
        ['user', 'item']
    """

    delimiter: str | None = None

    def columns(self, path: Path) -> list[str]:
        return ["user", "item"]

    def batches(
        self, path: Path, wanted: Sequence[str], advance: Callable[[int], None]
    ) -> Iterator[pa.RecordBatch]:
        missing = [name for name in wanted if name not in ("user", "item")]
        if missing:
            raise MissingColumnsError(path, missing, self.columns(path))
        with tracked_stream(path, advance, native=False) as stream:
            users: list[str] = []
            items: list[str] = []
            for number, line in enumerate(stream, start=1):
                try:
                    user, *sequence = line.decode("utf-8").rstrip("\r\n").split(self.delimiter)
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}, line {number}: not UTF-8 text ({e})") from e
                except ValueError:  # an empty line
                    continue
                users.extend([user] * len(sequence))
                items.extend(sequence)
                if len(items) >= LINES_PER_BATCH:
                    yield _id_batch({"user": users, "item": items}, wanted)
                    users, items = [], []
            if items:
                yield _id_batch({"user": users, "item": items}, wanted)


def _id_batch(ids: dict[str, list[str]], wanted: Sequence[str]) -> pa.RecordBatch:
    """A record batch of the ``wanted`` id columns, as text."""
    arrays = [pa.array(ids[name], pa.string()) for name in wanted]
    return pa.RecordBatch.from_arrays(arrays, names=list(wanted))


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
    if suffixes and suffixes[-1] in COMPRESSION:
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
