"""Extreme multi-label classification data: the repository text format, a seeded generator, a
Parquet cache and the Lightning data module.

``containers``
    :class:`CSR` arrays and :class:`XCData` points (feature ids ``0..F-1``, label ids ``1..L``).
``text_format``
    The Extreme Classification Repository's text files: :func:`read_xc_file`,
    :func:`write_xc_file`.
``parquet``
    Points as Parquet rows: :func:`read_parquet`, :func:`write_parquet`.
``sources``
    :class:`XCSource` (the processed cache), :class:`XCRepository` (hand-downloaded files).
``synthetic``
    :class:`XCSynthetic` and its generator :func:`generate_xc`.
``batches``
    :class:`SparseFeatures` bags and :func:`make_batch`.
``datamodule``
    :class:`XCDataModule`.
"""

from recsys_midx.data.errors import XCFormatError
from recsys_midx.data.xc.batches import Batch, SparseFeatures, make_batch
from recsys_midx.data.xc.containers import CSR, XCData
from recsys_midx.data.xc.datamodule import XCDataModule
from recsys_midx.data.xc.parquet import read_parquet, write_parquet
from recsys_midx.data.xc.sources import (
    REPOSITORY_URL,
    SCHEMA_VERSION,
    XCDataset,
    XCRepository,
    XCSource,
    dataset_stats,
    load_xc_dataset,
)
from recsys_midx.data.xc.synthetic import XCSynthetic, generate_xc
from recsys_midx.data.xc.text_format import read_xc_file, write_xc_file

__all__ = [
    "CSR",
    "REPOSITORY_URL",
    "SCHEMA_VERSION",
    "Batch",
    "SparseFeatures",
    "XCData",
    "XCDataModule",
    "XCDataset",
    "XCFormatError",
    "XCRepository",
    "XCSource",
    "XCSynthetic",
    "dataset_stats",
    "generate_xc",
    "load_xc_dataset",
    "make_batch",
    "read_parquet",
    "read_xc_file",
    "write_parquet",
    "write_xc_file",
]
