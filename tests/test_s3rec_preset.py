"""``dataset=s3rec`` and the one-user-per-line format on tiny files in the published layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check_leave_one_out
from hydra.utils import instantiate

import recsys_midx.data.readers.formats as formats
from recsys_midx.app.preflight import check_required
from recsys_midx.data import ColumnMap, MissingColumnsError, read_interactions
from recsys_midx.data.readers import Sequences
from recsys_midx.errors import ConfigError

#: Each user's items in time order, ids as S3-Rec writes them (1-based, items shared by users).
SEQUENCES = {1: [3, 1, 4, 5, 2], 2: [6, 2, 3, 1, 5], 3: [5, 6, 4, 2, 3, 1]}
IDS = ColumnMap(user="user", item="item", time=None)


@pytest.fixture
def published_file(tmp_path: Path) -> Path:
    path = tmp_path / "Beauty.txt"
    path.write_text(
        "".join(f"{user} {' '.join(map(str, items))}\n" for user, items in SEQUENCES.items())
    )
    return path


def test_each_line_gives_a_row_per_item_in_its_order(tmp_path: Path, monkeypatch) -> None:
    # Batches far smaller than the file, a blank line, a user without items, tabs and runs of
    # spaces: the rows are the lines' items in order, whatever the batches.
    monkeypatch.setattr(formats, "LINES_PER_BATCH", 2)
    path = tmp_path / "lines.txt"
    path.write_text("u1 a b  c\n\nu2\nu3\tc\ta\n")
    raw = read_interactions(path, Sequences(), IDS)
    pairs = list(zip(raw["user"].astype(str), raw["item"].astype(str)))
    assert pairs == [("u1", "a"), ("u1", "b"), ("u1", "c"), ("u3", "c"), ("u3", "a")]
    # Another separator; the line ends are not part of the last id.
    path.write_text("7,1,2\r\n8,2\n")
    raw = read_interactions(path, Sequences(","), IDS)
    pairs = list(zip(raw["user"].astype(str), raw["item"].astype(str)))
    assert pairs == [("7", "1"), ("7", "2"), ("8", "2")]


def test_a_column_the_layout_has_not_is_named(published_file: Path) -> None:
    with pytest.raises(MissingColumnsError, match="'ts'.*'user', 'item'"):
        read_interactions(
            published_file, Sequences(), ColumnMap(user="user", item="item", time="ts")
        )


def test_the_preset_names_dataset_path_when_it_is_missing(compose_config) -> None:
    with pytest.raises(ConfigError, match=r"^dataset\.path must be set"):
        check_required(compose_config(["dataset=s3rec"]))


def test_the_file_is_read_as_published_and_split_leave_one_out(compose_config, published_file):
    cfg = compose_config(["dataset=s3rec", f"dataset.path={published_file}"])
    module = instantiate(cfg.task.datamodule)
    module.prepare_data()
    module.setup("fit")
    assert module.num_items == 6 and module.stats["users"] == 3
    assert module.stats["interactions"] == sum(map(len, SEQUENCES.values()))
    check_leave_one_out(module, SEQUENCES)
