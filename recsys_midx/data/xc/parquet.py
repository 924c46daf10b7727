"""Points as Parquet: one row per point, its label and feature lists as list columns.

Schema: ``labels`` ``large_list<int32>`` (ids ``1..L``, ascending), ``feature_ids``
``large_list<int32>`` (ids ``0..F-1``, ascending) and ``feature_values`` ``large_list<float32>``
(aligned with ``feature_ids``). List columns are stored by Arrow as exactly the CSR arrays the
data module works with (int64 offsets + flat values), so reading them back is a zero-copy
conversion, while each file stays a self-describing table that any Parquet reader can open (one
row per point, no side arrays to keep in sync).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_midx.data.xc.containers import CSR, XCData

SCHEMA = pa.schema(
    [
        ("labels", pa.large_list(pa.int32())),
        ("feature_ids", pa.large_list(pa.int32())),
        ("feature_values", pa.large_list(pa.float32())),
    ]
)


def _list_array(csr_offsets: np.ndarray, values: np.ndarray) -> pa.LargeListArray:
    return pa.LargeListArray.from_arrays(pa.array(csr_offsets, pa.int64()), pa.array(values))


def write_parquet(path: Path, data: XCData) -> None:
    """Write points as one Parquet row each (:data:`SCHEMA`).

    Args:
        path: the file to write.
        data: the points.
    """
    features, labels = data.features, data.labels
    values = features.values if features.values is not None else np.ones(len(features.indices))
    table = pa.Table.from_arrays(
        [
            _list_array(labels.indptr, labels.indices.astype(np.int32)),
            _list_array(features.indptr, features.indices.astype(np.int32)),
            _list_array(features.indptr, values.astype(np.float32)),
        ],
        schema=SCHEMA,
    )
    pq.write_table(table, path)


def _column_csr(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """CSR offsets and flat values of a list column (zero-copy where Arrow allows)."""
    column = table.column(name).combine_chunks()
    offsets = column.offsets.to_numpy().astype(np.int64, copy=False)
    return offsets - offsets[0], column.flatten().to_numpy()


def read_parquet(path: Path, num_features: int, num_labels: int) -> XCData:
    """Read points written by :func:`write_parquet`.

    Args:
        path: the Parquet file.
        num_features: ``F``.
        num_labels: ``L``.

    Returns:
        The points.
    """
    table = pq.read_table(path, schema=SCHEMA)
    label_ptr, label_ids = _column_csr(table, "labels")
    feature_ptr, feature_ids = _column_csr(table, "feature_ids")
    _, feature_values = _column_csr(table, "feature_values")
    return XCData(
        CSR(feature_ptr, feature_ids, feature_values),
        CSR(label_ptr, label_ids),
        num_features,
        num_labels,
    )
