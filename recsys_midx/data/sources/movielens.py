"""MovieLens ratings (GroupLens), from the official zip archives or an extracted folder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from recsys_midx.data.preprocess import PreprocessSettings
from recsys_midx.data.readers import ColumnMap, Delimited, read_interactions
from recsys_midx.data.sources.remote import Download, RemoteSource

_DAT_COLUMNS = ColumnMap(user="user", item="item", time="timestamp", rating="rating")
_CSV_COLUMNS = ColumnMap(user="userId", item="movieId", time="timestamp", rating="rating")
# "::" separated files are read as ":" separated ones whose every other field is empty (and
# never read): pyarrow's fast reader only takes one-character delimiters.
_DOUBLE_COLON = Delimited(
    ":",
    header=False,
    names=("user", None, "item", None, "rating", None, "timestamp"),
    int_columns=frozenset({"user", "item", "timestamp"}),
)


@dataclass(frozen=True)
class _Layout:
    """Where a variant keeps its ratings and how they are written."""

    folder: str  # top-level folder of the official zip
    ratings: str  # ratings file inside it
    format: Delimited
    columns: ColumnMap


_LAYOUTS = {
    "ml-100k": _Layout(
        "ml-100k",
        "u.data",
        Delimited(
            "\t",
            header=False,
            names=("user", "item", "rating", "timestamp"),
            int_columns=frozenset({"user", "item", "timestamp"}),
        ),
        _DAT_COLUMNS,
    ),
    "ml-1m": _Layout("ml-1m", "ratings.dat", _DOUBLE_COLON, _DAT_COLUMNS),
    "ml-10m": _Layout("ml-10M100K", "ratings.dat", _DOUBLE_COLON, _DAT_COLUMNS),
    **{
        variant: _Layout(
            variant,
            "ratings.csv",
            Delimited(",", int_columns=frozenset({"userId", "movieId", "timestamp"})),
            _CSV_COLUMNS,
        )
        for variant in ("ml-20m", "ml-25m")
    },
}


class MovieLens(RemoteSource):
    """MovieLens explicit ratings (1-5 stars, half stars from ml-10m on) with timestamps.

    Without ``raw_dir`` the official zip is downloaded to ``data_dir/raw/<variant>.zip``, its md5
    checked, and extracted to ``data_dir/raw/<variant>/``. With ``raw_dir`` the ratings are read
    from that already-extracted folder and nothing is downloaded. The ratings file is streamed,
    so ml-20m and ml-25m are read in bounded memory.

    Args:
        name: the dataset's name (labels the processed folder).
        variant: ``"ml-100k"`` (``u.data``, tab-separated), ``"ml-1m"`` / ``"ml-10m"``
            (``ratings.dat``, ``::``-separated) or ``"ml-20m"`` / ``"ml-25m"`` (``ratings.csv``
            with a header line).
        url: address of the official zip; unused with ``raw_dir``.
        md5: expected md5 of the zip, or None to skip the check.
        raw_dir: a folder that directly contains the ratings file (e.g. ``u.data``).
        preprocess: filters (defaults: 5-core, all ratings kept).

    Raises:
        ValueError: unknown variant, or neither ``url`` nor ``raw_dir`` given.

    Example:
        ```python
        ml = MovieLens("ml-1m", "ml-1m",
                       url="https://files.grouplens.org/datasets/movielens/ml-1m.zip",
                       md5="c4d9eecfca2ab87c1945afe126590906")
        ml.prepare("datasets").num_items
        # 3416
        ```
    """

    family = "movielens"

    def __init__(
        self,
        name: str,
        variant: str,
        url: str | None,
        md5: str | None,
        raw_dir: str | None = None,
        preprocess: Mapping[str, Any] | PreprocessSettings | None = None,
    ) -> None:
        if variant not in _LAYOUTS:
            raise ValueError(f"unknown MovieLens variant {variant!r}; known: {sorted(_LAYOUTS)}")
        self.variant = variant
        self._layout = _LAYOUTS[variant]
        super().__init__(name, url, md5, raw_dir, preprocess)

    def _identity(self) -> dict[str, Any]:
        return {"variant": self.variant}

    def _download(self) -> Download:
        return Download(f"{self.variant}.zip", extract_to=self.variant, inner=self._layout.folder)

    def _files(self) -> tuple[str, ...]:
        return (self._layout.ratings,)

    def _raw_dir_hint(self) -> str:
        return (
            f"{super()._raw_dir_hint()} (the '{self._layout.folder}/' folder of the official "
            "archive)"
        )

    def _read(self, folder: Path) -> pd.DataFrame:
        layout = self._layout
        return read_interactions(folder / layout.ratings, layout.format, layout.columns)
