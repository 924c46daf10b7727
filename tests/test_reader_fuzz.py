"""Randomly corrupted input files either parse or raise the documented
:class:`~recsys_midx.data.errors.DataError`; no other exception escapes the readers.

Each reader gets a fixed number of corruptions from a seeded generator (byte flips, inserted and
deleted bytes, truncation, duplicated or shuffled lines, invalid UTF-8, stray separators, huge
numbers), so a failure reproduces with the printed case number.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from recsys_midx.data.errors import DataError
from recsys_midx.data.readers import ColumnMap, Delimited, read_interactions
from recsys_midx.data.xc import read_xc_file

CASES = 150

_XC = (
    "6 12 5\n"
    "0,2 1:0.5 3:1.25 11:2\n"
    "1 0:2.0 4:0.125\n"
    " 5:1.0\n"
    "3,4 2:0.25 7:1e-3 8:3\n"
    "0 1:1\n"
    "2,3,4 0:0.5 9:0.75 10:1.5\n"
)
_TSV = "".join(
    f"{u}\t{i}\t{(u + i) % 5 + 1}\t{881250949 + 10 * u + i}\n"
    for u in range(1, 8)
    for i in range(1, 6)
)
_CSV = "userId,movieId,rating,timestamp\n" + _TSV.replace("\t", ",")
_TSV_FORMAT = Delimited(
    "\t",
    header=False,
    names=("user", "item", "rating", "timestamp"),
    int_columns=frozenset({"user", "item", "timestamp"}),
)
_COLUMNS_TSV = ColumnMap(user="user", item="item", time="timestamp", rating="rating")
_COLUMNS_CSV = ColumnMap(user="userId", item="movieId", time="timestamp", rating="rating")
_NOISE = [
    b"\xff\xfe",
    b"\x00",
    b",",
    b"\t",
    b":",
    b" ",
    b"\n",
    b"-",
    b"nan",
    b"1e999",
    b"99999999999999999999999",
    b'"',
    b"\r\n",
    b"\xc3\x28",
    b"inf",
    b"-1",
]


def _corrupt(content: bytes, rng: random.Random) -> bytes:
    """One random corruption (or a few stacked) of ``content``."""
    data = bytearray(content)
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.randrange(7)
        at = rng.randrange(len(data) + 1)
        if kind == 0 and data:  # flip a byte
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif kind == 1:  # insert noise
            data[at:at] = rng.choice(_NOISE)
        elif kind == 2 and data:  # delete a span
            del data[at : at + rng.randint(1, 8)]
        elif kind == 3:  # truncate
            del data[at:]
        else:  # rework whole lines
            lines = bytes(data).split(b"\n")
            row = rng.randrange(len(lines))
            if kind == 4:
                lines.insert(row, lines[rng.randrange(len(lines))])
            elif kind == 5:
                rng.shuffle(lines)
            else:
                lines[row] = rng.choice(_NOISE) * rng.randint(1, 4)
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def _fuzz(
    tmp_path: Path,
    name: str,
    content: str,
    read: Callable[[Path], object],
    seed: int,
    compress: bool = False,
) -> None:
    rng = random.Random(seed)
    outcomes = {"parsed": 0, "DataError": 0}
    for case in range(CASES):
        corrupted = _corrupt(content.encode(), rng)
        path = tmp_path / f"{case}-{name}"
        path.write_bytes(gzip.compress(corrupted) if compress else corrupted)
        try:
            read(path)
        except DataError as error:
            assert str(path) in str(error), f"case {case}: {error}"
            outcomes["DataError"] += 1
        except Exception as error:  # anything else is a bug
            pytest.fail(f"case {case} ({corrupted[:200]!r}): {type(error).__name__}: {error}")
        else:
            outcomes["parsed"] += 1
    # The corruptions reach both outcomes: the test exercises the error paths.
    assert outcomes["parsed"] > 0 and outcomes["DataError"] > 0, outcomes


def _read_xc(path: Path) -> None:
    data = read_xc_file(path)
    # Whatever parsed respects the header and the CSR invariants.
    for matrix, limit in ((data.features, data.num_features), (data.labels, data.num_labels + 1)):
        assert np.all(np.diff(matrix.indptr) >= 0) and matrix.indptr[-1] == len(matrix.indices)
        assert np.all((matrix.indices >= 0) & (matrix.indices < limit))
    assert np.all(data.labels.indices >= 1)


def test_corrupted_xc_files(tmp_path):
    _fuzz(tmp_path, "train.txt", _XC, _read_xc, seed=0)


def test_corrupted_tab_separated_ratings(tmp_path):
    _fuzz(
        tmp_path,
        "u.data",
        _TSV,
        lambda path: read_interactions(path, _TSV_FORMAT, _COLUMNS_TSV, progress=False),
        seed=1,
    )


def test_corrupted_csv_ratings(tmp_path):
    _fuzz(
        tmp_path,
        "ratings.csv",
        _CSV,
        lambda path: read_interactions(path, Delimited(","), _COLUMNS_CSV, progress=False),
        seed=2,
    )


def test_corrupted_compressed_ratings(tmp_path):
    # Corrupt the text, then also the gzip stream itself.
    _fuzz(
        tmp_path,
        "ratings.csv.gz",
        _CSV,
        lambda path: read_interactions(path, Delimited(","), _COLUMNS_CSV, progress=False),
        seed=3,
        compress=True,
    )
    rng = random.Random(4)
    compressed = gzip.compress(_CSV.encode())
    for case in range(CASES):
        path = tmp_path / f"raw-{case}.csv.gz"
        path.write_bytes(_corrupt(compressed, rng))
        try:
            read_interactions(path, Delimited(","), _COLUMNS_CSV, progress=False)
        except DataError:
            pass
        except Exception as error:
            pytest.fail(f"gzip case {case}: {type(error).__name__}: {error}")
