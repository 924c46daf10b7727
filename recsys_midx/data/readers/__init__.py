"""Stream raw interaction files into a compact raw frame, whatever their format.

One reader serves every source: a *format* (:class:`Delimited`, :class:`JsonLines`,
:class:`Parquet`, :class:`PythonLiterals`, :class:`Sequences`; module ``formats``) turns a file
into a stream of Arrow record batches of a bounded size, and :func:`read_interactions` (module
``interactions``) folds the batches into typed arrays as they come. The raw text is therefore never
held in memory at once: ids become ``int64`` values (when the format parses them as integers) or
``int32`` codes into a dictionary of the distinct ids (module ``columnar``), times become ``int64``
seconds and ratings ``float32`` (module ``values``). A :class:`ColumnMap` (module ``columns``) says
which raw columns hold each field.

Compressed files (``.gz``, ``.bz2``, ``.zst``, ``.lz4``) are decompressed on the fly, and a
progress bar follows the bytes read when the output is a terminal (module ``streams``).
"""

from recsys_midx.data.readers.columns import ColumnMap
from recsys_midx.data.readers.formats import (
    BLOCK_SIZE,
    LINES_PER_BATCH,
    Delimited,
    Format,
    JsonLines,
    Parquet,
    PythonLiterals,
    Sequences,
    format_for,
)
from recsys_midx.data.readers.interactions import read_interactions
from recsys_midx.data.readers.streams import file_signature

__all__ = [
    "BLOCK_SIZE",
    "LINES_PER_BATCH",
    "ColumnMap",
    "Delimited",
    "Format",
    "JsonLines",
    "Parquet",
    "PythonLiterals",
    "Sequences",
    "file_signature",
    "format_for",
    "read_interactions",
]
