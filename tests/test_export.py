"""Exported item vectors: raw ids, a faiss index whose top-k is the trained model's, approximate
indexes with their measured recall, the query encoder and serving without the package, refusals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ROOT
from trained_runs import train_custom_run

from recsys_midx import load_run, recommend
from recsys_midx.app.export import export_items, main
from recsys_midx.app.recommend import history_queries
from recsys_midx.app.trained import LoadedRun
from recsys_midx.heads import MoEHead, MoSHead
from recsys_midx.inference.ann import IndexSpec

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
    assert (meta["index_kind"], meta["index_parameters"], meta["quality"]) == ("exact", {}, None)
    assert (meta["encoder"], meta["encoder_format"], meta["max_len"]) == (
        "encoder.pt",
        "torchscript",
        12,
    )
    assert meta["run_dir"] == str(run.config.paths.output_dir)
    assert Path(meta["run_dir"]).is_absolute()

    items = pd.read_parquet(tmp_path / meta["items"])
    assert items["item"].tolist() == list(run.items.raw[1:])
    assert items["item_id"].tolist() == list(range(1, 41))
    np.testing.assert_array_equal(np.stack(items["embedding"].to_numpy()), table)

    users = ["user-000", "user-011", "user-025", "user-059"]
    queries, log_weights, _ = history_queries(run, run.histories(run.users.internal(users)))
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
    meta = json.loads((tmp_path / "export" / "export.json").read_text())
    assert (meta["index_kind"], meta["index_type"], meta["quality"]) == (
        "exact",
        "IndexFlatIP",
        None,
    )
    assert sorted(path.name for path in (tmp_path / "export").iterdir()) == [
        "encoder.pt",
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


@pytest.mark.parametrize(
    ("spec", "index_type", "lowest_recall"),
    [
        # One list searched whole: exhaustive, so exactly the exact top-10.
        (IndexSpec("ivf", nlist=1, nprobe=1), "IndexIVFFlat", 1.0),
        (IndexSpec("hnsw", hnsw_m=8, ef_search=64), "IndexHNSWFlat", 0.9),
    ],
)
def test_approximate_indexes_are_measured_against_the_exact_one(
    run: LoadedRun, tmp_path: Path, spec: IndexSpec, index_type: str, lowest_recall: float
) -> None:
    meta = json.loads(export_items(run, tmp_path, index=spec).read_text())
    assert (meta["index_kind"], meta["index_type"]) == (spec.kind, index_type)
    assert meta["index_parameters"] == spec.resolve(40).parameters()
    quality = meta["quality"]
    assert set(quality) == {"k", "queries", "recall", "qps", "exact_qps", "threads", "query_source"}
    assert (quality["k"], quality["queries"], quality["query_source"]) == (10, 60, "user histories")
    assert lowest_recall <= quality["recall"] <= 1.0
    assert quality["qps"] > 0 and quality["exact_qps"] > 0
    index = faiss.read_index(str(tmp_path / meta["index"]))
    assert type(index).__name__ == index_type and index.ntotal == 40


def test_command_line_prints_recall_and_speed(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(run_dir), "--out", str(tmp_path), "--index", "hnsw", "--ef-search", "64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "index: IndexHNSWFlat (hnsw_m=32, ef_search=64, ef_construction=200) over 40 items of "
        "dimension 16"
    )
    assert re.fullmatch(
        r"recall@10 against the exact top-10: (0|1)\.\d{4} on 60 queries \(user histories\)",
        lines[1],
    )
    assert re.fullmatch(
        r"queries per second \(\d+ threads?, one batch\): [\d,]+ approximate, [\d,]+ exact",
        lines[2],
    )
    assert lines[3] == f"exported {tmp_path}"


def test_a_catalog_too_small_for_nlist_is_one_line_and_writes_nothing(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(run_dir), "--out", str(tmp_path / "out"), "--index", "ivf", "--nlist", "8"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "recsys-midx-export: error: --nlist 8 needs at least 312 items (39 per list) and the "
        "catalog has 40: give --nlist 1 or less\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--index", "hnsw", "--index-factory", "HNSW32"],
            "give --index-factory or --index hnsw, not both",
        ),
        (
            ["--index", "ivf", "--nlist", "4", "--nprobe", "8"],
            "--nprobe 8 must not exceed --nlist 4",
        ),
        (
            ["--index", "exact", "--ef-search", "8"],
            "--ef-search applies to --index hnsw, not exact",
        ),
    ],
)
def test_bad_index_options_are_refused_before_the_run_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "no-such-run"), "--out", str(tmp_path / "out"), *options])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"recsys-midx-export: error: {message}\n"
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def gru_run(tmp_path_factory: pytest.TempPathFactory) -> LoadedRun:
    return load_run(train_custom_run(tmp_path_factory.mktemp("export-gru"), ["model=gru4rec"]))


@pytest.mark.parametrize("which", ["sasrec", "gru4rec", "sasrec+moe"])
def test_exported_encoder_reproduces_the_query_vectors(
    which: str, run: LoadedRun, gru_run: LoadedRun, run_dir: Path, tmp_path: Path
) -> None:
    if which == "gru4rec":
        loaded = gru_run
    elif which == "sasrec":
        loaded = run
    else:
        loaded = load_run(run_dir)
        torch.manual_seed(0)
        loaded.module.head = MoEHead(dim=16, num_experts=3).eval()
    assert type(loaded.module.encoder).__name__.lower() == which.split("+")[0]
    meta = json.loads(export_items(loaded, tmp_path).read_text())
    encoder = torch.jit.load(str(tmp_path / meta["encoder"]))
    # Every user, with histories shorter and longer than max_len.
    histories = loaded.histories(loaded.all_user_ids())
    expected = history_queries(loaded, histories).queries
    max_len = meta["max_len"]
    padded = torch.zeros(len(histories), max_len, dtype=torch.long)
    for row, history in enumerate(histories):
        tail = torch.from_numpy(history[-max_len:])
        padded[row, max_len - len(tail) :] = tail
    with torch.no_grad():
        served = encoder(padded)
    torch.testing.assert_close(served, expected, rtol=1e-5, atol=1e-6)


def _serving_example() -> str:
    """The standalone serving example of the recommendations guide."""
    guide = (ROOT / "docs" / "guides" / "recommend.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.DOTALL)
    (example,) = [block for block in blocks if "torch.jit.load" in block]
    return example


def test_the_guide_s_serving_example_runs_without_the_package(
    run: LoadedRun, tmp_path: Path
) -> None:
    export_items(run, tmp_path / "serving")
    full = {
        user: list(run.items.raw[run.histories(run.users.internal([user]))[0]])
        for user in ["user-000", "user-011", "user-025", "user-059"]
    }
    histories = {
        **full,
        "new": ["sku-0003", "sku-0005", "sku-0006"],
        "long": [f"sku-{i:04d}" for i in range(0, 40, 2)],  # longer than max_len
    }
    (tmp_path / "histories.json").write_text(json.dumps(histories))
    script = "\n".join(
        [
            "import sys",
            "sys.modules['recsys_midx'] = None  # importing the package now fails",
            _serving_example().replace('"serving/"', repr(str(tmp_path / "serving") + "/")),
            "histories = json.load(open(sys.argv[1]))",
            "print(json.dumps({user: top_k(h, 10) for user, h in histories.items()}))",
            "assert not [name for name in sys.modules if name.startswith('recsys_midx.')]",
        ]
    )
    (tmp_path / "serve.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "serve.py", "histories.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    served = json.loads(done.stdout)
    expected = recommend(run, histories=histories, k=10, exclude_seen=True)
    for user in histories:
        assert served[user] == expected.loc[expected["user"] == user, "item"].tolist(), user
