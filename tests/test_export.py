"""Exported item vectors: raw ids, a faiss index whose top-k is the trained model's, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pandas as pd
import pytest
from trained_runs import train_custom_run

from recsys_midx import load_run, recommend
from recsys_midx.app.export import export_items, main
from recsys_midx.app.recommend import history_queries
from recsys_midx.app.trained import LoadedRun
from recsys_midx.heads import MoSHead

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_custom_run(tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def run(run_dir: Path) -> LoadedRun:
    return load_run(run_dir)


def test_faiss_top_k_equals_exact_top_k_of_the_item_table(run: LoadedRun, tmp_path: Path) -> None:
    meta = json.loads(export_items(run, tmp_path).read_text())
    table = run.module.encoder.item_table.detach()[1:].numpy()
    assert meta["dimension"] == table.shape[1] == 16
    assert meta["num_items"] == len(table) == 40
    assert (meta["metric"], meta["index_type"], meta["head"]) == (
        "inner_product",
        "IndexFlatIP",
        "dot",
    )
    assert meta["temperature"] == run.module.head.temperature
    assert meta["run_dir"] == str(run.config.paths.output_dir)
    assert Path(meta["run_dir"]).is_absolute()

    items = pd.read_parquet(tmp_path / meta["items"])
    assert items["item"].tolist() == list(run.items.raw[1:])
    assert items["item_id"].tolist() == list(range(1, 41))
    np.testing.assert_array_equal(np.stack(items["embedding"].to_numpy()), table)

    users = ["user-000", "user-011", "user-025", "user-059"]
    queries, log_weights = history_queries(run, run.histories(run.users.internal(users)))
    assert log_weights is None
    queries = queries.numpy()
    index = faiss.read_index(str(tmp_path / meta["index"]))
    _, rows = index.search(queries, 10)
    exact = np.argsort(-(queries @ table.T), axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(rows, exact)
    served = items["item"].to_numpy()[rows]
    expected = recommend(run, users=users, k=10, exclude_seen=False)
    assert served.reshape(-1).tolist() == expected["item"].tolist()


def test_command_line_exports_a_folder(run_dir: Path, tmp_path: Path) -> None:
    assert main([str(run_dir), "--out", str(tmp_path / "export")]) == 0
    assert sorted(path.name for path in (tmp_path / "export").iterdir()) == [
        "export.json",
        "items.faiss",
        "items.parquet",
    ]


def test_mixture_heads_are_refused(run_dir: Path) -> None:
    mixture = load_run(run_dir)
    mixture.module.head = MoSHead(dim=16, num_components=2)
    with pytest.raises(ValueError, match="head=mos ranks items by a mixture of 2 queries"):
        export_items(mixture, "never-written")
    assert not Path("never-written").exists()
