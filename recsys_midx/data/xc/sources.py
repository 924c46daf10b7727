"""Where extreme classification points come from, and their processed Parquet cache.

A source (:class:`XCRepository` for the Extreme Classification Repository's files,
:class:`~recsys_midx.data.xc.synthetic.XCSynthetic` for generated data) says what determines its
points and how to produce its train and test points; :meth:`XCSource.prepare` caches them in a
processed folder ``<data_dir>/processed/<name>-<key>/`` keyed by the source's fingerprint and
:data:`SCHEMA_VERSION` (see :mod:`recsys_midx.data.cache`):

``train.parquet``, ``test.parquet``
    One row per point (schema in :mod:`recsys_midx.data.xc.parquet`).
``stats.json``
    ``features``, ``labels``, ``train_points``, ``test_points`` and summary statistics.
``settings.json``
    ``name``, ``schema_version`` and ``fingerprint``: what the folder's key was computed from.

The repository ships train and test files only; the data module holds out a seeded fraction of
the training points for validation.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recsys_midx.data.cache import (
    SETTINGS_FILE,
    STATS_FILE,
    cached_source,
    checked_contents,
    checked_name,
    write_json,
)
from recsys_midx.data.errors import MissingFilesError, XCFormatError
from recsys_midx.data.xc.containers import XCData
from recsys_midx.data.xc.parquet import read_parquet, write_parquet
from recsys_midx.data.xc.text_format import read_xc_file

#: Bump whenever the processed files change meaning or layout: old caches then stop matching.
SCHEMA_VERSION = 1

REPOSITORY_URL = "http://manikvarma.org/downloads/XC/XMLRepository.html"

_SPLITS = ("train", "test")
_FILES = (*(f"{split}.parquet" for split in _SPLITS), STATS_FILE, SETTINGS_FILE)


@dataclass(frozen=True, eq=False)
class XCDataset:
    """A processed dataset, loaded from its cache folder.

    Attributes:
        name: the source's name.
        directory: the processed folder.
        train: the training points (validation is held out of them later).
        test: the test points.
        stats: the content of ``stats.json``.
    """

    name: str
    directory: Path
    train: XCData
    test: XCData
    stats: dict[str, Any]

    @property
    def num_features(self) -> int:
        """``F``."""
        return self.train.num_features

    @property
    def num_labels(self) -> int:
        """``L``."""
        return self.train.num_labels


def _summary(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {}
    quantiles = np.percentile(values, [50, 90])
    return {
        "min": float(values.min()),
        "p50": float(quantiles[0]),
        "p90": float(quantiles[1]),
        "max": float(values.max()),
        "mean": float(values.mean()),
    }


def dataset_stats(train: XCData, test: XCData) -> dict[str, Any]:
    """Sizes and label/feature statistics of a train/test pair (what ``stats.json`` holds).

    Args:
        train: training points.
        test: test points.

    Returns:
        ``features``, ``labels``, ``train_points``, ``test_points``, ``labels_per_point``,
        ``features_per_point`` and ``label_frequency`` (training points per label, over labels
        seen in training) summaries, ``train_labels_seen`` and ``test_points_without_labels``.
    """
    counts = train.label_counts()[1:]
    return {
        "features": train.num_features,
        "labels": train.num_labels,
        "train_points": train.num_points,
        "test_points": test.num_points,
        "labels_per_point": _summary(train.labels.row_lengths()),
        "features_per_point": _summary(train.features.row_lengths()),
        "label_frequency": _summary(counts[counts > 0]),
        "train_labels_seen": int((counts > 0).sum()),
        "test_points_without_labels": int((test.labels.row_lengths() == 0).sum()),
    }


class XCSource(abc.ABC):
    """Where the points of an extreme classification dataset come from.

    Subclasses say what determines their content (:meth:`fingerprint`) and how to produce the
    train and test points (:meth:`build`); :meth:`prepare` caches them as Parquet.

    Args:
        name: the dataset's name; it labels the processed folder, so it must be a plain file name
            (letters, digits, ``.``, ``_``, ``-``).
        propensity_a: ``A`` of the label propensity model used by PSP@k.
        propensity_b: ``B`` of the label propensity model.

    Raises:
        ValueError: if the name is not a plain file name or a propensity constant is negative.
    """

    def __init__(self, name: str, propensity_a: float = 0.55, propensity_b: float = 1.5) -> None:
        self.name = checked_name(name)
        if propensity_a < 0 or propensity_b < 0:
            raise ValueError(
                f"propensity constants must be >= 0, got A={propensity_a}, B={propensity_b}"
            )
        self.propensity_a = float(propensity_a)
        self.propensity_b = float(propensity_b)

    @abc.abstractmethod
    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        """Everything that determines the points (generator settings, raw file names and sizes).

        Args:
            data_dir: the data root.

        Returns:
            A JSON-compatible dict; the processed folder is keyed by it.
        """

    @abc.abstractmethod
    def build(self, data_dir: Path) -> tuple[XCData, XCData]:
        """Produce the train and test points.

        Args:
            data_dir: the data root.

        Returns:
            ``(train, test)``.

        Raises:
            DataError: the raw data cannot be found or read.
        """

    def prepare(self, data_dir: str | Path) -> XCDataset:
        """Load the processed dataset, building and caching it first if needed.

        Args:
            data_dir: the data root (processed folders go to ``data_dir/processed``).

        Returns:
            The dataset.

        Raises:
            DataError: see :meth:`build`; a cache folder written by another schema version.

        Example:
            >>> from recsys_midx.data.xc import XCSynthetic
            >>> XCSynthetic(num_labels=50, num_train=200, num_test=50).prepare("/tmp/data").name
            'xc-synthetic'
        """
        data_dir = Path(data_dir).expanduser()

        def write_files(directory: Path, points: tuple[XCData, XCData]) -> None:
            for split, data in zip(_SPLITS, points):
                write_parquet(directory / f"{split}.parquet", data)
            write_json(directory / STATS_FILE, dataset_stats(*points), sort_keys=True)

        return cached_source(
            data_dir,
            self.name,
            SCHEMA_VERSION,
            self.fingerprint(data_dir),
            lambda: self.build(data_dir),
            write_files,
            load_xc_dataset,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def load_xc_dataset(directory: Path) -> XCDataset:
    """Read a processed folder written by :meth:`XCSource.prepare`.

    Args:
        directory: the processed folder.

    Returns:
        The dataset it holds.

    Raises:
        MissingFilesError: a file of the folder is missing.
        DataError: the folder was written with another :data:`SCHEMA_VERSION`.
    """
    directory = Path(directory)
    settings, stats = checked_contents(directory, _FILES, SCHEMA_VERSION)
    train, test = (
        read_parquet(directory / f"{split}.parquet", stats["features"], stats["labels"])
        for split in _SPLITS
    )
    return XCDataset(settings["name"], directory, train, test, stats)


class XCRepository(XCSource):
    """A dataset of the Extreme Classification Repository, read from hand-downloaded files.

    The repository's files cannot be fetched by a script, so they are looked up in ``raw_dir``
    (default ``<data_dir>/raw/<name>``) under the names given in ``files``; when some are
    missing the error lists them and says where to get them.

    Args:
        name: the dataset's name, e.g. ``xc-eurlex-4k``.
        files: the file name of each split, ``{"train": ..., "test": ...}``.
        raw_dir: the folder holding the files (``None``: ``<data_dir>/raw/<name>``).
        propensity_a: ``A`` of the propensity model (0.55 in general, 0.6 for Amazon datasets,
            0.5 for Wikipedia ones).
        propensity_b: ``B`` (1.5 in general, 2.6 for Amazon datasets, 0.4 for Wikipedia ones).

    Raises:
        ValueError: if ``files`` does not name exactly a ``train`` and a ``test`` file, or on
            the conditions of :class:`XCSource`.

    Example:
        ```python
        source = XCRepository("xc-eurlex-4k", {"train": "eurlex_train.txt",
                                               "test": "eurlex_test.txt"}, raw_dir="~/Eurlex")
        dataset = source.prepare("datasets")
        ```
    """

    def __init__(
        self,
        name: str,
        files: Mapping[str, str],
        raw_dir: str | Path | None = None,
        propensity_a: float = 0.55,
        propensity_b: float = 1.5,
    ) -> None:
        super().__init__(name, propensity_a, propensity_b)
        self.files = {split: str(file) for split, file in dict(files).items()}
        if sorted(self.files) != sorted(_SPLITS):
            raise ValueError(f"files must name a 'train' and a 'test' file, got {self.files}")
        self.raw_dir = None if raw_dir is None else Path(raw_dir).expanduser()

    def folder(self, data_dir: Path) -> Path:
        """The folder the raw files are read from."""
        return self.raw_dir if self.raw_dir is not None else Path(data_dir) / "raw" / self.name

    def _paths(self, data_dir: Path) -> dict[str, Path]:
        """The raw file of each split; ``MissingFilesError`` listing the absent ones."""
        folder = self.folder(data_dir)
        paths = {split: folder / file for split, file in self.files.items()}
        missing = [self.files[split] for split in _SPLITS if not paths[split].is_file()]
        if missing:
            raise MissingFilesError(
                folder,
                missing,
                f"The Extreme Classification Repository's files are distributed by hand: "
                f"download {self.name}'s bag-of-words files from {REPOSITORY_URL} and put "
                f"{' and '.join(repr(self.files[s]) for s in _SPLITS)} in {folder}, or set "
                "dataset.raw_dir to the folder that holds them.",
            )
        return paths

    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        paths = self._paths(data_dir)
        return {
            split: {"file": self.files[split], "bytes": paths[split].stat().st_size}
            for split in _SPLITS
        }

    def build(self, data_dir: Path) -> tuple[XCData, XCData]:
        paths = self._paths(data_dir)
        train, test = (read_xc_file(paths[split]) for split in _SPLITS)
        if (train.num_features, train.num_labels) != (test.num_features, test.num_labels):
            raise XCFormatError(
                paths["test"],
                1,
                f"declares {test.num_features} features and {test.num_labels} labels, the "
                f"training file {train.num_features} and {train.num_labels}",
            )
        return train, test
