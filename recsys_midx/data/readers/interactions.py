"""Stream raw interaction files into a compact raw frame, whatever their format."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from recsys_midx.data.errors import (
    CorruptArchiveError,
    DataError,
    EmptyFileError,
    MissingColumnsError,
)
from recsys_midx.data.readers.columnar import ColumnBuffer, IdColumn
from recsys_midx.data.readers.columns import ColumnMap
from recsys_midx.data.readers.formats import Format
from recsys_midx.data.readers.streams import COMPRESSION
from recsys_midx.data.readers.values import to_ratings, to_seconds

log = logging.getLogger(__name__)


def read_interactions(
    paths: Sequence[Path] | Path,
    fmt: Format,
    columns: ColumnMap,
    *,
    drop_incomplete: bool = False,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Read interaction files into a raw frame, streaming them batch by batch.

    Args:
        paths: the file, or files read one after the other as if concatenated.
        fmt: their format.
        columns: which columns hold the user, item, time and rating.
        drop_incomplete: drop rows whose user, item or (mapped) time is empty (their number is
            logged);
            by default an empty value is an error.
        progress: show a progress bar (None: only when the output is a terminal).

    Returns:
        Columns ``user`` and ``item`` (``int64`` when ``fmt`` parses them as integers, otherwise
        an Arrow dictionary column: ``int32`` codes into the distinct ids in order of
        appearance, which are integers when every id is a canonical decimal integer and strings
        otherwise), ``timestamp`` (``int64`` seconds) when ``columns.time`` is mapped, and,
        when mapped, ``rating`` (``float32``, NaN where empty); rows in file order.

    Raises:
        MissingColumnsError: a mapped column is not in a file (the message lists those found).
        EmptyFileError: a file has no content at all.
        BadValueError: a time that is neither a number nor an ISO date (quoted in the message).
        CorruptArchiveError: a compressed file is truncated or corrupt.
        DataError: the files hold no rows, or any other unreadable content (the message names
            the file).

    Example:
        ```python
        raw = read_interactions(
            Path("ratings.csv"), Delimited(","),
            ColumnMap(user="userId", item="movieId", time="timestamp", rating="rating"))
        ```
    """
    start = time.perf_counter()
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    sources = columns.sources()
    wanted = columns.wanted()
    ids = {name: IdColumn() for name in ("user", "item")}
    times, ratings = ColumnBuffer(np.int64), ColumnBuffer(np.float32)
    rows, dropped = 0, 0
    with _Progress(paths, progress) as tracker:
        for path in paths:
            if path.is_file() and path.stat().st_size == 0:
                raise EmptyFileError(path)
            found = fmt.columns(path)
            missing = [name for name in wanted if name not in found]
            if missing:
                raise MissingColumnsError(path, missing, found)
            rows_before = 0
            with _errors_naming(path):
                for batch in fmt.batches(path, wanted, tracker.advance):
                    fields = {name: _coalesce(batch, names) for name, names in sources.items()}
                    keep = _complete_rows(fields, path, rows_before, drop_incomplete)
                    if keep is not None:
                        dropped += len(keep) - int(np.count_nonzero(keep))
                        mask = pa.array(keep)
                        fields = {name: values.filter(mask) for name, values in fields.items()}
                    rows += len(fields["user"])
                    for name in ("user", "item"):
                        ids[name].add(fields[name], path, sources[name][0])
                    if "time" in fields:
                        times.extend(
                            to_seconds(fields["time"], path, sources["time"][0], rows_before)
                        )
                    if "rating" in fields:
                        ratings.extend(to_ratings(fields["rating"], path))
                    rows_before += batch.num_rows
    if dropped:
        log.warning("Dropped %d rows without a user, item or time", dropped)
    if rows == 0:
        raise DataError(f"no interactions in {', '.join(str(p) for p in paths)}")
    data = {name: ids.pop(name).finish() for name in ("user", "item")}
    if "time" in sources:
        data["timestamp"] = times.finish()
    if "rating" in sources:
        data["rating"] = ratings.finish()
    log.info(
        "Read %d interactions from %d file(s) in %.1f s",
        rows,
        len(paths),
        time.perf_counter() - start,
    )
    # The frame takes the arrays as they are, without consolidating them into a copy.
    return pd.DataFrame(data, copy=False)


class _Progress:
    """A progress bar over the bytes of all the files."""

    def __init__(self, paths: Sequence[Path], enabled: bool | None) -> None:
        label = paths[0].name if len(paths) == 1 else f"{len(paths)} files"
        self._bar = tqdm(
            total=sum(path.stat().st_size for path in paths if path.is_file()),
            unit="B",
            unit_scale=True,
            desc=f"reading {label}",
            leave=False,
            disable=None if enabled is None else not enabled,
        )

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._bar.close()

    def advance(self, count: int) -> None:
        self._bar.update(count)


@contextlib.contextmanager
def _errors_naming(path: Path) -> Iterator[None]:
    """Turn the readers' parse and decompression failures into errors that name the file."""
    try:
        yield
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise DataError(f"cannot parse {path}: {e}") from e
    except (OSError, EOFError) as e:
        codec = COMPRESSION.get(path.suffix.lower())
        if codec is None:
            raise
        raise CorruptArchiveError(path, str(e), kind=codec) from e


def _coalesce(batch: pa.RecordBatch, names: tuple[str, ...]) -> pa.Array:
    """The first non-empty value of ``names`` in each row (just the column for one name)."""
    arrays = [batch.column(name) for name in names]
    if len(arrays) == 1:
        return arrays[0]
    return pc.coalesce(*[a if pa.types.is_string(a.type) else a.cast(pa.string()) for a in arrays])


def _complete_rows(
    fields: dict[str, pa.Array], path: Path, rows_before: int, drop: bool
) -> np.ndarray | None:
    """Mask of the rows whose user, item and (mapped) time are present; None if all are.

    Raises:
        DataError: a value is missing and ``drop`` is False.
    """
    keep: np.ndarray | None = None
    for name in ("user", "item", "time"):
        values = fields.get(name)
        if values is None or values.null_count == 0:
            continue
        present = values.is_valid().to_numpy(zero_copy_only=False)
        if not drop:
            first = rows_before + int(np.argmin(present)) + 1
            raise DataError(
                f"{path}: the {name} is empty in {values.null_count} rows of a batch, first in "
                f"data row {first}"
            )
        keep = present if keep is None else keep & present
    return keep
