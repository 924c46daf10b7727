"""Steam game reviews (Kang & McAuley, SASRec): who reviewed which game, and when."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from recsys_midx.data.readers import ColumnMap, PythonLiterals, read_interactions
from recsys_midx.data.sources.remote import RemoteSource

_FILE = "steam_reviews.json.gz"


class Steam(RemoteSource):
    """Steam reviews as implicit feedback: user ``username``, item ``product_id``, day ``date``.

    Despite its name, ``steam_reviews.json.gz`` is not JSON: each line is a Python dict literal
    with single-quoted strings. Lines are parsed with :func:`ast.literal_eval` (literals only,
    never code), a batch of lines at a time: slow, but the 7.8M reviews are parsed only once
    (the result is cached). Review days (``YYYY-MM-DD``)
    become midnight UTC, so a user's reviews of the same day keep their order in the file. No md5
    is published.

    Args:
        name: the dataset's name (labels the processed folder).
        url: address of ``steam_reviews.json.gz``; unused with ``raw_dir``.
        md5: expected md5 of the download, or None.
        raw_dir: a folder that directly contains ``steam_reviews.json.gz``.
        preprocess: filters (default: 5-core).

    Raises:
        ValueError: neither ``url`` nor ``raw_dir`` given.

    Example:
        ```python
        steam = Steam("steam", url="https://cseweb.ucsd.edu/~wckang/steam_reviews.json.gz")
        dataset = steam.prepare("datasets")
        ```
    """

    family = "steam"

    def _files(self) -> tuple[str, ...]:
        return (_FILE,)

    def _read(self, folder: Path) -> pd.DataFrame:
        columns = ColumnMap(user="username", item="product_id", time="date")
        return read_interactions(folder / _FILE, PythonLiterals(), columns)
