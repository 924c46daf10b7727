"""The processed-dataset cache shared by every kind of dataset.

A processed dataset lives in ``<data_dir>/processed/<name>-<key>/``. ``key`` is the first 12 hex
characters of the sha256 of the folder's *settings*: a JSON-compatible dict holding at least
``name`` and ``schema_version`` plus whatever the content depends on (the source's fingerprint,
preprocess settings...). Changing any of them gives a new folder, so a cache is never stale. The
folder is filled under a temporary name and renamed into place when complete, so an existing
folder is always a finished one and is reused as it is. Its ``settings.json`` holds the settings
the key was computed from, so that readers can check the schema version before trusting the
files.

Example:
    ```python
    settings = {"name": "toy", "schema_version": 1, "fingerprint": {"seed": 0}}
    directory = processed_directory("/tmp/datasets", settings)
    dataset = cached(directory, settings, build, write_files, load)
    ```
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from recsys_midx.data.download import atomic_directory
from recsys_midx.data.errors import DataError, MissingFilesError

log = logging.getLogger(__name__)

#: The file of every processed folder that holds its dataset's statistics.
STATS_FILE = "stats.json"
#: The file of every processed folder that records what its key was computed from.
SETTINGS_FILE = "settings.json"

T = TypeVar("T")
Built = TypeVar("Built")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def checked_name(name: str) -> str:
    """``name``, once it is known to be a plain file name (letters, digits, ``.``, ``_``, ``-``):
    a dataset's name labels its processed folder.

    Raises:
        ValueError: it is not.

    Example:
        >>> checked_name("ml-1m")
        'ml-1m'
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"dataset name {name!r} must consist of letters, digits, '.', '_' and '-'")
    return name


def cache_key(settings: Mapping[str, Any]) -> str:
    """The key of a processed folder: 12 hex characters of the sha256 of its settings.

    Args:
        settings: JSON-compatible settings; key order does not matter.

    Returns:
        The key.

    Example:
        >>> cache_key({"name": "toy", "schema_version": 1}) == cache_key(
        ...     {"schema_version": 1, "name": "toy"})
        True
    """
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def processed_directory(data_dir: str | Path, settings: Mapping[str, Any]) -> Path:
    """The processed folder for ``settings`` under ``data_dir`` (it may not exist yet).

    Args:
        data_dir: the data root.
        settings: the folder's settings, with a ``name``.

    Returns:
        ``<data_dir>/processed/<name>-<key>``.
    """
    return Path(data_dir).expanduser() / "processed" / f"{settings['name']}-{cache_key(settings)}"


def write_json(path: Path, content: Any, *, sort_keys: bool) -> None:
    """Write ``content`` as indented JSON with a final newline.

    Args:
        path: the file.
        content: JSON-compatible content.
        sort_keys: sort mapping keys (settings) or keep their order (statistics whose order
            means something, such as steps in the order they run).
    """
    path.write_text(json.dumps(content, indent=2, sort_keys=sort_keys) + "\n")


def cached(
    directory: Path,
    settings: Mapping[str, Any],
    build: Callable[[], Built],
    write_files: Callable[[Path, Built], None],
    load: Callable[[Path], T],
) -> T:
    """Load a processed folder, building it first if it does not exist.

    The dataset is built before the folder is created, so a failing build leaves nothing
    behind; what was built is released before the written copy is read back.

    Args:
        directory: the folder (from :func:`processed_directory` of ``settings``).
        settings: what the folder's key was computed from; written to ``settings.json``.
        build: produces the dataset; it runs only when the folder does not exist yet.
        write_files: writes what ``build`` returned into the (temporary) folder it is given.
        load: reads a complete folder.

    Returns:
        What ``load`` returns for ``directory``.

    Raises:
        Exception: whatever ``build``, ``write_files`` or ``load`` raise; when building or
            writing fails nothing is left behind.
    """
    if directory.is_dir():
        log.info("Reusing processed dataset %s", directory)
        return load(directory)
    log.info("Preparing dataset %r into %s", settings["name"], directory)
    built = build()
    with atomic_directory(directory) as tmp:
        write_files(tmp, built)
        write_json(tmp / SETTINGS_FILE, settings, sort_keys=True)
    del built
    return load(directory)


def checked_settings(directory: Path, files: Sequence[str], schema_version: int) -> dict[str, Any]:
    """The ``settings.json`` of a processed folder, once the folder is known to be complete and
    of the schema version the reading code expects.

    Args:
        directory: the processed folder.
        files: the names every complete folder holds (``settings.json`` among them).
        schema_version: the version the reading code understands.

    Returns:
        The folder's settings.

    Raises:
        MissingFilesError: a file of ``files`` is missing.
        DataError: the folder was written with another schema version.
    """
    missing = [name for name in files if not (directory / name).is_file()]
    if missing:
        raise MissingFilesError(directory, missing, "Delete the folder to have it rebuilt.")
    settings: dict[str, Any] = json.loads((directory / SETTINGS_FILE).read_text())
    if settings.get("schema_version") != schema_version:
        raise DataError(
            f"{directory} was written with schema version {settings.get('schema_version')}, "
            f"this code reads version {schema_version}; delete the folder to have it rebuilt"
        )
    return settings


def checked_contents(
    directory: Path, files: Sequence[str], schema_version: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and statistics of a complete processed folder of the expected schema.

    Args:
        directory: the processed folder.
        files: the names every complete folder holds (``settings.json`` and ``stats.json``
            among them).
        schema_version: the version the reading code understands.

    Returns:
        ``(settings, stats)``: the contents of ``settings.json`` and ``stats.json``.

    Raises:
        MissingFilesError: a file of ``files`` is missing.
        DataError: the folder was written with another schema version.
    """
    settings = checked_settings(directory, files, schema_version)
    return settings, json.loads((directory / STATS_FILE).read_text())


def cached_source(
    data_dir: str | Path,
    name: str,
    schema_version: int,
    fingerprint: Mapping[str, Any],
    build: Callable[[], Built],
    write_files: Callable[[Path, Built], None],
    load: Callable[[Path], T],
) -> T:
    """Load a source's processed folder under ``data_dir``, building it first if needed: the
    folder's settings are the source's ``name``, the ``schema_version`` of the code that reads
    it and the source's ``fingerprint`` (:func:`cached` does the rest).

    Args:
        data_dir: the data root.
        name: the dataset's name.
        schema_version: the version of the processed files the reading code understands.
        fingerprint: everything that determines the content (JSON-compatible).
        build: produces the dataset.
        write_files: writes what ``build`` returned into a folder.
        load: reads a complete folder.

    Returns:
        What ``load`` returns.
    """
    settings = {"name": name, "schema_version": schema_version, "fingerprint": dict(fingerprint)}
    directory = processed_directory(data_dir, settings)
    return cached(directory, settings, build, write_files, load)
