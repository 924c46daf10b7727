"""Last.fm 1K: a tar.gz holding a tab-separated log with ISO times, served over local HTTP."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pandas as pd
import pytest
from test_download import FileServer, publish, server, tar_bytes, tree  # noqa: F401

from recsys_midx.data import LastFM1K, UnsafeArchiveError

TSV = "lastfm-dataset-1K/userid-timestamp-artid-artname-traid-traname.tsv"
ARTIST_A = "f1b1cf71-bd35-4e99-8624-24a6e15f133a"
ARTIST_B = "a7f7df4a-77d8-4f12-8acd-5c60c93f4de8"
TRACK_1 = "f7c1f8f8-b935-45ed-8fc8-7def69d92a10"
TRACK_2 = "6b4977f4-3c7a-492a-af61-1e877fa66f52"
# Newest first, as in the real file; one play lacks the track id, one lacks both ids, and names
# hold quotes that must be read verbatim.
LOG = [
    ("user_000001", "2009-05-04T23:08:57Z", ARTIST_A, 'Deep "Dish"', TRACK_1, "Fuck Me Im Famous"),
    ("user_000001", "2009-05-04T13:54:10Z", ARTIST_B, "坂本龍一", "", "Composition 0919 (Live)"),
    ("user_000001", "2009-05-04T13:52:04Z", "", "Unknown", "", "Mc2 (Live)"),
    ("user_000002", "2009-05-03T15:48:25Z", ARTIST_A, 'Deep "Dish"', TRACK_2, "Can't Stop"),
    ("user_000002", "2009-05-03T15:37:56Z", ARTIST_A, 'Deep "Dish"', TRACK_1, "Fuck Me Im Famous"),
]


def _archive(rows: list[tuple]) -> bytes:
    log = "".join("\t".join(row) + "\n" for row in rows).encode()
    return tar_bytes(
        {
            TSV: log,
            "lastfm-dataset-1K/README.txt": b"Last.fm 1K users\n",
            "lastfm-dataset-1K/userid-profile.tsv": b"#id\tgender\nuser_000001\tm\n",
        }
    )


@pytest.mark.parametrize(
    ("level", "items"),
    [
        ("track", [ARTIST_B, TRACK_1, TRACK_1, TRACK_2]),
        ("artist", [ARTIST_B, ARTIST_A, ARTIST_A, ARTIST_A]),
    ],
)
def test_plays_are_downloaded_extracted_and_parsed(
    server: FileServer,  # noqa: F811
    tmp_path: Path,
    level: str,
    items: list[str],
) -> None:
    url, md5 = publish(server, "lastfm-dataset-1K.tar.gz", _archive(LOG))
    data_dir = tmp_path / "data"
    source = LastFM1K(
        "lastfm", url=url, md5=md5, level=level, preprocess={"user_core": 0, "item_core": 0}
    )
    ds = source.prepare(data_dir)
    assert ds.stats["rows_after_step"]["input"] == 4  # the play without any id is dropped
    item_map = pd.read_parquet(ds.directory / "item_map.parquet").set_index("item_id")
    # Each user's plays, oldest first (the track id falls back to the artist id).
    assert item_map.loc[ds.interactions["item_id"], "raw_id"].tolist() == items
    assert f"lastfm-1k/{TSV}" in tree(data_dir / "raw")


def test_a_link_in_the_archive_is_refused(server: FileServer, tmp_path: Path) -> None:  # noqa: F811
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        link = tarfile.TarInfo(TSV)
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tf.addfile(link)
    url, md5 = publish(server, "lastfm-dataset-1K.tar.gz", buffer.getvalue())
    data_dir = tmp_path / "data"
    with pytest.raises(UnsafeArchiveError, match="symbolic link"):
        LastFM1K("lastfm", url=url, md5=md5).prepare(data_dir)
    assert not (data_dir / "raw" / "lastfm-1k").exists()


def test_level_is_checked() -> None:
    with pytest.raises(ValueError, match="level must be one of"):
        LastFM1K("lastfm", url="http://unused", level="album")
