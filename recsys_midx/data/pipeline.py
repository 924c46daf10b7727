"""Cached preprocessing: source -> raw frame -> processed Parquet folder.

A processed dataset lives in ``<data_dir>/processed/<name>-<key>/`` where ``key`` is the first 12
hex characters of the sha256 of the source's fingerprint, its preprocess settings and
:data:`SCHEMA_VERSION`; changing any of them gives a new folder, so a cache is never stale. The
folder is written under a temporary name and renamed into place when complete, so an existing
folder is always a finished one and is reused.

Files of a processed folder:

``interactions.parquet``
    ``user_id`` int32 (1..U), ``item_id`` int32 (1..N), ``timestamp`` int64 (seconds since the
    epoch), ``rating`` float32 (NaN when the source has no ratings). Sorted by ``user_id``, then
    ``timestamp``; equal timestamps keep the source's order. Id 0 is padding and never occurs.
``user_map.parquet``
    ``user_id`` int32, ``raw_id`` string: the source's id of each user, ordered by ``user_id``.
    Ids follow the ascending order of the raw ids (numeric order for numeric raw ids).
``item_map.parquet``
    ``item_id`` int32, ``raw_id`` string: likewise for items.
``stats.json``
    ``users``, ``items``, ``interactions``, ``density``, ``sequence_length`` (``min``, ``p25``,
    ``p50``, ``p75``, ``p90``, ``max``, ``mean``), ``rows_after_step`` (rows left after each
    filter), ``core_passes`` and ``settings`` (the preprocess settings).
``settings.json``
    ``name``, ``schema_version``, ``fingerprint`` (the source's) and ``preprocess`` (the settings):
    everything the folder's key was computed from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_midx.data.download import atomic_directory
from recsys_midx.data.errors import DataError, MissingFilesError
from recsys_midx.data.preprocess import ProcessedData, preprocess

if TYPE_CHECKING:
    from recsys_midx.data.sources.base import Source

log = logging.getLogger(__name__)

#: Bump whenever the processed files change meaning or layout: old caches then stop matching.
SCHEMA_VERSION = 1

_SCHEMAS = {
    "interactions.parquet": pa.schema([
        ("user_id", pa.int32()), ("item_id", pa.int32()),
        ("timestamp", pa.int64()), ("rating", pa.float32()),
    ]),
    "user_map.parquet": pa.schema([("user_id", pa.int32()), ("raw_id", pa.string())]),
    "item_map.parquet": pa.schema([("item_id", pa.int32()), ("raw_id", pa.string())]),
}
_FILES = (*_SCHEMAS, "stats.json", "settings.json")


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
    blob = json.dumps(cache_settings(source), sort_keys=True).encode()
    key = hashlib.sha256(blob).hexdigest()[:12]
    return Path(data_dir).expanduser() / "processed" / f"{source.name}-{key}"


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
    directory = cache_directory(source, data_dir)
    if directory.is_dir():
        log.info("Reusing processed dataset %s", directory)
        return load_prepared(directory)
    log.info("Preparing dataset %r into %s", source.name, directory)
    processed = preprocess(source.load_raw(Path(data_dir).expanduser()), source.preprocess)
    start = time.perf_counter()
    with atomic_directory(directory) as tmp:
        _write(tmp, processed, cache_settings(source))
    log.info(
        "Wrote %s in %.1f s: %d users, %d items, %d interactions", directory,
        time.perf_counter() - start, processed.stats["users"], processed.stats["items"],
        processed.stats["interactions"],
    )
    del processed  # not held while the written copy is read back
    return load_prepared(directory)


def _write(directory: Path, processed: ProcessedData, settings: dict[str, Any]) -> None:
    """Write the files of a processed folder."""
    frames = {
        "interactions.parquet": processed.interactions,
        "user_map.parquet": processed.user_map,
        "item_map.parquet": processed.item_map,
    }
    for file_name, frame in frames.items():
        table = pa.Table.from_pandas(frame, schema=_SCHEMAS[file_name], preserve_index=False)
        pq.write_table(table, directory / file_name)
    # Statistics keep their natural order (steps in the order they run); settings are sorted.
    for file_name, content, sort_keys in (
        ("stats.json", processed.stats, False), ("settings.json", settings, True),
    ):
        (directory / file_name).write_text(
            json.dumps(content, indent=2, sort_keys=sort_keys) + "\n"
        )


def checked_settings(
    directory: Path, files: Sequence[str], schema_version: int
) -> dict[str, Any]:
    """The ``settings.json`` of a processed folder, once the folder is known to be complete and
    of the schema version the reading code expects.

    Args:
        directory: the processed folder.
        files: the names every complete folder holds (``settings.json`` among them).
        schema_version: the version the reading code understands.

    Raises:
        MissingFilesError: a file of ``files`` is missing.
        DataError: the folder was written with another schema version.
    """
    missing = [name for name in files if not (directory / name).is_file()]
    if missing:
        raise MissingFilesError(directory, missing, "Delete the folder to have it rebuilt.")
    settings: dict[str, Any] = json.loads((directory / "settings.json").read_text())
    if settings.get("schema_version") != schema_version:
        raise DataError(
            f"{directory} was written with schema version {settings.get('schema_version')}, "
            f"this code reads version {schema_version}; delete the folder to have it rebuilt"
        )
    return settings


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
        >>> load_stats(Path("datasets/processed/ml-100k-0123456789ab"))["users"]  # doctest: +SKIP
        943
    """
    directory = Path(directory)
    checked_settings(directory, _FILES, SCHEMA_VERSION)
    return json.loads((directory / "stats.json").read_text())


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
    settings = checked_settings(directory, _FILES, SCHEMA_VERSION)
    stats = json.loads((directory / "stats.json").read_text())
    return PreparedDataset(
        name=settings["name"],
        directory=directory,
        interactions=pd.read_parquet(directory / "interactions.parquet"),
        num_users=int(stats["users"]),
        num_items=int(stats["items"]),
        stats=stats,
    )
