"""Tests of the streaming reader: formats, id encoding across batches, times, and bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import recsys_midx.data.readers.formats as formats
from recsys_midx.data import (
    BadValueError,
    ColumnMap,
    CorruptArchiveError,
    DataError,
    MissingColumnsError,
    PreprocessSettings,
    preprocess,
    read_interactions,
)
from recsys_midx.data.readers import Delimited, JsonLines, Parquet, PythonLiterals, format_for

COLUMNS = ColumnMap(user="uid", item="sku", time="ts")


def _write_csv(path: Path, rows: list[tuple], header: str = "uid,sku,ts") -> Path:
    path.write_text(header + "\n" + "".join(",".join(map(str, row)) + "\n" for row in rows))
    return path


def _read_csv(path: Path, columns: ColumnMap = COLUMNS, **kwargs: object) -> pd.DataFrame:
    return read_interactions(path, Delimited(","), columns, **kwargs)


def _dictionary(column: pd.Series) -> list:
    """The distinct ids of a dictionary-encoded id column, in dictionary order."""
    return pa.array(column.array).dictionary.to_pylist()


def test_text_ids_become_categories(tmp_path: Path) -> None:
    path = _write_csv(
        tmp_path / "a.csv", [("bob", "0042", 3), ("alice", "B01", 1), ("bob", "B01", 2)]
    )
    raw = _read_csv(path)
    assert raw.columns.tolist() == ["user", "item", "timestamp"]
    assert _dictionary(raw["user"]) == ["bob", "alice"]  # in order of appearance
    # Leading zeros make "0042" text, so the items stay strings and keep their spelling.
    assert _dictionary(raw["item"]) == ["0042", "B01"]
    assert raw["user"].astype(str).tolist() == ["bob", "alice", "bob"]
    assert raw["timestamp"].dtype == np.int64


def test_canonical_integer_text_ids_are_ordered_as_numbers(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "a.csv", [(10, 100, 1), (9, -3, 2), (100, 20, 3)])
    raw = _read_csv(path)
    assert _dictionary(raw["user"]) == [10, 9, 100]  # numbers, in order of appearance
    out = preprocess(raw, PreprocessSettings(user_core=0, item_core=0))
    assert out.user_map["raw_id"].tolist() == ["9", "10", "100"]
    assert out.item_map["raw_id"].tolist() == ["-3", "20", "100"]


def test_declared_integer_columns_are_read_as_int64(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "a.csv", [(2, 7, 5), (1, 7, 6)])
    fmt = Delimited(",", int_columns=frozenset({"uid", "sku", "ts"}))
    raw = read_interactions(path, fmt, COLUMNS)
    assert raw["user"].dtype == np.int64 and raw["user"].tolist() == [2, 1]
    bad = _write_csv(tmp_path / "b.csv", [(2, 7, 5), ("x", 7, 6)])
    with pytest.raises(DataError, match=r"cannot parse .*b\.csv.*'x'"):
        read_interactions(bad, fmt, COLUMNS)


def test_many_batches_merge_into_one_dictionary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny blocks: hundreds of batches, each with its own dictionary of ids.
    monkeypatch.setattr(formats, "BLOCK_SIZE", 512)
    rng = np.random.default_rng(0)
    users = [f"u{x}" for x in rng.integers(0, 300, 5000)]
    items = [f"i{x:04d}" for x in rng.zipf(1.5, 5000) % 2000]
    times = rng.integers(0, 10**9, 5000)
    path = _write_csv(tmp_path / "a.csv", list(zip(users, items, times)))
    raw = _read_csv(path)
    assert raw["user"].astype(str).tolist() == users
    assert raw["item"].astype(str).tolist() == items
    assert raw["timestamp"].tolist() == times.tolist()
    assert _dictionary(raw["user"]) == list(dict.fromkeys(users))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("978300760", 978300760),
        ("978300760.9", 978300760),
        ("-5.5", -6),
        ("2017-12-17", 1513468800),
        ("2010-10-19 23:55:27", 1287532527),
        ("2010-10-19T23:55:27Z", 1287532527),
        ("2010-10-19T23:55:27.75Z", 1287532527),
        ("2010-10-20T01:55:27+02:00", 1287532527),
    ],
)
def test_times_are_seconds_or_iso_dates(tmp_path: Path, value: str, seconds: int) -> None:
    path = _write_csv(tmp_path / "a.csv", [("u", "i", value)])
    assert _read_csv(path)["timestamp"].tolist() == [seconds]


def test_zoned_and_naive_iso_times_mix(tmp_path: Path) -> None:
    # A date's "-20" must not be taken for a zone offset.
    path = _write_csv(
        tmp_path / "a.csv",
        [
            ("u", "i", "2010-10-19T23:55:27Z"),
            ("u", "j", "2010-10-19 23:55:28"),
            ("u", "k", "2010-10-20"),
        ],
    )
    assert _read_csv(path)["timestamp"].tolist() == [1287532527, 1287532528, 1287532800]


def test_unparseable_time_is_quoted_with_its_row(tmp_path: Path) -> None:
    rows = [("u", "i", f"2020-01-{d:02d}") for d in range(1, 20)] + [("u", "i", "yesterday")]
    path = _write_csv(tmp_path / "a.csv", rows)
    with pytest.raises(BadValueError) as info:
        _read_csv(path)
    error = info.value
    assert (error.value, error.row, error.column) == ("yesterday", 20, "ts")
    assert "'yesterday'" in str(error) and "a.csv" in str(error) and "ISO 8601" in str(error)
    with pytest.raises(BadValueError, match="'nan'"):
        _read_csv(_write_csv(tmp_path / "b.csv", [("u", "i", "1"), ("u", "i", "nan")]))


def test_missing_column_lists_the_columns_found(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "a.csv", [("u", "i", 1)], header="user_id,sku,ts")
    with pytest.raises(MissingColumnsError) as info:
        _read_csv(path)
    assert info.value.missing == ("uid",)
    assert info.value.found == ("user_id", "sku", "ts")
    assert "'uid'" in str(info.value) and "'user_id', 'sku', 'ts'" in str(info.value)


def test_empty_ids_are_an_error_unless_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write_csv(tmp_path / "a.csv", [("u", "i", 1), ("", "j", 2), ("v", "NA", 3)])
    with pytest.raises(DataError, match="the user is empty in 1 rows.*data row 2"):
        _read_csv(path)
    raw = _read_csv(path, drop_incomplete=True)
    # "NA" is a real id, not a missing value.
    assert raw["item"].astype(str).tolist() == ["i", "NA"]
    assert "Dropped 1 rows" in caplog.text


def test_alternative_columns_take_the_first_non_empty(tmp_path: Path) -> None:
    path = _write_csv(
        tmp_path / "a.csv", [("u", "t1", "a1", 1), ("u", "", "a2", 2)], header="uid,track,artist,ts"
    )
    raw = _read_csv(path, ColumnMap(user="uid", item=("track", "artist"), time="ts"))
    assert raw["item"].astype(str).tolist() == ["t1", "a2"]


def test_ratings_are_float32_with_nan_for_empty(tmp_path: Path) -> None:
    path = _write_csv(
        tmp_path / "a.csv", [("u", "i", 1, 4.5), ("u", "j", 2, "")], header="uid,sku,ts,stars"
    )
    raw = _read_csv(path, ColumnMap(user="uid", item="sku", time="ts", rating="stars"))
    assert raw["rating"].dtype == np.float32
    assert raw["rating"].iloc[0] == 4.5 and np.isnan(raw["rating"].iloc[1])


def test_header_only_file_is_empty(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no interactions in .*a.csv"):
        _read_csv(_write_csv(tmp_path / "a.csv", []))


def test_gzip_is_read_and_a_truncated_one_is_reported(tmp_path: Path) -> None:
    text = "uid,sku,ts\n" + "".join(f"u{i % 50},i{i % 70},{i}\n" for i in range(20000))
    packed = gzip.compress(text.encode())
    good = tmp_path / "a.csv.gz"
    good.write_bytes(packed)
    assert len(_read_csv(good)) == 20000
    cut = tmp_path / "b.csv.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(CorruptArchiveError, match="b.csv.gz is not a readable gzip archive"):
        _read_csv(cut)


def test_json_lines_keep_the_types_of_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    records = [
        {"uid": 7, "sku": "x", "ts": "2020-01-01", "text": "long review"},
        {"uid": 3, "sku": "y", "ts": "2020-01-02", "extra": [1, 2]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    raw = read_interactions(path, JsonLines(), COLUMNS)
    assert raw["user"].tolist() == [7, 3] and raw["user"].dtype == np.int64
    assert raw["timestamp"].tolist() == [1577836800, 1577923200]
    with pytest.raises(MissingColumnsError, match="'text'"):
        read_interactions(path, JsonLines(), ColumnMap(user="user", item="sku", time="ts"))


def test_parquet_files_disagreeing_on_id_types_compare_as_text(tmp_path: Path) -> None:
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"uid": [5, 40], "sku": ["x", "y"], "ts": [1, 2]}), first)
    pq.write_table(pa.table({"uid": ["007", "5"], "sku": ["x", "z"], "ts": [3, 4]}), second)
    raw = read_interactions([first, second], Parquet(), COLUMNS)
    assert raw["user"].astype(str).tolist() == ["5", "40", "007", "5"]
    assert set(_dictionary(raw["user"])) == {"007", "40", "5"}


def test_python_literal_lines(tmp_path: Path) -> None:
    path = tmp_path / "reviews.json.gz"
    lines = [
        "{'username': 'Ann', 'product_id': '10', 'date': '2017-12-17', 'text': \"it's fun\"}",
        "{'username': \"O'Neil\", 'product_id': '9', 'date': '2017-12-18', 'hours': 1.5}",
    ]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    columns = ColumnMap(user="username", item="product_id", time="date")
    raw = read_interactions(path, PythonLiterals(), columns)
    assert raw["user"].astype(str).tolist() == ["Ann", "O'Neil"]
    assert _dictionary(raw["item"]) == [10, 9]
    path.write_bytes(gzip.compress(b"{'username': 'Ann', 'date': '2017-12-17'}\n"))
    with pytest.raises(MissingColumnsError, match="'product_id'.*'username', 'date'"):
        read_interactions(path, PythonLiterals(), columns)
    path.write_bytes(gzip.compress(b"{'username': __import__('os').getcwd()}\n"))
    with pytest.raises(DataError, match="line 1: not a Python dict literal"):
        read_interactions(path, PythonLiterals(), columns)


def test_formats_follow_the_file_name(tmp_path: Path) -> None:
    assert format_for(Path("a.csv.gz")) == Delimited(",")
    assert format_for(Path("a.TSV")) == Delimited("\t")
    assert format_for(Path("a.parquet")) == Parquet()
    assert format_for(Path("a.ndjson")) == JsonLines()
    with pytest.raises(DataError, match="cannot tell the format"):
        format_for(Path("a.xlsx"))


def test_column_maps_are_checked() -> None:
    with pytest.raises(ValueError, match=r"unknown: \['stars'\], missing: \['time'\]"):
        ColumnMap.from_mapping({"user": "u", "item": "i", "stars": "s"})
    mapped = ColumnMap.from_mapping({"user": "u", "item": ["t", "a"], "time": "ts", "rating": None})
    assert mapped.wanted() == ["u", "t", "a", "ts"]
    assert mapped.to_dict() == {"user": ["u"], "item": ["t", "a"], "time": ["ts"]}
