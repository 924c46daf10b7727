"""The data layer: sources, downloads, preprocessing and the processed Parquet cache."""

from recsys_midx.data.errors import (
    BadValueError,
    ChecksumError,
    CorruptArchiveError,
    DataError,
    DownloadError,
    EmptyDatasetError,
    ManualDownloadError,
    MissingColumnsError,
    MissingFilesError,
    UnknownCategoryError,
    UnsafeArchiveError,
    XCFormatError,
)
from recsys_midx.data.pipeline import PreparedDataset, load_prepared, load_stats, prepare_dataset
from recsys_midx.data.preprocess import PreprocessSettings, ProcessedData, preprocess
from recsys_midx.data.readers import ColumnMap, read_interactions
from recsys_midx.data.sources import (
    Amazon,
    Custom,
    Gowalla,
    LastFM1K,
    MovieLens,
    Source,
    Steam,
    Synthetic,
    Yelp,
)

__all__ = [
    "Amazon",
    "BadValueError",
    "ChecksumError",
    "ColumnMap",
    "CorruptArchiveError",
    "Custom",
    "DataError",
    "DownloadError",
    "EmptyDatasetError",
    "Gowalla",
    "LastFM1K",
    "ManualDownloadError",
    "MissingColumnsError",
    "MissingFilesError",
    "MovieLens",
    "PreparedDataset",
    "PreprocessSettings",
    "ProcessedData",
    "Source",
    "Steam",
    "Synthetic",
    "UnknownCategoryError",
    "UnsafeArchiveError",
    "XCFormatError",
    "Yelp",
    "load_prepared",
    "load_stats",
    "preprocess",
    "prepare_dataset",
    "read_interactions",
]
