"""Steam reviews: gzipped Python dict literals (not JSON), served over local HTTP."""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd
import pytest
from test_download import FileServer, publish, server, tree  # noqa: F401

from recsys_midx.data import CorruptArchiveError, DataError, Steam

NO_FILTER = {"user_core": 0, "item_core": 0}


def _line(user: str, product: str, day: str) -> str:
    """One review as the file writes it: a Python literal with single-quoted strings."""
    record = {
        "username": user,
        "hours": 1.5,
        "products": 7,
        "product_id": product,
        "page_order": 0,
        "date": day,
        "text": "Great game, isn't it?",
        "early_access": False,
        "page": 1,
    }
    return repr(record)


def _file(lines: list[str]) -> bytes:
    return gzip.compress(("\n".join(lines) + "\n").encode())


def test_reviews_are_downloaded_and_parsed(
    server: FileServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    lines = [
        _line("Chaos Syren", "725280", "2017-12-17"),
        _line("Ann's", "35140", "2018-01-05"),
        _line("Chaos Syren", "35140", "2017-12-17"),
        _line("Ann's", "328100", "2017-03-01"),
    ]
    url, _ = publish(server, "steam_reviews.json.gz", _file(lines))
    data_dir = tmp_path / "data"
    ds = Steam("steam", url=url, md5=None, preprocess=NO_FILTER).prepare(data_dir)
    assert (ds.num_users, ds.num_items, len(ds.interactions)) == (2, 3, 4)
    users = pd.read_parquet(ds.directory / "user_map.parquet")["raw_id"].tolist()
    items = pd.read_parquet(ds.directory / "item_map.parquet")["raw_id"].tolist()
    assert users == ["Ann's", "Chaos Syren"] and items == ["35140", "328100", "725280"]
    # Same-day reviews keep the file's order; days are midnight UTC.
    assert ds.interactions["timestamp"].tolist() == [1488326400, 1515110400, 1513468800, 1513468800]
    assert ds.interactions["item_id"].tolist() == [2, 1, 3, 1]
    assert tree(data_dir / "raw") == ["steam", "steam/steam_reviews.json.gz"]


def test_truncated_download_is_removed(server: FileServer, tmp_path: Path) -> None:  # noqa: F811
    content = _file([_line(f"user{i}", str(i % 7), "2017-12-17") for i in range(3000)])
    url, _ = publish(server, "steam_reviews.json.gz", content[: len(content) // 2])
    data_dir = tmp_path / "data"
    with pytest.raises(CorruptArchiveError, match="not a readable gzip archive"):
        Steam("steam", url=url, md5=None).prepare(data_dir)
    assert tree(data_dir / "raw") == ["steam"]  # the next run downloads it again


def test_a_line_that_is_not_a_literal_names_its_number(tmp_path: Path) -> None:
    (tmp_path / "steam_reviews.json.gz").write_bytes(
        _file([_line("a", "1", "2017-12-17"), "{'username': 'b', 'product_id': oops}"])
    )
    with pytest.raises(DataError, match="line 2: not a Python dict literal"):
        Steam("steam", url=None, md5=None, raw_dir=str(tmp_path)).prepare(tmp_path / "data")
