"""Tests of the extreme classification data layer: text format, Parquet, generator, batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from recsys_midx.data import MissingFilesError
from recsys_midx.data.xc import (
    CSR,
    SparseFeatures,
    XCData,
    XCDataModule,
    XCFormatError,
    XCRepository,
    XCSynthetic,
    generate_xc,
    make_batch,
    read_xc_file,
    write_xc_file,
)
from recsys_midx.metrics import inverse_propensities

#: Four points: two labels, none (leading space), one label without features, one with both.
TEXT = """4 6 5
0,3 1:0.5 4:2.25
 0:1 5:0.125
4
2 2:3
"""


def _write(tmp_path: Path, text: str, name: str = "points.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _assert_same(a: XCData, b: XCData) -> None:
    assert (a.num_features, a.num_labels) == (b.num_features, b.num_labels)
    for x, y in ((a.features, b.features), (a.labels, b.labels)):
        np.testing.assert_array_equal(x.indptr, y.indptr)
        np.testing.assert_array_equal(x.indices, y.indices)
        if x.values is not None or y.values is not None:
            np.testing.assert_array_equal(x.values, y.values)


def test_reader_parses_points_and_shifts_labels(tmp_path: Path) -> None:
    data = read_xc_file(_write(tmp_path, TEXT))
    assert (data.num_points, data.num_features, data.num_labels) == (4, 6, 5)
    assert data.labels.indptr.tolist() == [0, 2, 2, 3, 4]
    assert data.labels.indices.tolist() == [1, 4, 5, 3], "file labels 0..L-1 become 1..L"
    assert data.features.indptr.tolist() == [0, 2, 4, 4, 5]
    assert data.features.indices.tolist() == [1, 4, 0, 5, 2], "feature ids stay 0-based"
    assert data.features.values.tolist() == [0.5, 2.25, 1.0, 0.125, 3.0]
    assert data.label_counts().tolist() == [0, 1, 0, 1, 1, 1]


def test_reader_round_trip_through_the_writer(tmp_path: Path) -> None:
    data = generate_xc(
        num_labels=50,
        num_features=80,
        num_train=30,
        num_test=10,
        num_topics=4,
        mean_labels=3.0,
        max_labels=6,
        signature_size=3,
        signature_keep=0.8,
        noise_features=2.0,
        power_law_exponent=1.0,
        topic_coherence=0.5,
        seed=3,
    )
    assert (data.labels.row_lengths() > 0).all()
    empty = XCData(
        CSR(np.array([0, 1]), np.array([7], np.int32), np.array([0.25], np.float32)),
        CSR(np.array([0, 0]), np.array([], np.int32)),
        80,
        50,
    )
    both = XCData(
        CSR(
            np.concatenate([data.features.indptr, [data.features.indptr[-1] + 1]]),
            np.concatenate([data.features.indices, empty.features.indices]),
            np.concatenate([data.features.values, empty.features.values]),
        ),
        CSR(np.concatenate([data.labels.indptr, [data.labels.indptr[-1]]]), data.labels.indices),
        80,
        50,
    )
    path = write_xc_file(tmp_path / "round.txt", both)
    assert path.read_text().splitlines()[-1].startswith(" "), "a point without labels"
    _assert_same(read_xc_file(path), both)


def test_reader_merges_unsorted_and_repeated_ids(tmp_path: Path) -> None:
    data = read_xc_file(_write(tmp_path, "1 5 3\n2,0,2 4:1 1:0.5 4:2\n"))
    assert data.labels.indices.tolist() == [1, 3]
    assert data.features.indices.tolist() == [1, 4]
    assert data.features.values.tolist() == [0.5, 3.0]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("5 6 5\n0 1:1\n", None, "declares 5 points, the file holds 1"),
        ("1 6 5\n7 1:1\n", 2, "label id 7 is outside 0..4"),
        ("2 6 5\n0 1:1\n1 6:1\n", 3, "feature id 6 is outside 0..5"),
        ("2 6 5\n0 1:1\n1 2:x\n", 3, "cannot parse"),
        ("1 6 5\n0,,1 1:1\n", 2, "cannot parse"),
        ("1 6\n0 1:1\n", 1, "header must be"),
    ],
)
def test_reader_reports_format_errors(
    tmp_path: Path, text: str, line: int | None, message: str
) -> None:
    with pytest.raises(XCFormatError, match=message) as caught:
        read_xc_file(_write(tmp_path, text))
    assert caught.value.line == line


def test_missing_raw_files_message_lists_expected_names(tmp_path: Path) -> None:
    files = {"train": "eurlex_train.txt", "test": "eurlex_test.txt"}
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "eurlex_test.txt").write_text("0 1 1\n")
    source = XCRepository("xc-eurlex-4k", files, raw_dir=tmp_path / "raw")
    with pytest.raises(MissingFilesError, match="'eurlex_train.txt'") as caught:
        source.prepare(tmp_path / "data")
    assert caught.value.missing == ("eurlex_train.txt",)
    assert "eurlex_test.txt" in str(caught.value) and "raw_dir" in str(caught.value)
    default = XCRepository("xc-eurlex-4k", files)
    with pytest.raises(MissingFilesError) as caught:
        default.prepare(tmp_path / "data")
    assert caught.value.folder == tmp_path / "data" / "raw" / "xc-eurlex-4k"
    assert caught.value.missing == ("eurlex_train.txt", "eurlex_test.txt")


def test_repository_source_caches_parquet(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    _write(raw, TEXT, "train.txt")
    _write(raw, "1 6 5\n1 3:1\n", "test.txt")
    source = XCRepository("tiny", {"train": "train.txt", "test": "test.txt"}, raw_dir=raw)
    dataset = source.prepare(tmp_path / "data")
    _assert_same(dataset.train, read_xc_file(raw / "train.txt"))
    assert dataset.stats["train_points"] == 4 and dataset.stats["test_points"] == 1
    assert sorted(path.name for path in dataset.directory.iterdir()) == [
        "settings.json",
        "stats.json",
        "test.parquet",
        "train.parquet",
    ]
    (raw / "train.txt").unlink()  # the cache key needs the raw files, the data does not change
    _write(raw, TEXT, "train.txt")
    assert source.prepare(tmp_path / "data").directory == dataset.directory


def test_test_file_must_match_training_sizes(tmp_path: Path) -> None:
    _write(tmp_path, TEXT, "train.txt")
    _write(tmp_path, "1 7 5\n1 3:1\n", "test.txt")
    source = XCRepository("tiny", {"train": "train.txt", "test": "test.txt"}, raw_dir=tmp_path)
    with pytest.raises(XCFormatError, match="7 features"):
        source.prepare(tmp_path / "data")


def test_synthetic_is_deterministic_and_seeded(tmp_path: Path) -> None:
    settings = {"num_labels": 300, "num_features": 900, "num_train": 400, "num_test": 100}
    first = XCSynthetic(**settings).prepare(tmp_path / "a")
    again = XCSynthetic(**settings).prepare(tmp_path / "b")
    other = XCSynthetic(**settings, seed=1).prepare(tmp_path / "a")
    _assert_same(first.train, again.train)
    _assert_same(first.test, again.test)
    assert other.directory != first.directory
    assert not np.array_equal(first.train.labels.indices, other.train.labels.indices)
    assert (first.train.num_points, first.test.num_points) == (400, 100)
    norms = np.bincount(
        np.repeat(np.arange(400), first.train.features.row_lengths()),
        weights=first.train.features.values.astype(np.float64) ** 2,
    )
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)


def test_synthetic_label_frequencies_follow_a_power_law() -> None:
    exponent = 1.0
    data = generate_xc(
        num_labels=2000,
        num_features=4000,
        num_train=30000,
        num_test=1,
        num_topics=20,
        mean_labels=3.0,
        max_labels=10,
        signature_size=4,
        signature_keep=0.7,
        noise_features=2.0,
        power_law_exponent=exponent,
        topic_coherence=0.7,
        seed=0,
    )
    counts = np.sort(data.label_counts()[1:])[::-1].astype(float)
    ranks = np.arange(1, 101)
    slope = np.polyfit(np.log(ranks), np.log(counts[:100]), 1)[0]
    assert slope == pytest.approx(-exponent, abs=0.25)
    assert counts[0] > 20 * np.median(counts)


def test_synthetic_signatures_make_labels_predictable_from_features() -> None:
    # Points sharing a label share signature features far more than random pairs do.
    data = generate_xc(
        num_labels=100,
        num_features=2000,
        num_train=2000,
        num_test=1,
        num_topics=10,
        mean_labels=1.0,
        max_labels=1,
        signature_size=8,
        signature_keep=1.0,
        noise_features=0.0,
        power_law_exponent=0.0,
        topic_coherence=0.0,
        seed=0,
    )
    first = data.take(np.array([0]))
    same = np.flatnonzero(data.labels.indices == first.labels.indices[0])
    assert len(same) > 2
    for row in same[1:3]:
        np.testing.assert_array_equal(
            data.take(np.array([row])).features.indices, first.features.indices
        )


def test_data_module_splits_and_batches(tmp_path: Path) -> None:
    source = XCSynthetic(num_labels=60, num_features=200, num_train=300, num_test=80, seed=2)
    dm = XCDataModule(source, tmp_path, batch_size=32, eval_batch_size=50, val_fraction=0.2)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.num_items == 60 and dm.encoder_sizes == {"num_features": 200, "num_labels": 60}
    assert dm.stats["splits"]["val"] == 60 and dm.stats["splits"]["test"] == 80
    assert dm.item_counts.shape == (61,) and dm.item_counts[0] == 0
    assert (
        dm.num_train_points
        == dm.stats["splits"]["train"]
        == int((dm.splits["train"].labels.row_lengths() > 0).sum())
    )
    weights = inverse_propensities(
        dm.item_counts, dm.num_train_points, source.propensity_a, source.propensity_b
    )
    assert weights.shape == (61,) and weights[0] == 0
    batch = next(iter(dm.train_dataloader()))
    features, labels = batch["features"], batch["labels"]
    assert len(features) == 32 and labels.shape[0] == 32
    assert ((labels > 0).sum(dim=1) > 0).all(), "training points have labels"
    assert features.offsets[0] == 0 and features.offsets[-1] == len(features.indices)
    assert sum(len(b["labels"]) for b in dm.val_dataloader()) == 60


def test_make_batch_pads_labels_and_keeps_bags() -> None:
    data = XCData(
        CSR(
            np.array([0, 2, 2, 3]),
            np.array([1, 4, 0], np.int32),
            np.array([0.5, 1.0, 2.0], np.float32),
        ),
        CSR(np.array([0, 2, 2, 3]), np.array([1, 3, 2], np.int32)),
        5,
        3,
    )
    batch = make_batch(data, [2, 0, 1])
    assert batch["labels"].tolist() == [[2, 0], [1, 3], [0, 0]]
    features = batch["features"]
    assert features.offsets.tolist() == [0, 1, 3, 3]
    assert features.indices.tolist() == [0, 1, 4]
    assert features.weights.tolist() == [2.0, 0.5, 1.0]
    head = features[:2]
    assert head.offsets.tolist() == [0, 1, 3] and head.indices.tolist() == [0, 1, 4]
    tail = features[1:]
    assert tail.offsets.tolist() == [0, 2, 2] and tail.weights.tolist() == [0.5, 1.0]
    assert len(features[:10]) == 3
    moved = features.to(torch.device("cpu"))
    assert isinstance(moved, SparseFeatures) and torch.equal(moved.indices, features.indices)
