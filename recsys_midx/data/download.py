"""Downloads with checksums, safe archive extraction (zip, tar), atomic publication of results.

Nothing here ever leaves a half-written result under its final name: files are streamed into a
temporary sibling and renamed into place once complete and verified, folders are filled as a
temporary sibling and renamed into place. A result that exists under its final name is therefore
complete, which is what lets later runs (and concurrent ranks) reuse it.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import shutil
import stat
import tarfile
import urllib.error
import urllib.request
import uuid
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PureWindowsPath

from tqdm.auto import tqdm

from recsys_midx.data.errors import (
    ChecksumError,
    CorruptArchiveError,
    DownloadError,
    UnsafeArchiveError,
)

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_TIMEOUT_S = 60.0
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def _temporary_sibling(path: Path) -> Path:
    """A unique, hidden name next to ``path`` (same file system, so a rename is atomic)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def file_md5(path: Path) -> str:
    """The hex md5 of a file, read in chunks.

    Args:
        path: the file.

    Returns:
        The lowercase hex digest.
    """
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_directory(dest: Path) -> Iterator[Path]:
    """Fill a temporary sibling folder, then rename it to ``dest`` in one step.

    If the body raises, the temporary folder is removed and ``dest`` is untouched. If ``dest``
    appeared meanwhile (another process finished the same work first), the other result is kept
    and ours is discarded.

    Args:
        dest: the final folder; it must not exist yet.

    Yields:
        The empty temporary folder to fill.

    Example:
        ```python
        with atomic_directory(Path("out/table")) as tmp:
            (tmp / "part.parquet").write_bytes(data)
        ```
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(dest)
    tmp.mkdir()
    try:
        yield tmp
        try:
            os.replace(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
            log.info("%s was completed by another process; keeping that copy", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download(url: str, dest: Path, md5: str | None, *, progress: bool = True) -> Path:
    """Download ``url`` to ``dest``, verifying its md5, atomically.

    The body is streamed to a temporary file beside ``dest`` and renamed to ``dest`` only once it
    is complete and its md5 matches. An existing ``dest`` with the right md5 (or any existing
    ``dest`` when ``md5`` is None) is reused without downloading; one with a wrong md5 is removed
    and downloaded again.

    Args:
        url: what to fetch (any scheme urllib supports: ``https://``, ``http://``, ``file://``).
        dest: where to store it; parent folders are created.
        md5: expected hex md5, or None to skip the check.
        progress: show a progress bar when the server announces the size.

    Returns:
        ``dest``.

    Raises:
        ChecksumError: the downloaded content's md5 differs from ``md5``; nothing is left behind
            (neither ``dest`` nor a temporary file).
        DownloadError: the request failed or the body was shorter than announced.

    Example:
        ```python
        url = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
        md5 = "0e33842e24a9c977be4e0107933c0723"
        archive = download(url, Path("datasets/raw/ml-100k.zip"), md5)
        ```
    """
    dest = Path(dest)
    expected = md5.lower() if md5 else None
    if dest.is_file():
        if expected is None:
            log.info("Reusing %s (no md5 to check)", dest)
            return dest
        actual = file_md5(dest)
        if actual == expected:
            log.info("Reusing %s (md5 ok)", dest)
            return dest
        log.warning("%s has md5 %s instead of %s; downloading it again", dest, actual, expected)
        dest.unlink()

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(dest)
    log.info("Downloading %s -> %s", url, dest)
    try:
        actual = _fetch(url, tmp, progress=progress, label=dest.name)
        if expected is not None and actual != expected:
            raise ChecksumError(url, expected, actual)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _fetch(url: str, target: Path, *, progress: bool, label: str) -> str:
    """Stream ``url`` into ``target`` and return the md5 of what was written."""
    digest = hashlib.md5(usedforsecurity=False)
    received = 0
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, open(target, "xb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length else None
            with tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                desc=label,
                disable=not progress or total is None,
            ) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as e:
        raise DownloadError(url, str(e) or type(e).__name__) from e
    if total is not None and received != total:
        raise DownloadError(url, f"received {received} bytes, the server announced {total}")
    return digest.hexdigest()


def _unsafe_path(name: str) -> str | None:
    """Why an entry name could escape the extraction folder, or None if it cannot."""
    # Windows path rules accept both separators and also catch drive letters ("C:...").
    path = PureWindowsPath(name)
    if path.drive or path.root:
        return "has an absolute path"
    if ".." in path.parts:
        return "has a '..' component"
    return None


def _unsafe_zip_entry(info: zipfile.ZipInfo) -> str | None:
    """Why a zip entry must not be extracted, or None if it is safe."""
    # Unix permission bits live in the high 16 bits of external_attr.
    if stat.S_ISLNK(info.external_attr >> 16):
        return "is a symbolic link"
    return _unsafe_path(info.filename)


def _unsafe_tar_entry(member: tarfile.TarInfo) -> str | None:
    """Why a tar entry must not be extracted, or None if it is safe (a plain file or folder)."""
    if member.issym():
        return "is a symbolic link"
    if member.islnk():
        return "is a hard link"
    if not (member.isfile() or member.isdir()):
        return "is a device, FIFO or other special file"
    return _unsafe_path(member.name)


def _reuse(archive: Path, dest_dir: Path) -> bool:
    """Whether ``dest_dir`` already holds the extracted archive (complete, by construction)."""
    if dest_dir.is_dir():
        log.info("Reusing extracted %s", dest_dir)
        return True
    log.info("Extracting %s -> %s", archive, dest_dir)
    return False


def extract_zip(archive: Path, dest_dir: Path) -> Path:
    """Extract a zip archive safely and atomically into ``dest_dir``.

    Every entry is checked before anything is written: absolute paths, ``..`` components and
    symbolic links are refused. The archive is extracted into a temporary sibling of ``dest_dir``
    that is renamed into place when complete, so ``dest_dir`` either holds the whole archive or
    does not exist. An existing ``dest_dir`` is therefore complete and is reused as is.

    Args:
        archive: the zip file.
        dest_dir: the folder to create; it receives the archive's top-level entries.

    Returns:
        ``dest_dir``.

    Raises:
        UnsafeArchiveError: an entry could escape ``dest_dir`` or is a symbolic link.
        CorruptArchiveError: the archive is truncated or otherwise unreadable.

    Example:
        ```python
        raw = Path("datasets/raw")
        root = extract_zip(raw / "ml-1m.zip", raw / "ml-1m")
        ```
    """
    archive, dest_dir = Path(archive), Path(dest_dir)
    if _reuse(archive, dest_dir):
        return dest_dir
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                reason = _unsafe_zip_entry(info)
                if reason is not None:
                    raise UnsafeArchiveError(archive, info.filename, reason)
            with atomic_directory(dest_dir) as tmp:
                zf.extractall(tmp)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise CorruptArchiveError(archive, str(e) or type(e).__name__) from e
    return dest_dir


def extract_tar(archive: Path, dest_dir: Path) -> Path:
    """Extract a tar archive (plain, gzip, bzip2 or xz) safely and atomically into ``dest_dir``.

    Only plain files and folders are extracted: absolute paths, ``..`` components, symbolic and
    hard links, devices and FIFOs are refused. The archive is read in one streaming pass (a
    compressed tar has no index to check first), into a temporary sibling of ``dest_dir`` that is
    removed if any entry is refused or the archive turns out truncated, and renamed into place
    otherwise. An existing ``dest_dir`` is therefore complete and is reused as is.

    Args:
        archive: the tar file.
        dest_dir: the folder to create; it receives the archive's top-level entries.

    Returns:
        ``dest_dir``.

    Raises:
        UnsafeArchiveError: an entry could escape ``dest_dir`` or is not a plain file or folder.
        CorruptArchiveError: the archive is truncated or otherwise unreadable.

    Example:
        ```python
        raw = Path("datasets/raw")
        archive = raw / "lastfm-dataset-1K.tar.gz"
        root = extract_tar(archive, raw / "lastfm-1k")
        ```
    """
    archive, dest_dir = Path(archive), Path(dest_dir)
    if _reuse(archive, dest_dir):
        return dest_dir
    try:
        with tarfile.open(archive, "r:*") as tf, atomic_directory(dest_dir) as tmp:
            for member in tf:
                reason = _unsafe_tar_entry(member)
                if reason is not None:
                    raise UnsafeArchiveError(archive, member.name, reason)
                # The "data" filter re-checks what we checked and also drops set-uid bits and
                # foreign ownership.
                tf.extract(member, tmp, filter="data")
    except (tarfile.TarError, zlib.error, EOFError, OSError) as e:
        if isinstance(e, tarfile.FilterError):
            raise UnsafeArchiveError(archive, e.tarinfo.name, str(e)) from e
        raise CorruptArchiveError(archive, str(e) or type(e).__name__, kind="tar") from e
    return dest_dir


def extract_archive(archive: Path, dest_dir: Path) -> Path:
    """Extract a zip or tar archive (chosen by the file name) with :func:`extract_zip` or
    :func:`extract_tar`.

    Args:
        archive: a ``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2`` or ``.tar.xz`` file.
        dest_dir: the folder to create.

    Returns:
        ``dest_dir``.

    Raises:
        ValueError: the file name has none of those suffixes.
        UnsafeArchiveError: see :func:`extract_zip` and :func:`extract_tar`.
        CorruptArchiveError: see :func:`extract_zip` and :func:`extract_tar`.
    """
    name = Path(archive).name.lower()
    if name.endswith(".zip"):
        return extract_zip(archive, dest_dir)
    if name.endswith(_TAR_SUFFIXES):
        return extract_tar(archive, dest_dir)
    raise ValueError(f"{archive}: not a .zip or .tar[.gz|.bz2|.xz] archive")
