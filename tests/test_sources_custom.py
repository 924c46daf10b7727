"""Your own data: CSV, TSV, Parquet and JSON-lines files or folders, with a column mapping."""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig

from recsys_midx.app.experiment import train
from recsys_midx.data import (
    Custom,
    DataError,
    EmptyDatasetError,
    MissingColumnsError,
    MissingFilesError,
)

COLUMNS = {"user": "uid", "item": "sku", "time": "ts"}
NO_FILTER = {"user_core": 0, "item_core": 0}
# Two customers; times as ISO dates/date-times (one with a zone) in no particular order.
ORDERS = [
    ("c-2", "SKU-9", "2021-03-01T10:00:00Z"),
    ("c-1", "SKU-1", "2021-02-01"),
    ("c-2", "SKU-1", "2021-01-15 08:30:00"),
    ("c-1", "SKU-9", "2021-02-02"),
]


def _raw_rows(ds) -> list[tuple[str, str]]:
    users = pd.read_parquet(ds.directory / "user_map.parquet").set_index("user_id")["raw_id"]
    items = pd.read_parquet(ds.directory / "item_map.parquet").set_index("item_id")["raw_id"]
    return list(zip(users[ds.interactions["user_id"]], items[ds.interactions["item_id"]]))


EXPECTED = [("c-1", "SKU-1"), ("c-1", "SKU-9"), ("c-2", "SKU-1"), ("c-2", "SKU-9")]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".csv.gz", ".parquet", ".jsonl"])
def test_each_format_gives_the_same_interactions(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"orders{suffix}"
    frame = pd.DataFrame(ORDERS, columns=["uid", "sku", "ts"]).assign(qty=1)
    if suffix == ".parquet":
        frame.to_parquet(path)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in frame.to_dict("records")))
    else:
        text = frame.to_csv(index=False, sep="\t" if suffix == ".tsv" else ",")
        path.write_bytes(gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode())
    ds = Custom("shop", str(path), COLUMNS, preprocess=NO_FILTER).prepare(tmp_path / "data")
    assert _raw_rows(ds) == EXPECTED
    assert ds.interactions["timestamp"].tolist() == [1612137600, 1612224000, 1610699400, 1614592800]


def test_a_folder_of_parquet_parts_with_integer_ids_and_ratings(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    pq.write_table(
        pa.table({"u": [1, 2, 10], "i": [5, 5, 6], "t": [30, 10, 20], "r": [4.0, 2.0, 5.0]}),
        folder / "part-0.parquet",
    )
    pq.write_table(pa.table({"u": [2], "i": [6], "t": [40], "r": [3.0]}), folder / "part-1.parquet")
    (folder / "_SUCCESS").write_text("")
    source = Custom(
        "events",
        str(folder),
        {"user": "u", "item": "i", "time": "t", "rating": "r"},
        preprocess={**NO_FILTER, "min_rating": 3},
    )
    ds = source.prepare(tmp_path / "data")
    assert _raw_rows(ds) == [("1", "5"), ("2", "6"), ("10", "6")]
    assert ds.interactions["rating"].tolist() == [4.0, 3.0, 5.0]


def test_headerless_file_with_another_delimiter(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("".join(f"{u};{i};{t}\n" for u, i, t in ORDERS))
    source = Custom(
        "log",
        str(path),
        COLUMNS,
        delimiter=";",
        header=False,
        names=["uid", "sku", "ts"],
        preprocess=NO_FILTER,
    )
    assert _raw_rows(source.prepare(tmp_path / "data")) == EXPECTED


def test_editing_the_file_changes_the_cache_key(tmp_path: Path) -> None:
    path = tmp_path / "orders.csv"
    pd.DataFrame(ORDERS, columns=["uid", "sku", "ts"]).to_csv(path, index=False)
    source = Custom("shop", str(path), COLUMNS, preprocess=NO_FILTER)
    first = source.prepare(tmp_path / "data")
    with open(path, "a") as f:
        f.write("c-3,SKU-1,2021-04-01\n")
    os.utime(path, ns=(1, 1))
    second = source.prepare(tmp_path / "data")
    assert second.directory != first.directory and second.num_users == 3


def test_misnamed_column_lists_the_columns_found(tmp_path: Path) -> None:
    path = tmp_path / "orders.csv"
    pd.DataFrame(ORDERS, columns=["customer", "sku", "ts"]).to_csv(path, index=False)
    with pytest.raises(
        MissingColumnsError, match="no column 'uid'; columns found: 'customer', 'sku', 'ts'"
    ):
        Custom("shop", str(path), COLUMNS).prepare(tmp_path / "data")
    assert not (tmp_path / "data" / "processed").exists()


def test_missing_path_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(MissingFilesError, match="'nothing.csv'"):
        Custom("x", str(tmp_path / "nothing.csv"), COLUMNS).prepare(tmp_path / "data")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFilesError, match="'data files'"):
        Custom("x", str(tmp_path / "empty"), COLUMNS).prepare(tmp_path / "data")


def test_mixed_formats_in_a_folder_need_a_format(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("uid,sku,ts\nu,i,1\n")
    (tmp_path / "b.jsonl").write_text('{"uid": "u", "sku": "i", "ts": 1}\n')
    with pytest.raises(DataError, match="different formats; set dataset.format"):
        Custom("x", str(tmp_path), COLUMNS).prepare(tmp_path / "data")


@pytest.mark.parametrize(
    ("preprocess", "step"),
    [
        ({"min_rating": 6}, "rating filter (min_rating=6.0)"),
        ({"user_core": 3, "item_core": 0}, "k-core filter (user_core=3"),
        ({"user_core": 0, "item_core": 0, "min_seq_len": 3}, "sequence length filter"),
    ],
)
def test_empty_result_names_the_filter(tmp_path: Path, preprocess: dict, step: str) -> None:
    path = tmp_path / "orders.csv"
    pd.DataFrame(ORDERS, columns=["uid", "sku", "ts"]).assign(stars=5).to_csv(path, index=False)
    source = Custom("shop", str(path), {**COLUMNS, "rating": "stars"}, preprocess=preprocess)
    with pytest.raises(EmptyDatasetError, match="removed all 4 interactions") as info:
        source.prepare(tmp_path / "data")
    assert step in str(info.value)
    assert not (tmp_path / "data" / "processed").exists()


def test_config_maps_the_columns(compose_config: Callable[..., DictConfig], tmp_path: Path) -> None:
    path = tmp_path / "orders.csv"
    pd.DataFrame(ORDERS, columns=["uid", "sku", "ts"]).to_csv(path, index=False)
    cfg = compose_config(
        [
            "dataset=custom",
            f"dataset.path={path}",
            "dataset.columns.user=uid",
            "dataset.columns.item=sku",
            "dataset.columns.time=ts",
            "preprocess=none",
        ]
    )
    ds = instantiate(cfg.dataset).prepare(tmp_path / "data")
    assert _raw_rows(ds) == EXPECTED


# A file without times: string ids, users interleaved, items not in id order.
UNTIMED = [
    ("c-2", "SKU-9"),
    ("c-1", "SKU-3"),
    ("c-2", "SKU-1"),
    ("c-1", "SKU-1"),
    ("c-2", "SKU-5"),
    ("c-1", "SKU-2"),
]


def test_without_a_time_column_the_file_order_is_kept_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "orders.csv"
    pd.DataFrame(UNTIMED, columns=["uid", "sku"]).to_csv(path, index=False)
    source = Custom(
        "shop", str(path), {"user": "uid", "item": "sku", "time": None}, preprocess=NO_FILTER
    )
    with caplog.at_level(logging.WARNING):
        ds = source.prepare(tmp_path / "data")
        assert source.prepare(tmp_path / "data").directory == ds.directory  # cached
    assert _raw_rows(ds) == [
        ("c-1", "SKU-3"),
        ("c-1", "SKU-1"),
        ("c-1", "SKU-2"),
        ("c-2", "SKU-9"),
        ("c-2", "SKU-1"),
        ("c-2", "SKU-5"),
    ]
    # The timestamps are the rows' positions in the file, and say so.
    assert ds.interactions["timestamp"].tolist() == [1, 3, 5, 0, 2, 4]
    assert ds.time_is_row_order
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "dataset.columns.time is null" in warnings[0].getMessage()


def test_an_explicit_time_column_still_orders_by_time(tmp_path: Path) -> None:
    path = tmp_path / "orders.csv"
    # Times run against the file order.
    frame = pd.DataFrame(UNTIMED, columns=["uid", "sku"]).assign(ts=range(60, 0, -10))
    frame.to_csv(path, index=False)
    ds = Custom("shop", str(path), COLUMNS, preprocess=NO_FILTER).prepare(tmp_path / "data")
    assert _raw_rows(ds) == [
        ("c-1", "SKU-2"),
        ("c-1", "SKU-1"),
        ("c-1", "SKU-3"),
        ("c-2", "SKU-5"),
        ("c-2", "SKU-1"),
        ("c-2", "SKU-9"),
    ]
    assert not ds.time_is_row_order


def test_a_csv_with_text_ids_and_no_times_trains(
    compose_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    rows = [
        (f"user-{u}", f"item-{i}") for u in rng.integers(0, 40, 800) for i in rng.integers(0, 30, 1)
    ]
    path = tmp_path / "events.csv"
    pd.DataFrame(rows, columns=["uid", "sku"]).to_csv(path, index=False)
    cfg = compose_config(
        [
            "dataset=custom",
            f"dataset.path={path}",
            "dataset.columns.user=uid",
            "dataset.columns.item=sku",
            "dataset.columns.time=null",
            "preprocess=none",
            "model.dim=16",
            "model.max_len=12",
            "trainer.max_epochs=1",
            "trainer.accelerator=cpu",
            "task.datamodule.batch_size=16",
            "callbacks.progress_bar.refresh_rate=0",
            "sampler=uniform",
            "sampler.num_negatives=10",
        ]
    )
    results = train(cfg)
    assert 0.0 <= results["metrics"]["test/ndcg@10"] <= 1.0
    assert results["dataset"]["timestamp"] == "row position"
