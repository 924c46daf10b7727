"""Gowalla location check-ins (SNAP): which user checked in where, and when."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from recsys_midx.data.readers import ColumnMap, Delimited, read_interactions
from recsys_midx.data.sources.remote import RemoteSource

_FILE = "loc-gowalla_totalCheckins.txt.gz"
_FORMAT = Delimited(
    "\t",
    header=False,
    quoted=False,
    names=("user", "check_in_time", "latitude", "longitude", "location_id"),
    int_columns=frozenset({"user", "location_id"}),
)


class Gowalla(RemoteSource):
    """Gowalla check-ins as implicit feedback: the item is the location.

    ``loc-gowalla_totalCheckins.txt.gz`` is tab-separated without a header: user id, ISO 8601
    check-in time (``2010-10-19T23:55:27Z``), latitude, longitude, location id. It is read
    compressed, streaming. No md5 is published.

    Args:
        name: the dataset's name (labels the processed folder).
        url: address of the gzipped check-ins; unused with ``raw_dir``.
        md5: expected md5 of the download, or None.
        raw_dir: a folder that directly contains ``loc-gowalla_totalCheckins.txt.gz``.
        preprocess: filters (default: 5-core).

    Raises:
        ValueError: neither ``url`` nor ``raw_dir`` given.

    Example:
        ```python
        gowalla = Gowalla(
            "gowalla", url="https://snap.stanford.edu/data/loc-gowalla_totalCheckins.txt.gz")
        dataset = gowalla.prepare("datasets")
        ```
    """

    family = "gowalla"

    def _files(self) -> tuple[str, ...]:
        return (_FILE,)

    def _read(self, folder: Path) -> pd.DataFrame:
        columns = ColumnMap(user="user", item="location_id", time="check_in_time")
        return read_interactions(folder / _FILE, _FORMAT, columns)
