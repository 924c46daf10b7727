"""MovieLens ratings (GroupLens), from the official zip archives or an extracted folder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from recsys_midx.data.download import download, extract_zip
from recsys_midx.data.errors import CorruptArchiveError, DataError, MissingFilesError
from recsys_midx.data.preprocess import PreprocessSettings
from recsys_midx.data.sources.base import Source

_TYPES = {"user": pa.int64(), "item": pa.int64(), "rating": pa.float32(), "timestamp": pa.int64()}
_PLAIN = ("user", "item", "rating", "timestamp")
# "::" separated files are read as ":" separated ones whose every other field is empty (and
# skipped): pyarrow's fast reader only takes one-character delimiters.
_DOUBLE_COLON = ("user", None, "item", None, "rating", None, "timestamp")


@dataclass(frozen=True)
class _Layout:
    """Where a variant keeps its ratings and how they are written."""

    folder: str  # top-level folder of the official zip
    ratings: str  # ratings file inside it
    delimiter: str
    fields: tuple[str | None, ...]  # column of each field; None: field to skip
    header: bool


_LAYOUTS = {
    "ml-100k": _Layout("ml-100k", "u.data", "\t", _PLAIN, header=False),
    "ml-1m": _Layout("ml-1m", "ratings.dat", ":", _DOUBLE_COLON, header=False),
    "ml-10m": _Layout("ml-10M100K", "ratings.dat", ":", _DOUBLE_COLON, header=False),
    "ml-20m": _Layout("ml-20m", "ratings.csv", ",", _PLAIN, header=True),
    "ml-25m": _Layout("ml-25m", "ratings.csv", ",", _PLAIN, header=True),
}


class MovieLens(Source):
    """MovieLens explicit ratings (1-5 stars) with timestamps.

    Without ``raw_dir`` the official zip is downloaded to ``data_dir/raw/<variant>.zip``, its md5
    checked, and extracted to ``data_dir/raw/<variant>/``. With ``raw_dir`` the ratings are read
    from that already-extracted folder and nothing is downloaded.

    Args:
        name: the dataset's name (labels the processed folder).
        variant: ``"ml-100k"`` (``u.data``, tab-separated), ``"ml-1m"`` / ``"ml-10m"``
            (``ratings.dat``, ``::``-separated) or ``"ml-20m"`` / ``"ml-25m"`` (``ratings.csv``).
        url: address of the official zip; unused with ``raw_dir``.
        md5: expected md5 of the zip, or None to skip the check.
        raw_dir: a folder that directly contains the ratings file (e.g. ``u.data``).
        preprocess: filters (defaults: 5-core, all ratings kept).

    Raises:
        ValueError: unknown variant, or neither ``url`` nor ``raw_dir`` given.

    Example:
        >>> ml = MovieLens("ml-1m", "ml-1m",
        ...                url="https://files.grouplens.org/datasets/movielens/ml-1m.zip",
        ...                md5="c4d9eecfca2ab87c1945afe126590906")
        >>> ml.prepare("datasets").num_items  # doctest: +SKIP
        3416
    """

    def __init__(
        self,
        name: str,
        variant: str,
        url: str | None,
        md5: str | None,
        raw_dir: str | None = None,
        preprocess: Mapping[str, Any] | PreprocessSettings | None = None,
    ) -> None:
        super().__init__(name, preprocess)
        if variant not in _LAYOUTS:
            raise ValueError(f"unknown MovieLens variant {variant!r}; known: {sorted(_LAYOUTS)}")
        if not url and not raw_dir:
            raise ValueError(f"{name!r}: give the archive's url or an extracted raw_dir")
        self.variant = variant
        self.url = url
        self.md5 = md5.lower() if md5 else None
        self.raw_dir = Path(raw_dir).expanduser() if raw_dir else None
        self._layout = _LAYOUTS[variant]

    def fingerprint(self) -> dict[str, Any]:
        """The variant and where its content comes from.

        A known md5 pins the content by itself (mirrors may change the url); without one the
        url stands for it; a ``raw_dir`` is identified by its absolute path.
        """
        origin: dict[str, Any]
        if self.raw_dir is not None:
            origin = {"raw_dir": str(self.raw_dir.resolve())}
        elif self.md5 is not None:
            origin = {"md5": self.md5}
        else:
            origin = {"url": self.url}
        return {"source": "movielens", "variant": self.variant, **origin}

    def load_raw(self, data_dir: Path) -> pd.DataFrame:
        """Read the ratings, downloading and extracting the archive first unless ``raw_dir`` is set.

        Args:
            data_dir: the data root (the archive goes to ``data_dir/raw``).

        Returns:
            Columns ``user``, ``item``, ``rating``, ``timestamp``, in the file's order.

        Raises:
            ChecksumError: the downloaded archive has the wrong md5 (nothing is kept).
            DownloadError: the download failed.
            CorruptArchiveError: the archive is unreadable; it is removed so that the next run
                downloads it again.
            UnsafeArchiveError: the archive has entries that would escape its folder.
            MissingFilesError: the folder lacks the variant's ratings file.
            DataError: the ratings file does not have the variant's format.
        """
        layout = self._layout
        if self.raw_dir is not None:
            folder = self.raw_dir
            hint = (f"raw_dir must be the folder that directly contains {layout.ratings!r} "
                    f"(the '{layout.folder}/' folder of the official archive)")
        else:
            folder = self._fetch(Path(data_dir) / "raw")
            hint = f"{self.url} does not have the {self.variant} layout"
        path = folder / layout.ratings
        if not path.is_file():
            raise MissingFilesError(folder, [layout.ratings], hint)
        return _read_ratings(path, layout)

    def _fetch(self, raw_root: Path) -> Path:
        """Download and extract the archive; return the folder holding the ratings file."""
        assert self.url is not None  # __init__ requires url when raw_dir is unset
        archive = download(self.url, raw_root / f"{self.variant}.zip", self.md5)
        try:
            root = extract_zip(archive, raw_root / self.variant)
        except CorruptArchiveError:
            archive.unlink(missing_ok=True)
            raise
        return root / self._layout.folder


def _read_ratings(path: Path, layout: _Layout) -> pd.DataFrame:
    """Parse a ratings file with pyarrow's multi-threaded CSV reader."""
    names = [field or f"_skip{i}" for i, field in enumerate(layout.fields)]
    wanted = [field for field in layout.fields if field]
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=int(layout.header)),
            parse_options=pacsv.ParseOptions(delimiter=layout.delimiter, quote_char=False),
            convert_options=pacsv.ConvertOptions(
                include_columns=wanted, column_types={c: _TYPES[c] for c in wanted}
            ),
        )
    except pa.ArrowInvalid as e:
        raise DataError(f"cannot parse {path} as {layout.folder} ratings: {e}") from e
    return table.to_pandas()[list(_PLAIN)]
