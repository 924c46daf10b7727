"""Gowalla check-ins: gzipped, tab-separated, ISO times, served over local HTTP."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from test_download import FileServer, publish, server  # noqa: F401

from recsys_midx.data import BadValueError, Gowalla

# user, check-in time, latitude, longitude, location id (the real file's columns and format).
CHECKINS = [
    (0, "2010-10-19T23:55:27Z", 30.2359091167, -97.7951395833, 22847),
    (0, "2010-10-18T22:17:43Z", 30.2691029532, -97.7493953705, 420315),
    (0, "2010-10-17T23:42:03Z", 30.2557309927, -97.7633857727, 316637),
    (1, "2010-10-12T00:21:28Z", 40.6438845363, -73.7828063965, 23261),
    (1, "2010-10-11T20:21:20Z", 40.74137425, -73.9881052167, 22847),
]


def _file(rows: list[tuple]) -> bytes:
    return gzip.compress("".join("\t".join(map(str, row)) + "\n" for row in rows).encode())


def test_checkins_are_downloaded_and_parsed(
    server: FileServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    url, _ = publish(server, "loc-gowalla_totalCheckins.txt.gz", _file(CHECKINS))
    source = Gowalla("gowalla", url=url, md5=None, preprocess={"user_core": 0, "item_core": 0})
    ds = source.prepare(tmp_path / "data")
    assert (ds.num_users, ds.num_items, len(ds.interactions)) == (2, 4, 5)
    # The file lists each user's check-ins newest first; they come out oldest first.
    assert ds.interactions["timestamp"].tolist() == [
        1287358923,
        1287440263,
        1287532527,
        1286828480,
        1286842888,
    ]
    # Location ids are numbers: 22847 < 23261 < 316637 < 420315.
    assert ds.interactions["item_id"].tolist() == [3, 4, 1, 1, 2]


def test_a_bad_time_is_quoted(tmp_path: Path) -> None:
    rows = CHECKINS[:2] + [(1, "2010-13-45T99:00:00Z", 0.0, 0.0, 7)]
    (tmp_path / "loc-gowalla_totalCheckins.txt.gz").write_bytes(_file(rows))
    source = Gowalla("gowalla", url=None, md5=None, raw_dir=str(tmp_path))
    with pytest.raises(BadValueError, match="data row 3.*'2010-13-45T99:00:00Z'"):
        source.prepare(tmp_path / "data")
