"""The shared mechanics of sources whose raw files come from the web (or, failing that, by hand).

A :class:`RemoteSource` either downloads its file (md5-checked when a checksum is published) into
``data_dir/raw/`` and, for an archive, extracts it safely, or reads the files from a ``raw_dir``
the user points at. Either way it checks that the files it needs are there before reading them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from recsys_midx.data.download import download, extract_archive
from recsys_midx.data.errors import CorruptArchiveError, ManualDownloadError, MissingFilesError
from recsys_midx.data.preprocess import PreprocessSettings
from recsys_midx.data.readers import file_signature
from recsys_midx.data.sources.base import Source


@dataclass(frozen=True)
class Download:
    """Where a source's download is stored and, for an archive, where it is extracted.

    Attributes:
        file: path of the downloaded file under ``data_dir/raw``.
        extract_to: folder under ``data_dir/raw`` to extract the archive into; None when the
            file is read as it is (possibly compressed).
        inner: the folder inside the archive that holds the files.
    """

    file: str
    extract_to: str | None = None
    inner: str = ""


class RemoteSource(Source):
    """A source read from downloaded files, or from a folder of already obtained files.

    Subclasses name their family, say which files the folder must hold (:meth:`_files`), how to
    read them (:meth:`_read`) and, unless the download is the first of those files, where it goes
    (:meth:`_download`).

    Args:
        name: the dataset's name (labels the processed folder).
        url: where to download the file; unused with ``raw_dir``.
        md5: expected md5 of the download, or None where none is published.
        raw_dir: a folder that directly contains the files (nothing is downloaded).
        preprocess: filters (see :class:`~recsys_midx.data.sources.base.Source`).

    Raises:
        ValueError: neither ``url`` nor ``raw_dir`` is given, for a source that can download.
    """

    #: The fingerprint's ``source`` field.
    family: ClassVar[str]
    #: How to obtain the files by hand, for sources whose terms forbid automated downloads.
    manual_steps: ClassVar[str | None] = None

    def __init__(
        self,
        name: str,
        url: str | None,
        md5: str | None,
        raw_dir: str | None = None,
        preprocess: Mapping[str, Any] | PreprocessSettings | None = None,
    ) -> None:
        super().__init__(name, preprocess)
        if not url and not raw_dir and self.manual_steps is None:
            raise ValueError(f"{name!r}: give the archive's url or an extracted raw_dir")
        self.url = url or None
        self.md5 = md5.lower() if md5 else None
        self.raw_dir = Path(raw_dir).expanduser() if raw_dir else None

    def _download(self) -> Download:
        """Where the download is stored (and extracted); by default ``<family>/<first file>``."""
        return Download(f"{self.family}/{self._files()[0]}")

    @abc.abstractmethod
    def _files(self) -> tuple[str, ...]:
        """The files the reader needs, relative to the folder."""

    @abc.abstractmethod
    def _read(self, folder: Path) -> pd.DataFrame:
        """The raw frame (see :meth:`Source.load_raw`) from a folder holding :meth:`_files`."""

    def _identity(self) -> dict[str, Any]:
        """What, besides its origin, determines the raw content (e.g. a variant or category)."""
        return {}

    def _raw_dir_hint(self) -> str:
        """The sentence that tells how to fix a ``raw_dir`` that lacks files."""
        files = ", ".join(repr(name) for name in self._files())
        return f"raw_dir must be the folder that directly contains {files}"

    def fingerprint(self) -> dict[str, Any]:
        """The family, its identity, and where the content comes from.

        A known md5 pins the content by itself (mirrors may change the url); without one the url
        stands for it; a ``raw_dir`` is identified by its absolute path and the size and
        modification time of its files, so replacing a file rebuilds the processed data.
        """
        origin: dict[str, Any]
        if self.raw_dir is not None:
            folder = self.raw_dir.resolve()
            signature = file_signature([folder / name for name in self._files()])
            origin = {"raw_dir": str(folder), "files": list(signature.values())}
        elif self.md5 is not None:
            origin = {"md5": self.md5}
        else:
            origin = {"url": self.url}
        return {"source": self.family, **self._identity(), **origin}

    def load_raw(self, data_dir: Path) -> pd.DataFrame:
        """Download and extract the files unless ``raw_dir`` is set, then read them.

        Args:
            data_dir: the data root (downloads go to ``data_dir/raw``).

        Returns:
            Columns ``user``, ``item``, ``timestamp`` and, where the source has ratings,
            ``rating``; rows in file order.

        Raises:
            ManualDownloadError: the source cannot be downloaded and no ``raw_dir`` is set; the
                message gives the steps to follow.
            ChecksumError: the download has the wrong md5 (nothing is kept).
            DownloadError: the download failed.
            CorruptArchiveError: the archive or compressed file is truncated or unreadable; a
                downloaded one is removed so that the next run downloads it again.
            UnsafeArchiveError: the archive has entries that could escape its folder.
            MissingFilesError: the folder lacks files the source needs (named in the message).
            DataError: the files do not have the expected content.
        """
        if self.raw_dir is not None:
            return self._read_checked(self.raw_dir, self._raw_dir_hint())
        if self.url is None:
            assert self.manual_steps is not None  # __init__ requires a url otherwise
            raise ManualDownloadError(self.name, self.manual_steps)
        spec = self._download()
        raw_root = Path(data_dir) / "raw"
        archive = download(self.url, raw_root / spec.file, self.md5)
        try:
            if spec.extract_to is None:
                folder = archive.parent
            else:
                folder = extract_archive(archive, raw_root / spec.extract_to) / spec.inner
            return self._read_checked(folder, f"{self.url} does not have the expected layout")
        except CorruptArchiveError:
            archive.unlink(missing_ok=True)
            raise

    def _read_checked(self, folder: Path, hint: str) -> pd.DataFrame:
        missing = [name for name in self._files() if not (folder / name).is_file()]
        if missing:
            raise MissingFilesError(folder, missing, hint)
        return self._read(folder)
