"""Errors raised by the data layer.

Every error is a :class:`DataError`, so callers can catch data problems as a group. Each subclass
takes the facts of the problem as arguments (and keeps them as attributes), so its message always
says precisely what went wrong and where.
"""

from __future__ import annotations

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
    """An archive entry would be written outside the extraction folder (or is a symlink).

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
    """An archive cannot be read (truncated, not a zip, bad CRC).

    Args:
        archive: the archive.
        reason: what the reader reported.
    """

    def __init__(self, archive: Path, reason: str) -> None:
        self.archive = Path(archive)
        self.reason = reason
        super().__init__(f"{self.archive} is not a readable zip archive ({reason})")
