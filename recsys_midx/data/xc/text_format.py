"""The Extreme Classification Repository's bag-of-words text format.

The first line is ``num_points num_features num_labels``; each further line is one point,
``l1,l2,... f:v f:v ...`` with 0-based label ids ``l`` and 0-based feature ids ``f`` of value
``v``. A point without labels starts with a space. :func:`read_xc_file` streams a file in blocks
of lines, parses each block with numpy into CSR arrays (never one Python object per feature) and
checks it against its header; :func:`write_xc_file` writes the format.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recsys_midx.data.errors import XCFormatError
from recsys_midx.data.xc.containers import XCData, csr_from_pairs

#: Lines parsed per numpy call by the reader: bounds the temporary text while keeping the
#: per-call overhead negligible.
_BLOCK_LINES = 8192


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
        " ".join(t for t in feature_texts if t).replace(":", " "),
        " ",
        np.float64,
        2 * int(feature_counts.sum()),
    )
    feature_ids = pairs[0::2]
    if not np.array_equal(feature_ids, np.floor(feature_ids)):
        raise ValueError("feature ids must be integers")
    return _Block(
        label_counts,
        labels,
        feature_counts,
        feature_ids.astype(np.int64),
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
                    path,
                    number,
                    f"cannot parse {line.rstrip()[:80]!r} as 'l1,l2,... f:v f:v ...' ({error})",
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
            path,
            1,
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
            path,
            row + 2,
            f"{what} id {int(ids[bad[0]])} is outside 0..{limit - 1} "
            f"(the header declares {limit} {what}s)",
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
        ```python
        data = read_xc_file("datasets/raw/xc-eurlex-4k/eurlex_train.txt")
        data.num_points, data.num_features, data.num_labels
        # (15539, 5000, 3993)
        ```
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
            path,
            None,
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
        features=csr_from_pairs(np.repeat(rows, feature_counts), feature_ids, values, num_points),
        labels=csr_from_pairs(np.repeat(rows, label_counts), labels + 1, None, num_points),
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
        ```python
        write_xc_file("/tmp/tiny.txt", data)
        ```
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
                f"{f}:{v:.9g}"
                for f, v in zip(features.indices[span].tolist(), values[span].tolist())
            )
            handle.write(",".join(map(str, point_labels.tolist())) + " " + pairs + "\n")
    return path
