"""Cached preprocessing: source -> raw frame -> processed Parquet folder.

A processed dataset lives in ``<data_dir>/processed/<name>-<key>/`` where ``key`` is computed from
the source's fingerprint, its preprocess settings and :data:`SCHEMA_VERSION`; changing any of them
gives a new folder, so a cache is never stale. The folder is written atomically and reused once
complete (see :mod:`recsys_midx.data.cache`).

Files of a processed folder:

``interactions.parquet``
    ``user_id`` int32 (1..U), ``item_id`` int32 (1..N), ``timestamp`` int64 (seconds since the
    epoch; for a source without times, such as ``dataset.columns.time=null``, the row's 0-based
    position in the source's files, read in order, so that order stands for time), ``rating``
    float32 (NaN when the source has no ratings). Sorted by ``user_id``, then ``timestamp``;
    equal timestamps keep the source's order. Id 0 is padding and never occurs.
``user_map.parquet``
    ``user_id`` int32, ``raw_id`` string: the source's id of each user, ordered by ``user_id``.
    Ids follow the ascending order of the raw ids (numeric order for numeric raw ids).
``item_map.parquet``
    ``item_id`` int32, ``raw_id`` string: likewise for items.
``stats.json``
    ``users``, ``items``, ``interactions``, ``density``, ``sequence_length`` (``min``, ``p25``,
    ``p50``, ``p75``, ``p90``, ``max``, ``mean``), ``rows_after_step`` (rows left after each
    filter), ``core_passes``, ``settings`` (the preprocess settings) and ``timestamp``
    (``"seconds"`` or ``"row position"``: what the timestamps count; absent from folders written
    before it existed, which hold seconds).
``settings.json``
    ``name``, ``schema_version``, ``fingerprint`` (the source's) and ``preprocess`` (the settings):
    everything the folder's key was computed from.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_midx.data.cache import (
    SETTINGS_FILE,
    STATS_FILE,
    cached,
    checked_contents,
    processed_directory,
    write_json,
)
from recsys_midx.data.preprocess import TIMESTAMP_ROW_POSITION, ProcessedData, preprocess

if TYPE_CHECKING:
    from recsys_midx.data.sources.base import Source

log = logging.getLogger(__name__)

#: Bump whenever the processed files change meaning or layout: old caches then stop matching.
SCHEMA_VERSION = 1

_SCHEMAS = {
    "interactions.parquet": pa.schema(
        [
            ("user_id", pa.int32()),
            ("item_id", pa.int32()),
            ("timestamp", pa.int64()),
            ("rating", pa.float32()),
        ]
    ),
    "user_map.parquet": pa.schema([("user_id", pa.int32()), ("raw_id", pa.string())]),
    "item_map.parquet": pa.schema([("item_id", pa.int32()), ("raw_id", pa.string())]),
}
_FILES = (*_SCHEMAS, STATS_FILE, SETTINGS_FILE)


@dataclass(frozen=True, eq=False)
class PreparedDataset:
    """A processed dataset, loaded from its cache folder.

    Attributes:
        name: the source's name.
        directory: the processed folder the data was read from.
        interactions: the ``interactions.parquet`` frame (schema in the module docstring).
        num_users: ``U``; user ids are ``1..U``.
        num_items: ``N``; item ids are ``1..N``.
        stats: the content of ``stats.json``.
    """

    name: str
    directory: Path
    interactions: pd.DataFrame
    num_users: int
    num_items: int
    stats: dict[str, Any]

    @property
    def time_is_row_order(self) -> bool:
        """True when the timestamps are row positions: the source had no time column."""
        return self.stats.get("timestamp") == TIMESTAMP_ROW_POSITION


def cache_settings(source: Source) -> dict[str, Any]:
    """Everything a processed folder depends on (what ``settings.json`` holds).

    Args:
        source: the dataset source.

    Returns:
        ``name``, ``schema_version``, ``fingerprint`` and ``preprocess``.
    """
    return {
        "name": source.name,
        "schema_version": SCHEMA_VERSION,
        "fingerprint": source.fingerprint(),
        "preprocess": source.preprocess.to_dict(),
    }


def cache_directory(source: Source, data_dir: str | Path) -> Path:
    """The processed folder of ``source`` under ``data_dir`` (it may not exist yet).

    Args:
        source: the dataset source.
        data_dir: the data root.

    Returns:
        ``<data_dir>/processed/<name>-<12 hex chars>``.
    """
    return processed_directory(data_dir, cache_settings(source))


def prepare_dataset(source: Source, data_dir: str | Path) -> PreparedDataset:
    """Load the processed dataset of ``source``, building and caching it first if needed.

    Args:
        source: where the raw interactions come from and how to filter them.
        data_dir: the data root; raw files go to ``data_dir/raw``, processed folders to
            ``data_dir/processed``.

    Returns:
        The processed dataset.

    Raises:
        DataError: obtaining, parsing or filtering the raw data failed (see the subclasses).

    Example:
        >>> from recsys_midx.data import Synthetic
        >>> ds = prepare_dataset(Synthetic(num_users=50, num_items=40), "/tmp/datasets")
        >>> ds.num_users
        50
    """
    settings = cache_settings(source)
    directory = processed_directory(data_dir, settings)

    def build() -> ProcessedData:
        return preprocess(source.load_raw(Path(data_dir).expanduser()), source.preprocess)

    def write_files(tmp: Path, processed: ProcessedData) -> None:
        start = time.perf_counter()
        _write(tmp, processed)
        log.info(
            "Wrote %s in %.1f s: %d users, %d items, %d interactions",
            directory,
            time.perf_counter() - start,
            processed.stats["users"],
            processed.stats["items"],
            processed.stats["interactions"],
        )

    return cached(directory, settings, build, write_files, load_prepared)


def _write(directory: Path, processed: ProcessedData) -> None:
    """Write the data files of a processed folder (``settings.json`` is the cache's)."""
    frames = {
        "interactions.parquet": processed.interactions,
        "user_map.parquet": processed.user_map,
        "item_map.parquet": processed.item_map,
    }
    for file_name, frame in frames.items():
        table = pa.Table.from_pandas(frame, schema=_SCHEMAS[file_name], preserve_index=False)
        pq.write_table(table, directory / file_name)
    # Statistics keep their natural order (steps in the order they run).
    write_json(directory / STATS_FILE, processed.stats, sort_keys=False)


def load_stats(directory: Path) -> dict[str, Any]:
    """Read the statistics of a processed folder without loading its interactions.

    Args:
        directory: the processed folder.

    Returns:
        The content of ``stats.json``.

    Raises:
        MissingFilesError: a file of the folder is missing.
        DataError: the folder was written with another :data:`SCHEMA_VERSION`.

    Example:
        ```python
        load_stats(Path("datasets/processed/ml-100k-0123456789ab"))["users"]
        # 943
        ```
    """
    _, stats = checked_contents(Path(directory), _FILES, SCHEMA_VERSION)
    return stats


def load_prepared(directory: Path) -> PreparedDataset:
    """Read a processed folder written by :func:`prepare_dataset`.

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
    return PreparedDataset(
        name=settings["name"],
        directory=directory,
        interactions=pd.read_parquet(directory / "interactions.parquet"),
        num_users=int(stats["users"]),
        num_items=int(stats["items"]),
        stats=stats,
    )
