"""Errors raised by the data layer.

Every error is a :class:`DataError`, so callers can catch data problems as a group. Each subclass
takes the facts of the problem as arguments (and keeps them as attributes), so its message always
says precisely what went wrong and where.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _restore(cls: type[DataError], args: tuple[Any, ...], state: dict[str, Any]) -> DataError:
    """Rebuild a pickled error without calling its (keyword-rich) ``__init__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class DataError(Exception):
    """Base class of all data-layer errors (bad downloads, archives, files or filters)."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions are pickled as ``cls(*args)`` by default, which breaks for subclasses whose
        # ``__init__`` takes structured fields; errors must survive a trip between processes
        # (data-loader workers, DDP ranks).
        return _restore, (type(self), self.args, self.__dict__)


class DownloadError(DataError):
    """A download failed before its content could be checked (network, HTTP status, truncation).

    Args:
        url: the address that was requested.
        reason: what went wrong.
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"download of {url} failed: {reason}")


class ChecksumError(DataError):
    """A file's md5 differs from the expected one.

    Args:
        source: the URL or path whose content was checked.
        expected: the md5 that was asked for.
        actual: the md5 of the content that was received.
    """

    def __init__(self, source: str, expected: str, actual: str) -> None:
        self.source = source
        self.expected = expected
        self.actual = actual
        super().__init__(f"md5 mismatch for {source}: expected {expected}, got {actual}")


class MissingFilesError(DataError):
    """A folder lacks files that are needed to read a dataset.

    Args:
        folder: the folder that was searched.
        missing: the names (relative to ``folder``) that were not found.
        hint: an optional sentence on how to fix it.
    """

    def __init__(self, folder: Path, missing: Sequence[str], hint: str | None = None) -> None:
        self.folder = Path(folder)
        self.missing = tuple(missing)
        self.hint = hint
        message = f"{self.folder} lacks {', '.join(repr(name) for name in self.missing)}"
        super().__init__(f"{message}. {hint}" if hint else message)


class EmptyDatasetError(DataError):
    """A preprocessing step removed every interaction.

    Args:
        step: the step that left nothing, with its settings, e.g.
            ``"rating filter (min_rating=4.0)"``.
        rows_before: how many interactions entered the step.
    """

    def __init__(self, step: str, rows_before: int) -> None:
        self.step = step
        self.rows_before = rows_before
        super().__init__(f"{step} removed all {rows_before} interactions: nothing is left")


class UnsafeArchiveError(DataError):
    """An archive entry would be written outside the extraction folder, or is a link or device.

    Args:
        archive: the archive.
        member: the offending entry name.
        reason: why it is refused.
    """

    def __init__(self, archive: Path, member: str, reason: str) -> None:
        self.archive = Path(archive)
        self.member = member
        self.reason = reason
        super().__init__(f"refusing to extract {self.archive}: entry {member!r} {reason}")


class CorruptArchiveError(DataError):
    """An archive or compressed file cannot be read (truncated, wrong format, bad CRC).

    Args:
        archive: the archive or compressed file.
        reason: what the reader reported.
        kind: the format it should have (``"zip"``, ``"tar"``, ``"gzip"``...).
    """

    def __init__(self, archive: Path, reason: str, kind: str = "zip") -> None:
        self.archive = Path(archive)
        self.reason = reason
        self.kind = kind
        super().__init__(f"{self.archive} is not a readable {kind} archive ({reason})")


class TextFormatError(DataError):
    """A text file cannot be read as its format says (a line, or the file as a whole).

    Args:
        path: the file.
        line: the 1-based line number of the problem (``None`` for the file as a whole).
        reason: what is wrong.
    """

    def __init__(self, path: Path, line: int | None, reason: str) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}, line {line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {reason}")


class XCFormatError(TextFormatError):
    """A file does not follow the Extreme Classification Repository text format."""


class MissingColumnsError(DataError):
    """A raw file lacks columns that the column mapping names.

    Args:
        path: the file.
        missing: the mapped names that were not found.
        found: the columns the file does have.
        settings: the settings that map the missing names, as the user writes them (e.g.
            ``dataset.columns.time``); the message asks to fix them.
    """

    def __init__(
        self,
        path: Path,
        missing: Sequence[str],
        found: Sequence[str],
        settings: Sequence[str] = (),
    ) -> None:
        self.path = Path(path)
        self.missing = tuple(missing)
        self.found = tuple(found)
        self.settings = tuple(settings)
        message = (
            f"{self.path} has no column {', '.join(repr(name) for name in self.missing)}; "
            f"columns found: {', '.join(repr(name) for name in self.found) or 'none'}"
        )
        if self.settings:
            which = "one of them" if len(self.settings) == 1 else "columns of the file"
            message += f"; set {', '.join(self.settings)} to {which}"
        super().__init__(message)


class EmptyFileError(DataError):
    """A data file holds nothing at all (zero bytes).

    Args:
        path: the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        super().__init__(f"{self.path} is empty")


class BadValueError(DataError):
    """A raw value cannot be parsed (e.g. a timestamp that is neither a number nor a date).

    Args:
        path: the file.
        column: the raw column.
        row: the 1-based data row (not counting a header line).
        value: the offending value, as found.
        expected: what a valid value looks like.
    """

    def __init__(self, path: Path, column: str, row: int, value: str, expected: str) -> None:
        self.path = Path(path)
        self.column = column
        self.row = row
        self.value = value
        self.expected = expected
        super().__init__(
            f"{self.path}, data row {row}, column {column!r}: cannot parse {value!r} as {expected}"
        )


class UnknownCategoryError(DataError):
    """A dataset family has no category of that name.

    Args:
        family: the dataset family, e.g. ``"Amazon 2014"``.
        category: the name that was asked for.
        known: every valid name.
    """

    def __init__(self, family: str, category: str, known: Sequence[str]) -> None:
        self.family = family
        self.category = category
        self.known = tuple(known)
        close = difflib.get_close_matches(category, self.known, n=3, cutoff=0.6)
        suggestion = (
            f" (did you mean {' or '.join(repr(name) for name in close)}?)" if close else ""
        )
        super().__init__(
            f"unknown {family} category {category!r}{suggestion}; known categories: "
            f"{', '.join(self.known)}"
        )


class ManualDownloadError(DataError):
    """A dataset's terms forbid automated downloads: its files must be fetched by hand.

    Args:
        dataset: the dataset's name.
        instructions: the steps to follow, ending with the setting that points at the files.
    """

    def __init__(self, dataset: str, instructions: str) -> None:
        self.dataset = dataset
        self.instructions = instructions
        super().__init__(f"{dataset} cannot be downloaded automatically.\n{instructions}")
