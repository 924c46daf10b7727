"""MovieLens 10M, 20M and 25M from archives in their real layouts, served over local HTTP.

(ml-100k and ml-1m, the download checks and the cache are covered by ``test_download.py``.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_download import FileServer, publish, server, tree, zip_bytes  # noqa: F401

from recsys_midx.data import ChecksumError, MissingFilesError, MovieLens

# Users 1..6 rate movies 10, 20, ..., 60 in half stars (the 5-core); user 7 rates two movies
# and movie 999 has a single rating: both fall out of a 5-core.
ROWS = [
    (user, 10 * movie, 0.5 + ((user + movie) % 10) / 2, 1_200_000_000 + 1000 * user + movie)
    for user in range(1, 7)
    for movie in range(1, 7)
] + [(7, 10, 4.0, 1_300_000_000), (7, 20, 3.5, 1_300_000_001), (2, 999, 5.0, 1_200_002_999)]


def _archive(variant: str) -> bytes:
    """The variant's zip: its top folder and ratings file in the official format."""
    if variant == "ml-10m":
        ratings = "".join(f"{u}::{i}::{r:g}::{t}\n" for u, i, r, t in ROWS)
        return zip_bytes(
            {
                "ml-10M100K/ratings.dat": ratings.encode(),
                "ml-10M100K/movies.dat": b"10::Film (1995)::Drama\n",
            }
        )
    ratings = "userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{r:.1f},{t}\n" for u, i, r, t in ROWS
    )
    return zip_bytes(
        {
            f"{variant}/ratings.csv": ratings.encode(),
            f"{variant}/movies.csv": b"movieId,title,genres\n10,Film (1995),Drama\n",
        }
    )


@pytest.mark.parametrize("variant", ["ml-10m", "ml-20m", "ml-25m"])
def test_variant_is_downloaded_and_parsed(
    server: FileServer,  # noqa: F811
    tmp_path: Path,
    variant: str,
) -> None:
    url, md5 = publish(server, f"{variant}.zip", _archive(variant))
    data_dir = tmp_path / "data"
    ds = MovieLens(variant, variant, url=url, md5=md5).prepare(data_dir)
    assert (ds.num_users, ds.num_items, len(ds.interactions)) == (6, 6, 36)
    assert ds.stats["rows_after_step"]["input"] == len(ROWS)
    expected = sorted(r for u, i, r, _ in ROWS if u <= 6 and i != 999)
    assert sorted(ds.interactions["rating"].tolist()) == expected
    assert ds.interactions["rating"].dtype == np.float32
    folder = "ml-10M100K" if variant == "ml-10m" else variant
    assert f"{variant}/{folder}/{'ratings.dat' if variant == 'ml-10m' else 'ratings.csv'}" in tree(
        data_dir / "raw"
    )


def test_checksum_mismatch_keeps_nothing(server: FileServer, tmp_path: Path) -> None:  # noqa: F811
    url, _ = publish(server, "ml-20m.zip", _archive("ml-20m"))
    with pytest.raises(ChecksumError):
        MovieLens("ml-20m", "ml-20m", url=url, md5="cd245b17a1ae2cc31bb14903e1204af3").prepare(
            tmp_path / "data"
        )
    assert tree(tmp_path / "data") in ([], ["raw"])


def test_ml10m_raw_dir_needs_the_extracted_folder(tmp_path: Path) -> None:
    source = MovieLens("ml-10m", "ml-10m", url=None, md5=None, raw_dir=str(tmp_path))
    with pytest.raises(MissingFilesError, match="'ratings.dat'.*'ml-10M100K/' folder"):
        source.prepare(tmp_path / "data")
