"""Byte streams of raw files: decompressed on the fly, reporting the bytes read for progress."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from recsys_midx.data.errors import CorruptArchiveError

#: Codec of each compression suffix.
COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}


@contextlib.contextmanager
def open_text(path: Path) -> Iterator[IO[bytes]]:
    """A binary stream of the file's (decompressed) content, for peeking at its first lines.

    Args:
        path: the file; its compression is told by its suffix (:data:`COMPRESSION`).

    Yields:
        The buffered binary stream.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CorruptArchiveError: a compressed file cannot be decompressed.
    """
    codec = COMPRESSION.get(path.suffix.lower())
    try:
        with pa.input_stream(str(path), compression=codec) as native:
            yield io.BufferedReader(native)
    except FileNotFoundError:
        raise
    except OSError as e:
        if codec:
            raise CorruptArchiveError(path, str(e), kind=codec) from e
        raise


@contextlib.contextmanager
def tracked_stream(
    path: Path, advance: Callable[[int], None], native: bool = True
) -> Iterator[Any]:
    """The (decompressed) content of ``path``, reporting the file bytes consumed to ``advance``.

    Args:
        path: the file.
        advance: called with the number of bytes of each read from the file.
        native: yield an Arrow stream (for Arrow's readers) rather than a binary Python file.

    Yields:
        The stream.
    """
    codec = COMPRESSION.get(path.suffix.lower())
    with open(path, "rb") as raw:
        stream: Any = pa.PythonFile(_Counting(raw, advance), mode="r")
        if codec:
            stream = pa.CompressedInputStream(stream, codec)
        yield stream if native else io.BufferedReader(stream, buffer_size=1 << 20)


class _Counting(io.RawIOBase):
    """A read-only file that reports the size of every read."""

    def __init__(self, raw: IO[bytes], advance: Callable[[int], None]) -> None:
        super().__init__()
        self._raw = raw
        self._advance = advance

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._raw.readinto(buffer)
        self._advance(count)
        return count

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._advance(len(data))
        return data


def file_signature(paths: Sequence[Path]) -> dict[str, list[int] | None]:
    """Size and modification time of each file (None if absent), to key caches of local files.

    Args:
        paths: the files.

    Returns:
        ``{str(path): [size, mtime_ns] or None}``.
    """
    out: dict[str, list[int] | None] = {}
    for path in paths:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            out[str(path)] = None
        else:
            out[str(path)] = [info.st_size, info.st_mtime_ns]
    return out
