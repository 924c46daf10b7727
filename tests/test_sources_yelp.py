"""Yelp reviews: JSON lines read from a folder downloaded by hand (no automated download)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig

from recsys_midx.data import ManualDownloadError, MissingFilesError, Yelp

REVIEWS = [
    {
        "review_id": "r1",
        "user_id": "mh_-eMZ6K5RLWhZyISBhwA",
        "business_id": "XQfwVwDr-v0ZS3_Cb",
        "stars": 3.0,
        "useful": 0,
        "text": "If you decide to eat here, just be aware...",
        "date": "2018-07-07 22:09:11",
    },
    {
        "review_id": "r2",
        "user_id": "OyoGAe7OKpv6SyGZT5g77Q",
        "business_id": "7ATYjTIgM3jUlt4UM3",
        "stars": 5.0,
        "useful": 1,
        "text": "I've taken a lot of spin classes...",
        "date": "2012-01-03 15:28:18",
    },
    {
        "review_id": "r3",
        "user_id": "mh_-eMZ6K5RLWhZyISBhwA",
        "business_id": "7ATYjTIgM3jUlt4UM3",
        "stars": 1.0,
        "useful": 0,
        "text": "Meh.\nNot again.",
        "date": "2014-02-05 20:30:30",
    },
]


def test_reviews_are_read_from_raw_dir(tmp_path: Path) -> None:
    folder = tmp_path / "yelp"
    folder.mkdir()
    (folder / "yelp_academic_dataset_review.json").write_text(
        "".join(json.dumps(review) + "\n" for review in REVIEWS)
    )
    ds = Yelp(raw_dir=str(folder), preprocess={"user_core": 0, "item_core": 0}).prepare(
        tmp_path / "data"
    )
    assert (ds.num_users, ds.num_items, len(ds.interactions)) == (2, 2, 3)
    # User 2 (mh_-...) has two reviews, oldest first.
    assert ds.interactions["rating"].tolist() == [5.0, 1.0, 3.0]
    assert ds.interactions["timestamp"].tolist() == [1325604498, 1391632230, 1531001351]


def test_without_raw_dir_the_error_gives_the_steps(tmp_path: Path) -> None:
    with pytest.raises(ManualDownloadError) as info:
        Yelp().prepare(tmp_path / "data")
    message = str(info.value)
    assert "cannot be downloaded automatically" in message
    assert "yelp_academic_dataset_review.json" in message and "dataset.raw_dir=" in message
    assert not (tmp_path / "data").exists()


def test_raw_dir_without_the_reviews_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "yelp_academic_dataset_business.json").write_text("{}\n")
    with pytest.raises(MissingFilesError) as info:
        Yelp(raw_dir=str(tmp_path)).prepare(tmp_path / "data")
    assert info.value.missing == ("yelp_academic_dataset_review.json",)
    assert "dataset.raw_dir=" in str(info.value)


def test_config(compose_config: Callable[..., DictConfig], tmp_path: Path) -> None:
    source = instantiate(compose_config(["dataset=yelp", f"dataset.raw_dir={tmp_path}"]).dataset)
    assert isinstance(source, Yelp) and source.raw_dir == tmp_path
