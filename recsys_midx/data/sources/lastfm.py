"""Last.fm 1K (Celma): the listening histories of about 1,000 users."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from recsys_midx.data.preprocess import PreprocessSettings
from recsys_midx.data.readers import ColumnMap, Delimited, read_interactions
from recsys_midx.data.sources.remote import Download, RemoteSource

_FOLDER = "lastfm-dataset-1K"
_FILE = "userid-timestamp-artid-artname-traid-traname.tsv"
# Artist and track names hold quotes that do not quote anything: read the fields verbatim.
_FORMAT = Delimited(
    "\t",
    header=False,
    quoted=False,
    names=("userid", "timestamp", "artid", "artname", "traid", "traname"),
)
# The first non-empty column of each row is the item.
_ITEM_COLUMNS = {"track": ("traid", "artid"), "artist": ("artid",)}


class LastFM1K(RemoteSource):
    """Last.fm 1K listening events as implicit feedback.

    ``userid-timestamp-artid-artname-traid-traname.tsv`` (inside ``lastfm-dataset-1K.tar.gz``) is
    tab-separated without a header, with ISO 8601 times. The item is a MusicBrainz id:

    * ``level="track"`` (default): the track id; where a row has none, the artist id stands in
      for it, so the play still counts, as "some track of this artist";
    * ``level="artist"``: the artist id.

    Rows with neither id are dropped (their number is logged). The tar archive is extracted with
    the same safety checks as zips (no absolute paths, ``..``, links or devices).

    Args:
        name: the dataset's name (labels the processed folder).
        url: address of ``lastfm-dataset-1K.tar.gz``; unused with ``raw_dir``.
        md5: expected md5 of the archive, or None.
        raw_dir: a folder that directly contains the ``.tsv`` (the archive's
            ``lastfm-dataset-1K/`` folder).
        level: ``"track"`` or ``"artist"``.
        preprocess: filters (default: 5-core).

    Raises:
        ValueError: unknown ``level``, or neither ``url`` nor ``raw_dir`` given.

    Example:
        ```python
        lastfm = LastFM1K("lastfm-1k", url="http://mtg.upf.edu/static/datasets/last.fm/"
                          "lastfm-dataset-1K.tar.gz")
        dataset = lastfm.prepare("datasets")
        ```
    """

    family = "lastfm-1k"

    def __init__(
        self,
        name: str,
        url: str | None,
        md5: str | None = None,
        raw_dir: str | None = None,
        level: str = "track",
        preprocess: Mapping[str, Any] | PreprocessSettings | None = None,
    ) -> None:
        if level not in _ITEM_COLUMNS:
            raise ValueError(f"level must be one of {sorted(_ITEM_COLUMNS)}, got {level!r}")
        self.level = level
        super().__init__(name, url, md5, raw_dir, preprocess)

    def _identity(self) -> dict[str, Any]:
        return {"level": self.level}

    def _download(self) -> Download:
        return Download(f"{_FOLDER}.tar.gz", extract_to="lastfm-1k", inner=_FOLDER)

    def _files(self) -> tuple[str, ...]:
        return (_FILE,)

    def _read(self, folder: Path) -> pd.DataFrame:
        columns = ColumnMap(user="userid", item=_ITEM_COLUMNS[self.level], time="timestamp")
        return read_interactions(folder / _FILE, _FORMAT, columns, drop_incomplete=True)
