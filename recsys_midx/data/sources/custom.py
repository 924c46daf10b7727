"""Your own interactions: a CSV, TSV, Parquet, JSON-lines or one-user-per-line file (or a folder
of them)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from recsys_midx.data.errors import DataError, MissingColumnsError, MissingFilesError
from recsys_midx.data.preprocess import PreprocessSettings
from recsys_midx.data.readers import (
    ColumnMap,
    Delimited,
    Format,
    JsonLines,
    Parquet,
    Sequences,
    file_signature,
    format_for,
    read_interactions,
)
from recsys_midx.data.sources.base import Source

log = logging.getLogger(__name__)

_FORMATS = ("csv", "tsv", "parquet", "jsonl", "sequences")


class Custom(Source):
    """Interactions from local files, with a mapping from your column names to the fields.

    Ids may be integers or text (text ids made only of canonical integers are ordered as
    numbers); times may be seconds since the epoch or ISO 8601 dates/date-times; a rating column
    is optional. A folder is read as the concatenation of its files (recursively, in name order,
    skipping names that start with ``.`` or ``_`` such as ``_SUCCESS``). The cache is keyed by the
    files' paths, sizes and modification times, so editing a file rebuilds the processed data.

    Without a time column (``time`` mapped to None) the files are taken to be in time order:
    each user's interactions keep their order in the files (read one after the other), and the
    processed ``timestamp`` holds each row's 0-based position there.

    Args:
        name: the dataset's name (labels the processed folder).
        path: a file or a folder of files.
        columns: ``user``, ``item``, ``time`` and optionally ``rating``: the name of the column
            holding each (a list names alternatives: the first non-empty one is taken); ``time``
            None: the files have no time column, their row order stands for it (logged once
            when the files are read).
        format: ``"csv"``, ``"tsv"``, ``"parquet"``, ``"jsonl"`` or ``"sequences"`` (one user
            per line, its id and then its items in time order: :class:`Sequences`, whose
            columns are ``user`` and ``item``); None: from the file suffix (``.csv``, ``.tsv``,
            ``.parquet``, ``.jsonl``/``.json``, optionally ``.gz``).
        delimiter: the separator of a delimited file, when it is not the format's (``,`` for
            csv, tab for tsv), e.g. ``";"`` or ``"|"``; for ``sequences`` None is any whitespace.
        header: a delimited file starts with a header line; otherwise give ``names``.
        names: column names of a delimited file without a header line.
        preprocess: filters (default: 5-core, all ratings kept).

    Raises:
        ValueError: unknown format, or a column mapping without user, item or time (time may
            be None, but must be given).

    Example:
        ```python
        shop = Custom("shop", "~/data/orders.parquet",
                      columns={"user": "uid", "item": "sku", "time": "ts"})
        dataset = shop.prepare("datasets")
        ```
    """

    def __init__(
        self,
        name: str,
        path: str,
        columns: Mapping[str, Any],
        format: str | None = None,  # noqa: A002 - the config field's natural name
        delimiter: str | None = None,
        header: bool = True,
        names: Sequence[str] | None = None,
        preprocess: Mapping[str, Any] | PreprocessSettings | None = None,
    ) -> None:
        super().__init__(name, preprocess)
        if format is not None and format not in _FORMATS:
            raise ValueError(f"format must be one of {_FORMATS} or None, got {format!r}")
        self.path = Path(path).expanduser()
        self.columns = ColumnMap.from_mapping(columns)
        self.format = format
        self.delimiter = delimiter
        self.header = bool(header)
        self.names = tuple(names) if names is not None else None

    def files(self) -> list[Path]:
        """The files that are read: ``path`` itself, or the data files of the folder.

        Returns:
            Absolute paths, in reading order (empty if ``path`` does not exist).
        """
        root = self.path.resolve()
        if not root.is_dir():
            return [root] if root.exists() else []
        return sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and not any(part[0] in "._" for part in p.relative_to(root).parts)
        )

    def fingerprint(self) -> dict[str, Any]:
        """The path, the files' sizes and modification times, and how they are read."""
        return {
            "source": "custom",
            "path": str(self.path.resolve()),
            "files": file_signature(self.files()),
            "format": self.format,
            "delimiter": self.delimiter,
            "header": self.header,
            "names": list(self.names) if self.names is not None else None,
            "columns": self.columns.to_dict(),
        }

    def load_raw(self, data_dir: Path) -> pd.DataFrame:
        """Read the files (``data_dir`` is not used: nothing is downloaded).

        Args:
            data_dir: unused; part of the :class:`Source` interface.

        Returns:
            See :func:`recsys_midx.data.readers.read_interactions`.

        Raises:
            MissingFilesError: ``path`` does not exist, or is a folder without data files.
            MissingColumnsError: a mapped column is missing (the message lists those found and
                names the ``dataset.columns.*`` setting to fix).
            EmptyFileError: a file has no content at all.
            BadValueError: a time cannot be parsed (the message quotes it).
            DataError: the files cannot be read in the chosen format.
        """
        files = self.files()
        if not files:
            folder = self.path if self.path.is_dir() else self.path.parent
            what = "data files" if self.path.is_dir() else self.path.name
            hint = (
                "dataset.path names a folder without data files"
                if self.path.is_dir()
                else f"dataset.path={self.path} names no existing file or folder"
            )
            raise MissingFilesError(folder, [what], hint)
        if self.columns.time is None:
            log.warning(
                "dataset.columns.time is null: each user's interactions are ordered as they appear "
                "in %s, and their timestamps are the rows' positions there",
                self.path,
            )
        try:
            return read_interactions(files, self._format(files), self.columns)
        except MissingColumnsError as error:
            raise MissingColumnsError(
                error.path, error.missing, error.found, self._column_settings(error.missing)
            ) from None

    def _column_settings(self, names: Sequence[str]) -> list[str]:
        """The ``dataset.columns.*`` settings that map the raw column ``names``."""
        setting = {
            raw: f"dataset.columns.{field}"
            for field, raws in self.columns.sources().items()
            for raw in raws
        }
        return list(dict.fromkeys(setting[name] for name in names if name in setting))

    def _format(self, files: list[Path]) -> Format:
        """The configured format, or the one the suffixes agree on."""
        if self.format is None:
            formats = {format_for(p) for p in files}
            if len(formats) > 1:
                raise DataError(f"{self.path} holds files of different formats; set dataset.format")
            fmt = formats.pop()
        else:
            fmt = {
                "csv": Delimited(","),
                "tsv": Delimited("\t"),
                "parquet": Parquet(),
                "jsonl": JsonLines(),
                "sequences": Sequences(self.delimiter),
            }[self.format]
        if isinstance(fmt, Delimited):
            fmt = Delimited(
                self.delimiter or fmt.delimiter,
                header=self.header,
                names=self.names,
            )
        return fmt
