"""Extreme multi-label classification data: the repository text format, a seeded generator, a
Parquet cache and the Lightning data module.

**Text format** (the Extreme Classification Repository's bag-of-words files). The first line is
``num_points num_features num_labels``; each further line is one point,
``l1,l2,... f:v f:v ...`` with 0-based label ids ``l`` and 0-based feature ids ``f`` of value
``v``. A point without labels starts with a space. :func:`read_xc_file` streams a file in blocks
of lines, parses each block with numpy into CSR arrays (never one Python object per feature) and
checks it against its header; :func:`write_xc_file` writes the format.

**Ids.** Feature ids stay 0-based (``0..F-1``): they index an ``EmbeddingBag`` that has no
padding row. Label ids become ``1..L`` (file id + 1), so that ``0`` is padding, as for items
everywhere else in the toolkit.

**Processed folder** ``<data_dir>/processed/<name>-<key>/``, keyed by the sha256 of the source's
fingerprint and :data:`SCHEMA_VERSION` and written atomically:

``train.parquet``, ``test.parquet``
    One row per point: ``labels`` ``large_list<int32>`` (ids ``1..L``, ascending),
    ``feature_ids`` ``large_list<int32>`` (ids ``0..F-1``, ascending) and ``feature_values``
    ``large_list<float32>`` (aligned with ``feature_ids``). List columns are stored by Arrow as
    exactly the CSR arrays the data module works with (int64 offsets + flat values), so reading
    them back is a zero-copy conversion, while each file stays a self-describing table that any
    Parquet reader can open (one row per point, no side arrays to keep in sync).
``stats.json``
    ``features``, ``labels``, ``train_points``, ``test_points`` and summary statistics.
``settings.json``
    ``name``, ``schema_version`` and ``fingerprint``: what the folder's key was computed from.

The repository ships train and test files only; :class:`XCDataModule` holds out a seeded
fraction of the training points for validation.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import math
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from recsys_midx.data.download import atomic_directory
from recsys_midx.data.errors import DataError, MissingFilesError
from recsys_midx.data.pipeline import checked_settings
from recsys_midx.data.resumable import ResumableLoader
from recsys_midx.distributed import eval_sampler
from recsys_midx.metrics.xc import inverse_propensities

log = logging.getLogger(__name__)

#: Bump whenever the processed files change meaning or layout: old caches then stop matching.
SCHEMA_VERSION = 1

#: Lines parsed per numpy call by the reader: bounds the temporary text while keeping the
#: per-call overhead negligible.
_BLOCK_LINES = 8192

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

_SCHEMA = pa.schema([
    ("labels", pa.large_list(pa.int32())),
    ("feature_ids", pa.large_list(pa.int32())),
    ("feature_values", pa.large_list(pa.float32())),
])
_SPLITS = ("train", "test")

REPOSITORY_URL = "http://manikvarma.org/downloads/XC/XMLRepository.html"


class XCFormatError(DataError):
    """A file does not follow the Extreme Classification Repository text format.

    Args:
        path: the file.
        line: the 1-based line number of the problem (``None`` for the file as a whole).
        reason: what is wrong.
    """

    def __init__(self, path: Path, line: int | None, reason: str) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}, line {line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {reason}")


# --- sparse arrays ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CSR:
    """A sparse row matrix as CSR arrays: row ``r`` owns ``indices[indptr[r]:indptr[r + 1]]``.

    Attributes:
        indptr: ``int64 [rows + 1]`` row starts, ``indptr[0] == 0``.
        indices: ``int32 [nnz]`` column ids, ascending within each row.
        values: ``float32 [nnz]`` values aligned with ``indices``, or ``None`` (all ones).
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        """Number of rows."""
        return len(self.indptr) - 1

    def row_lengths(self) -> np.ndarray:
        """``int64 [rows]`` non-zeros per row."""
        return np.diff(self.indptr)

    def take(self, rows: np.ndarray) -> CSR:
        """The rows ``rows`` (any order, repeats allowed), gathered without a Python loop.

        Args:
            rows: ``[R]`` row indices.

        Returns:
            A CSR matrix with ``R`` rows.

        Example:
            >>> m = CSR(np.array([0, 2, 3]), np.array([4, 7, 1], dtype=np.int32))
            >>> m.take(np.array([1, 0])).indices
            array([1, 4, 7], dtype=int32)
        """
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        # Position j of the output comes from starts[row(j)] + (j - indptr[row(j)]).
        source = np.arange(indptr[-1], dtype=np.int64) + np.repeat(starts - indptr[:-1], lengths)
        values = None if self.values is None else self.values[source]
        return CSR(indptr, self.indices[source], values)


@dataclass(frozen=True)
class XCData:
    """Points with sparse features and label sets.

    Attributes:
        features: feature ids ``0..F-1`` with float32 values, one row per point.
        labels: label ids ``1..L`` (no values), one row per point.
        num_features: ``F``.
        num_labels: ``L``.
    """

    features: CSR
    labels: CSR
    num_features: int
    num_labels: int

    @property
    def num_points(self) -> int:
        """Number of points."""
        return self.features.num_rows

    def take(self, rows: np.ndarray) -> XCData:
        """The points ``rows``, in that order (see :meth:`CSR.take`)."""
        return XCData(
            self.features.take(rows), self.labels.take(rows), self.num_features, self.num_labels
        )

    def label_counts(self) -> np.ndarray:
        """``int64 [L+1]``: how many points carry each label (entry 0, padding, is 0)."""
        return np.bincount(self.labels.indices, minlength=self.num_labels + 1).astype(np.int64)


def _csr_from_pairs(
    rows: np.ndarray, columns: np.ndarray, values: np.ndarray | None, num_rows: int
) -> CSR:
    """CSR of ``(row, column)`` entries; repeated entries merge (values add up), columns sort.

    ``rows`` must be non-decreasing. Entries already strictly increasing within each row (the
    usual case for files) are taken as they are, which avoids sorting tens of millions of keys.
    """
    rows = rows.astype(np.int64, copy=False)
    indptr = np.zeros(num_rows + 1, dtype=np.int64)
    step = np.diff(columns)
    if not np.all((step > 0) | (np.diff(rows) > 0)):
        width = int(columns.max()) + 1
        keys, inverse = np.unique(rows * width + columns, return_inverse=True)
        if values is not None:
            values = np.bincount(inverse, weights=values)
        rows, columns = keys // width, keys % width
    np.cumsum(np.bincount(rows, minlength=num_rows), out=indptr[1:])
    merged = None if values is None else values.astype(np.float32, copy=False)
    return CSR(indptr, columns.astype(np.int32, copy=False), merged)


# --- text format ----------------------------------------------------------------------------------


@dataclass
class _Block:
    """Parsed lines: per-line label and feature counts and the flat ids/values."""

    label_counts: np.ndarray
    labels: np.ndarray
    feature_counts: np.ndarray
    feature_ids: np.ndarray
    feature_values: np.ndarray


def _numbers(text: str, sep: str, dtype: type, expected: int) -> np.ndarray:
    """Parse ``expected`` numbers separated by ``sep``; ``ValueError`` on anything else."""
    with warnings.catch_warnings():
        # Older numpy warns (instead of raising) on text it cannot read to the end.
        warnings.simplefilter("error", DeprecationWarning)
        try:
            numbers = np.fromstring(text, dtype=dtype, sep=sep) if text else np.empty(0, dtype)
        except DeprecationWarning as error:
            raise ValueError(str(error)) from error
    if len(numbers) != expected:
        raise ValueError(f"expected {expected} numbers, read {len(numbers)}")
    return numbers


def _parse_block(lines: list[str]) -> _Block:
    """Parse lines of points; ``ValueError`` if any of them is malformed."""
    label_texts, feature_texts = [], []
    for line in lines:
        line = line.rstrip()
        head, _, rest = line.partition(" ")
        # A point without labels starts with a space; one whose first token is already a
        # feature ("f:v") has no labels either.
        if ":" in head:
            head, rest = "", line
        label_texts.append(head)
        feature_texts.append(rest)
    label_counts = np.array([t.count(",") + 1 if t else 0 for t in label_texts], dtype=np.int64)
    feature_counts = np.array([t.count(":") for t in feature_texts], dtype=np.int64)
    labels = _numbers(",".join(t for t in label_texts if t), ",", np.int64, int(label_counts.sum()))
    # Empty texts are left out: joined, they would leave a bare separator numpy reads as a value.
    pairs = _numbers(
        " ".join(t for t in feature_texts if t).replace(":", " "), " ", np.float64,
        2 * int(feature_counts.sum()),
    )
    feature_ids = pairs[0::2]
    if not np.array_equal(feature_ids, np.floor(feature_ids)):
        raise ValueError("feature ids must be integers")
    return _Block(
        label_counts, labels, feature_counts, feature_ids.astype(np.int64),
        pairs[1::2].astype(np.float32),
    )


def _parse_or_locate(lines: list[str], first_line: int, path: Path) -> _Block:
    """Parse a block; if it is malformed, find the first bad line and report it."""
    try:
        return _parse_block(lines)
    except ValueError:
        for number, line in enumerate(lines, start=first_line):
            try:
                _parse_block([line])
            except ValueError as error:
                raise XCFormatError(
                    path, number, f"cannot parse {line.rstrip()[:80]!r} as "
                    f"'l1,l2,... f:v f:v ...' ({error})"
                ) from None
        raise


def _blocks(handle: Any, path: Path) -> Iterator[_Block]:
    """Parsed blocks of the lines after the header."""
    lines: list[str] = []
    first_line = 2
    for line in handle:
        lines.append(line)
        if len(lines) == _BLOCK_LINES:
            yield _parse_or_locate(lines, first_line, path)
            first_line += len(lines)
            lines = []
    if lines:
        yield _parse_or_locate(lines, first_line, path)


def _parse_header(line: str, path: Path) -> tuple[int, int, int]:
    parts = line.split()
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        raise XCFormatError(
            path, 1,
            f"the header must be 'num_points num_features num_labels', got {line.strip()!r}",
        )
    num_points, num_features, num_labels = (int(part) for part in parts)
    return num_points, num_features, num_labels


def _check_range(ids: np.ndarray, counts: np.ndarray, limit: int, what: str, path: Path) -> None:
    """Raise on the first id outside ``0..limit-1``, with the line it is on."""
    bad = np.flatnonzero((ids < 0) | (ids >= limit))
    if len(bad):
        row = int(np.searchsorted(np.cumsum(counts), bad[0], side="right"))
        raise XCFormatError(
            path, row + 2, f"{what} id {int(ids[bad[0]])} is outside 0..{limit - 1} "
            f"(the header declares {limit} {what}s)"
        )


def read_xc_file(path: str | Path) -> XCData:
    """Read a file in the Extreme Classification Repository format, checked against its header.

    Args:
        path: the text file.

    Returns:
        The points: feature ids ``0..F-1`` as in the file, label ids shifted to ``1..L``; ids are
        sorted within each point and repeats merged (repeated feature values add up).

    Raises:
        XCFormatError: the header is not three non-negative integers, a line cannot be parsed,
            an id is outside the range the header declares, or the number of points differs
            from the header's.
        FileNotFoundError: ``path`` does not exist.

    Example:
        >>> data = read_xc_file("datasets/raw/xc-eurlex-4k/eurlex_train.txt")  # doctest: +SKIP
        >>> data.num_points, data.num_features, data.num_labels  # doctest: +SKIP
        (15539, 5000, 3993)
    """
    path = Path(path)
    # Bytes that are not UTF-8 become U+FFFD, which no number contains: the line holding them
    # is then reported as malformed, with its number.
    with path.open("r", encoding="utf-8", errors="replace") as handle:
        num_points, num_features, num_labels = _parse_header(handle.readline(), path)
        blocks = list(_blocks(handle, path))
    label_counts = np.concatenate([b.label_counts for b in blocks] or [np.empty(0, np.int64)])
    if len(label_counts) != num_points:
        raise XCFormatError(
            path, None,
            f"the header declares {num_points} points, the file holds {len(label_counts)}",
        )
    feature_counts = np.concatenate([b.feature_counts for b in blocks] or [np.empty(0, np.int64)])
    labels = np.concatenate([b.labels for b in blocks] or [np.empty(0, np.int64)])
    feature_ids = np.concatenate([b.feature_ids for b in blocks] or [np.empty(0, np.int64)])
    values = np.concatenate([b.feature_values for b in blocks] or [np.empty(0, np.float32)])
    del blocks
    _check_range(labels, label_counts, num_labels, "label", path)
    _check_range(feature_ids, feature_counts, num_features, "feature", path)
    rows = np.arange(num_points, dtype=np.int64)
    return XCData(
        features=_csr_from_pairs(np.repeat(rows, feature_counts), feature_ids, values, num_points),
        labels=_csr_from_pairs(np.repeat(rows, label_counts), labels + 1, None, num_points),
        num_features=num_features,
        num_labels=num_labels,
    )


def write_xc_file(path: str | Path, data: XCData) -> Path:
    """Write points in the Extreme Classification Repository format (0-based ids).

    Values are written with 9 significant digits, enough for float32 to read back exactly.

    Args:
        path: the text file to create (parent folders are created).
        data: the points; label ids ``1..L`` are written as ``0..L-1``.

    Returns:
        ``path``.

    Example:
        >>> write_xc_file("/tmp/tiny.txt", data)  # doctest: +SKIP
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    features, labels = data.features, data.labels
    values = features.values if features.values is not None else np.ones(len(features.indices))
    with path.open("w", encoding="utf-8") as handle:
        handle.write(f"{data.num_points} {data.num_features} {data.num_labels}\n")
        for row in range(data.num_points):
            point_labels = labels.indices[labels.indptr[row] : labels.indptr[row + 1]] - 1
            span = slice(features.indptr[row], features.indptr[row + 1])
            pairs = " ".join(
                f"{f}:{v:.9g}" for f, v in zip(features.indices[span].tolist(),
                                                values[span].tolist())
            )
            handle.write(",".join(map(str, point_labels.tolist())) + " " + pairs + "\n")
    return path


# --- Parquet ------------------------------------------------------------------------------------


def _list_array(csr_offsets: np.ndarray, values: np.ndarray) -> pa.LargeListArray:
    return pa.LargeListArray.from_arrays(pa.array(csr_offsets, pa.int64()), pa.array(values))


def write_parquet(path: Path, data: XCData) -> None:
    """Write points as one Parquet row each (schema in the module docstring).

    Args:
        path: the file to write.
        data: the points.
    """
    features, labels = data.features, data.labels
    values = features.values if features.values is not None else np.ones(len(features.indices))
    table = pa.Table.from_arrays(
        [
            _list_array(labels.indptr, labels.indices.astype(np.int32)),
            _list_array(features.indptr, features.indices.astype(np.int32)),
            _list_array(features.indptr, values.astype(np.float32)),
        ],
        schema=_SCHEMA,
    )
    pq.write_table(table, path)


def _column_csr(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """CSR offsets and flat values of a list column (zero-copy where Arrow allows)."""
    column = table.column(name).combine_chunks()
    offsets = column.offsets.to_numpy().astype(np.int64, copy=False)
    return offsets - offsets[0], column.flatten().to_numpy()


def read_parquet(path: Path, num_features: int, num_labels: int) -> XCData:
    """Read points written by :func:`write_parquet`.

    Args:
        path: the Parquet file.
        num_features: ``F``.
        num_labels: ``L``.

    Returns:
        The points.
    """
    table = pq.read_table(path, schema=_SCHEMA)
    label_ptr, label_ids = _column_csr(table, "labels")
    feature_ptr, feature_ids = _column_csr(table, "feature_ids")
    _, feature_values = _column_csr(table, "feature_values")
    return XCData(
        CSR(feature_ptr, feature_ids, feature_values), CSR(label_ptr, label_ids),
        num_features, num_labels,
    )


# --- sources ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class XCDataset:
    """A processed dataset, loaded from its cache folder.

    Attributes:
        name: the source's name.
        directory: the processed folder.
        train: the training points (validation is held out of them later).
        test: the test points.
        stats: the content of ``stats.json``.
    """

    name: str
    directory: Path
    train: XCData
    test: XCData
    stats: dict[str, Any]

    @property
    def num_features(self) -> int:
        """``F``."""
        return self.train.num_features

    @property
    def num_labels(self) -> int:
        """``L``."""
        return self.train.num_labels


def _summary(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {}
    quantiles = np.percentile(values, [50, 90])
    return {
        "min": float(values.min()), "p50": float(quantiles[0]), "p90": float(quantiles[1]),
        "max": float(values.max()), "mean": float(values.mean()),
    }


def dataset_stats(train: XCData, test: XCData) -> dict[str, Any]:
    """Sizes and label/feature statistics of a train/test pair (what ``stats.json`` holds).

    Args:
        train: training points.
        test: test points.

    Returns:
        ``features``, ``labels``, ``train_points``, ``test_points``, ``labels_per_point``,
        ``features_per_point`` and ``label_frequency`` (training points per label, over labels
        seen in training) summaries, ``train_labels_seen`` and ``test_points_without_labels``.
    """
    counts = train.label_counts()[1:]
    return {
        "features": train.num_features,
        "labels": train.num_labels,
        "train_points": train.num_points,
        "test_points": test.num_points,
        "labels_per_point": _summary(train.labels.row_lengths()),
        "features_per_point": _summary(train.features.row_lengths()),
        "label_frequency": _summary(counts[counts > 0]),
        "train_labels_seen": int((counts > 0).sum()),
        "test_points_without_labels": int((test.labels.row_lengths() == 0).sum()),
    }


class XCSource(abc.ABC):
    """Where the points of an extreme classification dataset come from.

    Subclasses say what determines their content (:meth:`fingerprint`) and how to produce the
    train and test points (:meth:`build`); :meth:`prepare` caches them as Parquet.

    Args:
        name: the dataset's name; it labels the processed folder, so it must be a plain file name
            (letters, digits, ``.``, ``_``, ``-``).
        propensity_a: ``A`` of the label propensity model used by PSP@k.
        propensity_b: ``B`` of the label propensity model.

    Raises:
        ValueError: if the name is not a plain file name or a propensity constant is negative.
    """

    def __init__(self, name: str, propensity_a: float = 0.55, propensity_b: float = 1.5) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"dataset name {name!r} must consist of letters, digits, '.', '_' and '-'"
            )
        if propensity_a < 0 or propensity_b < 0:
            raise ValueError(
                f"propensity constants must be >= 0, got A={propensity_a}, B={propensity_b}"
            )
        self.name = name
        self.propensity_a = float(propensity_a)
        self.propensity_b = float(propensity_b)

    @abc.abstractmethod
    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        """Everything that determines the points (generator settings, raw file names and sizes).

        Args:
            data_dir: the data root.

        Returns:
            A JSON-compatible dict; the processed folder is keyed by it.
        """

    @abc.abstractmethod
    def build(self, data_dir: Path) -> tuple[XCData, XCData]:
        """Produce the train and test points.

        Args:
            data_dir: the data root.

        Returns:
            ``(train, test)``.

        Raises:
            DataError: the raw data cannot be found or read.
        """

    def prepare(self, data_dir: str | Path) -> XCDataset:
        """Load the processed dataset, building and caching it first if needed.

        Args:
            data_dir: the data root (processed folders go to ``data_dir/processed``).

        Returns:
            The dataset.

        Raises:
            DataError: see :meth:`build`; a cache folder written by another schema version.

        Example:
            >>> XCSynthetic(num_labels=50, num_train=200, num_test=50).prepare("/tmp/data").name
            'xc-synthetic'
        """
        data_dir = Path(data_dir).expanduser()
        settings = {
            "name": self.name,
            "schema_version": SCHEMA_VERSION,
            "fingerprint": self.fingerprint(data_dir),
        }
        key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
        directory = data_dir / "processed" / f"{self.name}-{key}"
        if directory.is_dir():
            log.info("Reusing processed dataset %s", directory)
            return load_xc_dataset(directory)
        log.info("Preparing dataset %r into %s", self.name, directory)
        train, test = self.build(data_dir)
        with atomic_directory(directory) as tmp:
            for split, data in zip(_SPLITS, (train, test)):
                write_parquet(tmp / f"{split}.parquet", data)
            for file_name, content in (
                ("stats.json", dataset_stats(train, test)), ("settings.json", settings)
            ):
                (tmp / file_name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
        return load_xc_dataset(directory)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def load_xc_dataset(directory: Path) -> XCDataset:
    """Read a processed folder written by :meth:`XCSource.prepare`.

    Args:
        directory: the processed folder.

    Returns:
        The dataset it holds.

    Raises:
        MissingFilesError: a file of the folder is missing.
        DataError: the folder was written with another :data:`SCHEMA_VERSION`.
    """
    directory = Path(directory)
    names = [f"{split}.parquet" for split in _SPLITS] + ["stats.json", "settings.json"]
    settings = checked_settings(directory, names, SCHEMA_VERSION)
    stats = json.loads((directory / "stats.json").read_text())
    train, test = (
        read_parquet(directory / f"{split}.parquet", stats["features"], stats["labels"])
        for split in _SPLITS
    )
    return XCDataset(settings["name"], directory, train, test, stats)


class XCRepository(XCSource):
    """A dataset of the Extreme Classification Repository, read from hand-downloaded files.

    The repository's files cannot be fetched by a script, so they are looked up in ``raw_dir``
    (default ``<data_dir>/raw/<name>``) under the names given in ``files``; when some are
    missing the error lists them and says where to get them.

    Args:
        name: the dataset's name, e.g. ``xc-eurlex-4k``.
        files: the file name of each split, ``{"train": ..., "test": ...}``.
        raw_dir: the folder holding the files (``None``: ``<data_dir>/raw/<name>``).
        propensity_a: ``A`` of the propensity model (0.55 in general, 0.6 for Amazon datasets,
            0.5 for Wikipedia ones).
        propensity_b: ``B`` (1.5 in general, 2.6 for Amazon datasets, 0.4 for Wikipedia ones).

    Raises:
        ValueError: if ``files`` does not name exactly a ``train`` and a ``test`` file, or on
            the conditions of :class:`XCSource`.

    Example:
        >>> source = XCRepository("xc-eurlex-4k", {"train": "eurlex_train.txt",
        ...                                        "test": "eurlex_test.txt"}, raw_dir="~/Eurlex")
        >>> dataset = source.prepare("datasets")  # doctest: +SKIP
    """

    def __init__(
        self,
        name: str,
        files: Mapping[str, str],
        raw_dir: str | Path | None = None,
        propensity_a: float = 0.55,
        propensity_b: float = 1.5,
    ) -> None:
        super().__init__(name, propensity_a, propensity_b)
        self.files = {split: str(file) for split, file in dict(files).items()}
        if sorted(self.files) != sorted(_SPLITS):
            raise ValueError(f"files must name a 'train' and a 'test' file, got {self.files}")
        self.raw_dir = None if raw_dir is None else Path(raw_dir).expanduser()

    def folder(self, data_dir: Path) -> Path:
        """The folder the raw files are read from."""
        return self.raw_dir if self.raw_dir is not None else Path(data_dir) / "raw" / self.name

    def _paths(self, data_dir: Path) -> dict[str, Path]:
        """The raw file of each split; ``MissingFilesError`` listing the absent ones."""
        folder = self.folder(data_dir)
        paths = {split: folder / file for split, file in self.files.items()}
        missing = [self.files[split] for split in _SPLITS if not paths[split].is_file()]
        if missing:
            raise MissingFilesError(
                folder, missing,
                f"The Extreme Classification Repository's files are distributed by hand: "
                f"download {self.name}'s bag-of-words files from {REPOSITORY_URL} and put "
                f"{' and '.join(repr(self.files[s]) for s in _SPLITS)} in {folder}, or set "
                "dataset.raw_dir to the folder that holds them.",
            )
        return paths

    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        paths = self._paths(data_dir)
        return {split: {"file": self.files[split], "bytes": paths[split].stat().st_size}
                for split in _SPLITS}

    def build(self, data_dir: Path) -> tuple[XCData, XCData]:
        paths = self._paths(data_dir)
        train, test = (read_xc_file(paths[split]) for split in _SPLITS)
        if (train.num_features, train.num_labels) != (test.num_features, test.num_labels):
            raise XCFormatError(
                paths["test"], 1,
                f"declares {test.num_features} features and {test.num_labels} labels, the "
                f"training file {train.num_features} and {train.num_labels}",
            )
        return train, test


# --- synthetic data -----------------------------------------------------------------------------


class XCSynthetic(XCSource):
    """Seeded synthetic extreme classification data (no download), up to millions of labels.

    Labels have power-law frequencies (weight ``rank ** -power_law_exponent``, ranks shuffled
    over the label ids) and belong to ``num_topics`` topics; each topic owns a pool of features
    and each label a *signature* of ``signature_size`` features from its topic's pool. A point
    draws its first label by weight, and each further label (``1 + Poisson(mean_labels - 1)`` in
    all, at most ``max_labels``) from the same topic with probability ``topic_coherence``,
    otherwise from all labels, still by weight; either way a label's overall frequency stays
    proportional to its weight. The point's features are the signatures of its labels, each
    feature kept with probability ``signature_keep``, plus ``Poisson(noise_features)`` uniformly
    drawn noise features; values are positive and each point's feature vector has unit L2 norm.
    Everything is vectorised with numpy.

    Args:
        name: the dataset's name (labels the processed folder).
        num_labels: ``L``.
        num_features: ``F``; at least ``num_topics`` (each topic needs a feature pool).
        num_train: training points.
        num_test: test points.
        num_topics: topics the labels and features are grouped into.
        mean_labels: mean number of labels per point (before duplicates merge), ``>= 1``.
        max_labels: most labels per point.
        signature_size: features in a label's signature.
        signature_keep: probability that a signature feature appears in a point.
        noise_features: mean number of noise features per point.
        power_law_exponent: exponent of the label frequency power law.
        topic_coherence: probability that a further label comes from the first label's topic.
        seed: random seed; equal settings give identical data.
        propensity_a: ``A`` of the propensity model used by PSP@k.
        propensity_b: ``B`` of the propensity model.

    Raises:
        ValueError: on sizes or probabilities out of range.

    Example:
        >>> dataset = XCSynthetic(num_labels=1000, num_train=5000, num_test=500).prepare("/tmp/d")
        >>> dataset.train.num_points, dataset.num_labels
        (5000, 1000)
    """

    #: Bump when the generator's algorithm changes, so cached datasets are rebuilt.
    GENERATOR_VERSION = 1

    def __init__(
        self,
        name: str = "xc-synthetic",
        num_labels: int = 5000,
        num_features: int = 20000,
        num_train: int = 20000,
        num_test: int = 5000,
        num_topics: int = 50,
        mean_labels: float = 4.0,
        max_labels: int = 20,
        signature_size: int = 8,
        signature_keep: float = 0.7,
        noise_features: float = 10.0,
        power_law_exponent: float = 0.9,
        topic_coherence: float = 0.7,
        seed: int = 0,
        propensity_a: float = 0.55,
        propensity_b: float = 1.5,
    ) -> None:
        super().__init__(name, propensity_a, propensity_b)
        for field, value, low in (
            ("num_labels", num_labels, 2), ("num_train", num_train, 1), ("num_test", num_test, 1),
            ("num_topics", num_topics, 1), ("max_labels", max_labels, 1),
            ("signature_size", signature_size, 1),
        ):
            if value < low:
                raise ValueError(f"{field} must be >= {low}, got {value}")
        if num_features < num_topics:
            raise ValueError(
                f"num_features ({num_features}) must be >= num_topics ({num_topics})"
            )
        if not 1.0 <= mean_labels <= max_labels:
            raise ValueError(
                f"mean_labels must be in 1..max_labels={max_labels}, got {mean_labels}"
            )
        for field, value in (("signature_keep", signature_keep),
                             ("topic_coherence", topic_coherence)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{field} must be in [0, 1], got {value}")
        if noise_features < 0 or not math.isfinite(power_law_exponent) or power_law_exponent < 0:
            raise ValueError("noise_features and power_law_exponent must be >= 0")
        self.settings = {
            "num_labels": int(num_labels), "num_features": int(num_features),
            "num_train": int(num_train), "num_test": int(num_test),
            "num_topics": int(num_topics), "mean_labels": float(mean_labels),
            "max_labels": int(max_labels), "signature_size": int(signature_size),
            "signature_keep": float(signature_keep), "noise_features": float(noise_features),
            "power_law_exponent": float(power_law_exponent),
            "topic_coherence": float(topic_coherence), "seed": int(seed),
        }

    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        return {"generator_version": self.GENERATOR_VERSION, **self.settings}

    def build(self, data_dir: Path) -> tuple[XCData, XCData]:
        data = generate_xc(**self.settings)
        num_train = self.settings["num_train"]
        return (
            data.take(np.arange(num_train)),
            data.take(np.arange(num_train, data.num_points)),
        )


def _weighted_draw(cumulative: np.ndarray, low: np.ndarray, high: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Positions drawn in proportion to weight inside ``(low, high]`` of the inclusive
    cumulative weights: one ``searchsorted`` for every draw at once."""
    target = low + (1.0 - rng.random(len(low))) * (high - low)
    return np.minimum(np.searchsorted(cumulative, target), len(cumulative) - 1)


def generate_xc(
    num_labels: int, num_features: int, num_train: int, num_test: int, num_topics: int,
    mean_labels: float, max_labels: int, signature_size: int, signature_keep: float,
    noise_features: float, power_law_exponent: float, topic_coherence: float, seed: int,
) -> XCData:
    """The points of :class:`XCSynthetic` (training points first); see its docstring.

    Returns:
        ``num_train + num_test`` points.
    """
    rng = np.random.default_rng(seed)
    num_points = num_train + num_test
    weights = (rng.permutation(num_labels) + 1.0) ** -power_law_exponent
    topic = rng.integers(num_topics, size=num_labels)

    # Labels grouped by topic, with inclusive cumulative weights in that order: topic t's labels
    # cover (cum[start_t - 1], cum[end_t - 1]], so a within-topic draw is one search.
    by_topic = np.argsort(topic, kind="stable")
    cumulative = np.cumsum(weights[by_topic])
    bounds = np.concatenate(([0.0], cumulative))
    topic_end = np.cumsum(np.bincount(topic, minlength=num_topics))
    topic_low = bounds[topic_end - np.bincount(topic, minlength=num_topics)]
    topic_high = bounds[topic_end]

    # Each topic owns a contiguous block of a shuffled feature order; signatures come from it.
    pool_size = num_features // num_topics
    feature_order = rng.permutation(num_features)
    signatures = feature_order[
        topic[:, None] * pool_size + rng.integers(pool_size, size=(num_labels, signature_size))
    ]

    # Labels of every point: the first by weight, the others by weight in its topic or overall.
    per_point = np.minimum(1 + rng.poisson(mean_labels - 1.0, size=num_points), max_labels)
    point_of = np.repeat(np.arange(num_points), per_point)
    starts = np.concatenate(([0], np.cumsum(per_point)[:-1]))
    is_first = np.zeros(len(point_of), dtype=bool)
    is_first[starts] = True
    total = cumulative[-1]
    slots = _weighted_draw(cumulative, np.zeros(len(point_of)), np.full(len(point_of), total), rng)
    first_topic = np.repeat(topic[by_topic[slots[starts]]], per_point)
    in_topic = ~is_first & (rng.random(len(point_of)) < topic_coherence)
    slots[in_topic] = _weighted_draw(
        cumulative, topic_low[first_topic[in_topic]], topic_high[first_topic[in_topic]], rng
    )
    labels = _csr_from_pairs(point_of, by_topic[slots] + 1, None, num_points)

    # Features: the kept part of each label's signature, then noise; unit L2 norm per point.
    label_rows = np.repeat(np.arange(num_points), labels.row_lengths())
    signature_rows = np.repeat(label_rows, signature_size)
    signature_ids = signatures[labels.indices - 1].reshape(-1)
    kept = rng.random(len(signature_ids)) < signature_keep
    num_noise = rng.poisson(noise_features, size=num_points)
    rows = np.concatenate((signature_rows[kept], np.repeat(np.arange(num_points), num_noise)))
    ids = np.concatenate((signature_ids[kept], rng.integers(num_features, size=num_noise.sum())))
    values = np.concatenate((
        rng.uniform(0.5, 1.5, size=int(kept.sum())), rng.uniform(0.0, 0.5, size=num_noise.sum())
    ))
    order = np.argsort(rows, kind="stable")
    features = _csr_from_pairs(rows[order], ids[order], values[order], num_points)
    lengths = features.row_lengths()
    point_of_entry = np.repeat(np.arange(num_points), lengths)
    norms = np.sqrt(np.bincount(point_of_entry, weights=features.values.astype(np.float64) ** 2,
                                minlength=num_points))
    scaled = features.values / norms[point_of_entry]
    return XCData(CSR(features.indptr, features.indices, scaled.astype(np.float32)), labels,
                  num_features, num_labels)


# --- batches and the data module ----------------------------------------------------------------


@dataclass(frozen=True)
class SparseFeatures:
    """A batch of sparse feature vectors in ``torch.nn.EmbeddingBag`` form.

    Bag ``b`` holds ``indices[offsets[b]:offsets[b + 1]]`` weighted by the same slice of
    ``weights`` (``EmbeddingBag(..., include_last_offset=True)`` takes ``offsets`` as is). It
    slices by rows (``features[:n]`` is the first ``n`` bags) and moves with ``.to(device)``, so
    Lightning transfers it like a tensor.

    Attributes:
        indices: ``int64 [nnz]`` feature ids ``0..F-1``.
        offsets: ``int64 [B+1]`` bag starts, ``offsets[0] == 0``.
        weights: ``float32 [nnz]`` feature values.

    Example:
        >>> bags = SparseFeatures(torch.tensor([3, 1, 4]), torch.tensor([0, 2, 3]),
        ...                       torch.tensor([0.5, 1.0, 2.0]))
        >>> len(bags), bags[1:].indices
        (2, tensor([4]))
    """

    indices: Tensor
    offsets: Tensor
    weights: Tensor

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def __getitem__(self, rows: slice) -> SparseFeatures:
        """The bags ``rows`` (a slice with step 1)."""
        start, stop, step = rows.indices(len(self))
        if step != 1:
            raise ValueError("SparseFeatures slices need a step of 1")
        stop = max(start, stop)
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        return SparseFeatures(
            self.indices[first:last], self.offsets[start : stop + 1] - first,
            self.weights[first:last],
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SparseFeatures:
        """The same bags on ``device``."""
        return SparseFeatures(
            *(t.to(device, non_blocking=non_blocking)
              for t in (self.indices, self.offsets, self.weights))
        )


Batch = dict[str, Any]


def make_batch(data: XCData, rows: Sequence[int] | np.ndarray) -> Batch:
    """The batch of points ``rows``: ``features`` and 0-padded ``labels`` ``[B, P]``.

    Args:
        data: the points.
        rows: ``[B]`` point indices.

    Returns:
        ``{"features": SparseFeatures, "labels": LongTensor [B, P]}`` with ``P`` the largest
        label count in the batch (at least 1).

    Example:
        >>> batch = make_batch(dataset.train, np.arange(4))  # doctest: +SKIP
    """
    rows = np.asarray(rows, dtype=np.int64)
    points = data.take(rows)
    features, labels = points.features, points.labels
    lengths = labels.row_lengths()
    padded = np.zeros((len(rows), max(int(lengths.max(initial=0)), 1)), dtype=np.int64)
    columns = np.arange(len(labels.indices)) - np.repeat(labels.indptr[:-1], lengths)
    padded[np.repeat(np.arange(len(rows)), lengths), columns] = labels.indices
    return {
        "features": SparseFeatures(
            torch.from_numpy(features.indices.astype(np.int64)),
            torch.from_numpy(features.indptr),
            torch.from_numpy(features.values.astype(np.float32, copy=False)),
        ),
        "labels": torch.from_numpy(padded),
    }


class XCDataModule(L.LightningDataModule):
    """Serves sparse-feature points and their label sets for extreme classification.

    Training uses the training points that have at least one label (a point without labels
    gives the softmax nothing to learn), shuffled; validation holds out a seeded
    ``val_fraction`` of the training points; test is the source's test file. Evaluation batches
    keep every point, labelled or not.

    Args:
        source: where the points come from (:class:`XCRepository` or :class:`XCSynthetic`).
        data_dir: root of raw files and the processed Parquet cache.
        batch_size: points per training batch.
        eval_batch_size: points per evaluation batch.
        val_fraction: share of the training points held out for validation, in ``(0, 1)``.
        split_seed: seed of the validation hold-out.
        num_workers: data loader worker processes (0 is usually fastest: collation is
            vectorised).

    Raises:
        ValueError: if a batch size is not positive or ``val_fraction`` is not in ``(0, 1)``.

    Example:
        >>> dm = XCDataModule(XCSynthetic(num_labels=100, num_train=500, num_test=100), "/tmp/d")
        >>> dm.prepare_data(); dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))  # {"features": ..., "labels": [B, P]}
    """

    def __init__(
        self,
        source: XCSource,
        data_dir: str | Path,
        batch_size: int = 256,
        eval_batch_size: int = 1024,
        val_fraction: float = 0.1,
        split_seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        for field, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if value <= 0:
                raise ValueError(f"{field} must be > 0, got {value}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.source = source
        self.data_dir = Path(data_dir)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.num_workers = num_workers
        self.dataset: XCDataset | None = None
        self.splits: dict[str, XCData] = {}

    def prepare_data(self) -> None:
        self.source.prepare(self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.dataset = self.source.prepare(self.data_dir)
        train = self.dataset.train
        order = np.random.default_rng(self.split_seed).permutation(train.num_points)
        num_val = min(max(1, round(self.val_fraction * train.num_points)), train.num_points - 1)
        fit = train.take(np.sort(order[num_val:]))
        self.splits = {
            "train": fit.take(np.flatnonzero(fit.labels.row_lengths() > 0)),
            "val": train.take(np.sort(order[:num_val])),
            "test": self.dataset.test,
        }

    def _split(self, name: str) -> XCData:
        if not self.splits:
            raise RuntimeError("XCDataModule.setup() must run before the data is used")
        return self.splits[name]

    @property
    def num_items(self) -> int:
        """``L``: the labels are the catalog the samplers and the softmax range over."""
        return self._split("train").num_labels

    @property
    def num_features(self) -> int:
        """``F``."""
        return self._split("train").num_features

    @property
    def encoder_sizes(self) -> dict[str, int]:
        """The sizes an XC encoder is built with: ``num_features`` and ``num_labels``."""
        return {"num_features": self.num_features, "num_labels": self.num_items}

    @property
    def item_counts(self) -> Tensor:
        """``[L+1]`` training frequency of each label (for popularity proposals)."""
        return torch.from_numpy(self._split("train").label_counts())

    @property
    def inv_propensities(self) -> Tensor:
        """``[L+1]`` inverse label propensities for PSP@k, from the training frequencies and
        the source's ``A``/``B`` (``0`` at the padding entry)."""
        return inverse_propensities(
            self.item_counts, self._split("train").num_points,
            self.source.propensity_a, self.source.propensity_b,
        )

    @property
    def stats(self) -> dict[str, Any]:
        """The processed dataset's statistics plus the sizes of the three splits."""
        assert self.dataset is not None, "call setup() first"
        return {**self.dataset.stats, "name": self.dataset.name,
                "splits": {name: data.num_points for name, data in self.splits.items()}}

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size, shuffle=False)

    def _loader(self, split: str, batch_size: int, shuffle: bool) -> DataLoader:
        data = self._split(split)
        points = range(data.num_points)  # indexes points; the collate gathers a batch at once
        # Evaluation shards must not repeat points (Lightning's sampler pads them): see
        # recsys_midx.distributed.eval_sampler.
        # The training loader can replay its order, so that a run resumes mid-epoch exactly.
        return (ResumableLoader if shuffle else DataLoader)(
            points,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=None if shuffle else eval_sampler(points),
            collate_fn=partial(make_batch, data),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )
