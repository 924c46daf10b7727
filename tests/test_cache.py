"""Tests of the processed-dataset cache shared by sequential and extreme classification data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recsys_midx.data import DataError, MissingFilesError, Synthetic
from recsys_midx.data.cache import (
    cache_key,
    cached,
    checked_settings,
    processed_directory,
)
from recsys_midx.data.pipeline import cache_directory
from recsys_midx.data.xc import XCSynthetic

SETTINGS = {"name": "toy", "schema_version": 1, "fingerprint": {"seed": 0}}


def _write_points(directory: Path, text: str) -> None:
    (directory / "points.txt").write_text(text)


def _load(directory: Path) -> str:
    checked_settings(directory, ("points.txt", "settings.json"), schema_version=1)
    return (directory / "points.txt").read_text()


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def test_key_follows_every_setting_and_ignores_key_order(tmp_path: Path) -> None:
    folder = processed_directory(tmp_path, SETTINGS)
    assert folder.parent == tmp_path / "processed" and folder.name.startswith("toy-")
    assert len(folder.name) == len("toy-") + 12
    assert folder == processed_directory(tmp_path, dict(reversed(list(SETTINGS.items()))))
    changed = [
        {**SETTINGS, "schema_version": 2},
        {**SETTINGS, "fingerprint": {"seed": 1}},
        {**SETTINGS, "preprocess": {"min_rating": 4}},
    ]
    assert len({cache_key(SETTINGS), *(cache_key(s) for s in changed)}) == 1 + len(changed)


def test_sources_key_their_folders_by_their_settings(tmp_path: Path) -> None:
    assert cache_directory(Synthetic(seed=0), tmp_path) != cache_directory(
        Synthetic(seed=1), tmp_path
    )
    first = XCSynthetic(num_labels=20, num_features=50, num_train=30, num_test=10, seed=0)
    again = XCSynthetic(num_labels=20, num_features=50, num_train=30, num_test=10, seed=0)
    other = XCSynthetic(num_labels=20, num_features=50, num_train=30, num_test=10, seed=1)
    assert first.prepare(tmp_path).directory == again.prepare(tmp_path).directory
    assert other.prepare(tmp_path).directory != first.prepare(tmp_path).directory
    assert len(list((tmp_path / "processed").iterdir())) == 2


def test_cached_builds_once_and_reuses_the_folder(tmp_path: Path) -> None:
    builds = []

    def build() -> str:
        builds.append(1)
        return "points"

    folder = processed_directory(tmp_path, SETTINGS)
    assert cached(folder, SETTINGS, build, _write_points, _load) == "points"
    assert cached(folder, SETTINGS, build, _write_points, _load) == "points"
    assert len(builds) == 1
    assert json.loads((folder / "settings.json").read_text()) == SETTINGS
    assert _tree(tmp_path / "processed") == [
        folder.name,
        f"{folder.name}/points.txt",
        f"{folder.name}/settings.json",
    ]


def test_failed_build_or_write_leaves_nothing(tmp_path: Path) -> None:
    folder = processed_directory(tmp_path, SETTINGS)

    def failing_build() -> str:
        raise DataError("no raw data")

    with pytest.raises(DataError, match="no raw data"):
        cached(folder, SETTINGS, failing_build, _write_points, _load)
    assert not (tmp_path / "processed").exists(), "nothing is created before the build succeeds"

    def write_then_crash(directory: Path, text: str) -> None:
        _write_points(directory, text)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached(folder, SETTINGS, lambda: "points", write_then_crash, _load)
    assert _tree(tmp_path / "processed") == [], "no partial folder or file is left"
    assert cached(folder, SETTINGS, lambda: "points", _write_points, _load) == "points"


def test_schema_mismatch_and_missing_files_are_detected(tmp_path: Path) -> None:
    folder = processed_directory(tmp_path, SETTINGS)
    cached(folder, SETTINGS, lambda: "points", _write_points, _load)
    with pytest.raises(DataError, match="schema version 1, this code reads version 2"):
        checked_settings(folder, ("points.txt", "settings.json"), schema_version=2)
    (folder / "points.txt").unlink()
    with pytest.raises(MissingFilesError, match="lacks 'points.txt'"):
        checked_settings(folder, ("points.txt", "settings.json"), schema_version=1)


def test_xc_folder_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    source = XCSynthetic(num_labels=20, num_features=50, num_train=30, num_test=10)
    folder = source.prepare(tmp_path).directory
    settings = json.loads((folder / "settings.json").read_text())
    (folder / "settings.json").write_text(json.dumps({**settings, "schema_version": 0}))
    with pytest.raises(DataError, match="schema version 0"):
        source.prepare(tmp_path)
