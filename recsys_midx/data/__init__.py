"""The data layer: sources, downloads, preprocessing and the processed Parquet cache."""

from recsys_midx.data.errors import (
    ChecksumError,
    CorruptArchiveError,
    DataError,
    DownloadError,
    EmptyDatasetError,
    MissingFilesError,
    UnsafeArchiveError,
)
from recsys_midx.data.pipeline import PreparedDataset, load_prepared, prepare_dataset
from recsys_midx.data.preprocess import PreprocessSettings, ProcessedData, preprocess
from recsys_midx.data.sources import MovieLens, Source, Synthetic

__all__ = [
    "ChecksumError",
    "CorruptArchiveError",
    "DataError",
    "DownloadError",
    "EmptyDatasetError",
    "MissingFilesError",
    "MovieLens",
    "PreparedDataset",
    "PreprocessSettings",
    "ProcessedData",
    "Source",
    "Synthetic",
    "UnsafeArchiveError",
    "load_prepared",
    "preprocess",
    "prepare_dataset",
]
