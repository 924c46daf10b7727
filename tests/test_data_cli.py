"""The data command line (prepare / describe) and the preprocessing presets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig

from recsys_midx.app.prepare import main
from recsys_midx.data import EmptyDatasetError, PreprocessSettings, Synthetic, preprocess

PRESETS = {
    "sasrec": PreprocessSettings(min_rating=None, user_core=5, item_core=5),
    "recbole": PreprocessSettings(min_rating=3, user_core=10, item_core=10),
    "none": PreprocessSettings(user_core=0, item_core=0),
}


def _ratings(path: Path) -> Path:
    """12 users x 12 items, all rated 4 by users 1..10; users 11 and 12 rate 7 items, all 2."""
    rows = [(u, i, 4.0, 1000 * u + i) for u in range(1, 11) for i in range(1, 13)]
    rows += [(u, i, 2.0, 1000 * u + i) for u in (11, 12) for i in range(1, 8)]
    pd.DataFrame(rows, columns=["uid", "sku", "stars", "ts"]).to_csv(path, index=False)
    return path


def _rows(table: str) -> list[list[str]]:
    """The cells of each row of a printed table."""
    return [
        [cell.strip() for cell in line.strip("│ ").split("│")]
        for line in table.splitlines()
        if line.startswith("│")
    ]


def _custom(path: Path, tmp_path: Path) -> list[str]:
    return [
        "dataset=custom",
        f"dataset.path={path}",
        "dataset.columns.user=uid",
        "dataset.columns.item=sku",
        "dataset.columns.time=ts",
        "dataset.columns.rating=stars",
        f"paths.data_dir={tmp_path / 'data'}",
    ]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_set_every_knob(compose_config: Callable[..., DictConfig], preset: str) -> None:
    for dataset in ("ml-1m", "synthetic"):
        cfg = compose_config([f"dataset={dataset}", f"preprocess={preset}"])
        assert instantiate(cfg.dataset).preprocess == PRESETS[preset]
    # A single knob still overrides the preset.
    cfg = compose_config(
        ["dataset=ml-1m", f"preprocess={preset}", "dataset.preprocess.max_seq_len=50"]
    )
    assert instantiate(cfg.dataset).preprocess.max_seq_len == 50


def test_datasets_default_to_their_preset(compose_config: Callable[..., DictConfig]) -> None:
    assert instantiate(compose_config(["dataset=ml-100k"]).dataset).preprocess == PRESETS["sasrec"]
    assert instantiate(compose_config([]).dataset).preprocess == PRESETS["none"]


def test_presets_filter_as_documented(tmp_path: Path) -> None:
    raw = pd.read_csv(_ratings(tmp_path / "r.csv")).rename(
        columns={"uid": "user", "sku": "item", "stars": "rating", "ts": "timestamp"}
    )
    sizes = {name: preprocess(raw, settings).stats for name, settings in PRESETS.items()}
    # none keeps all; sasrec keeps users with >= 5 interactions (all of them); recbole first
    # drops the ratings below 3 (users 11, 12), then needs 10 interactions per user and item.
    assert (sizes["none"]["users"], sizes["none"]["interactions"]) == (12, 134)
    assert (sizes["sasrec"]["users"], sizes["sasrec"]["interactions"]) == (12, 134)
    assert (sizes["recbole"]["users"], sizes["recbole"]["items"]) == (10, 12)
    assert sizes["recbole"]["rows_after_step"]["rating"] == 120
    strict = preprocess(raw, PreprocessSettings(min_rating=3, user_core=11, item_core=10))
    assert strict.stats["users"] == 10  # 12 items each, still a core
    with pytest.raises(EmptyDatasetError, match="k-core filter"):
        preprocess(raw, PreprocessSettings(min_rating=3, user_core=13, item_core=10))


@pytest.mark.slow
def test_prepare_then_describe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overrides = _custom(_ratings(tmp_path / "r.csv"), tmp_path)
    assert main(["describe", *overrides]) == 1
    assert "is not prepared" in capsys.readouterr().out
    assert main(["prepare", *overrides, "preprocess=recbole"]) == 0
    prepared = capsys.readouterr().out
    assert main(["describe", *overrides, "preprocess=recbole"]) == 0
    described = capsys.readouterr().out
    assert described == prepared
    table = {cells[0]: cells[1] for cells in _rows(described)}
    assert (table["users"], table["items"], table["interactions"]) == ("10", "12", "120")
    assert (table["rows after input"], table["rows after rating"]) == ("134", "120")
    assert (table["preprocess.min_rating"], table["preprocess.user_core"]) == ("3.0", "10")
    # The default preset is another cache entry, not prepared yet.
    assert main(["describe", *overrides]) == 1


def test_errors_are_printed_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = _custom(tmp_path / "absent.csv", tmp_path)
    assert main(["prepare", *overrides]) == 1
    assert "error:" in capsys.readouterr().out
    assert main(["prepare", "dataset=amazon", "dataset.category=Shoes"]) == 1
    assert "unknown Amazon 2014 category 'Shoes'" in capsys.readouterr().out
    assert main(["prepare", "dataset=no-such-dataset"]) == 2
    assert "no-such-dataset" in capsys.readouterr().out


def test_a_synthetic_dataset_is_described_with_its_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = ["dataset.num_users=200", "dataset.num_items=100", f"paths.data_dir={tmp_path}"]
    assert main(["prepare", *overrides]) == 0
    ceiling = Synthetic(num_users=200, num_items=100).ceiling(10)
    expected = f"NDCG@10 {ceiling['ndcg@10']:.4f}, HR@10 {ceiling['hr@10']:.4f}"
    assert expected in capsys.readouterr().out
