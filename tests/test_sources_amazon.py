"""Amazon 2014 and 2018 ratings-only CSVs, in their real layouts, served over local HTTP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig
from test_download import FileServer, publish, server, tree  # noqa: F401

from recsys_midx.data import Amazon, MissingFilesError, UnknownCategoryError

# Reviewers A1..A5 rate products 000..004 (ASINs with leading zeros) and B00X; reviewer Z rates
# one product, and product 999 has one rating: both fall out of a 5-core.
ROWS = [
    (f"A{user}", asin, float(1 + (user + k) % 5), 1_380_000_000 + 100 * user + k)
    for user in range(1, 6)
    for k, asin in enumerate(
        ["0000000000", "0000000001", "0000000002", "0000000003", "0000000004", "B00X"]
    )
] + [("Z", "0000000000", 5.0, 1_390_000_000), ("A1", "0000000999", 2.0, 1_390_000_001)]


def _csv(version: int) -> bytes:
    """A category file: 2014 writes user,item,...; 2018 writes item,user,... (no header)."""
    if version == 2014:
        return "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in ROWS).encode()
    return "".join(f"{i},{u},{r},{t}\n" for u, i, r, t in ROWS).encode()


@pytest.mark.parametrize(
    ("version", "file_name"), [(2014, "ratings_Beauty.csv"), (2018, "All_Beauty.csv")]
)
def test_category_is_downloaded_and_parsed(
    server: FileServer,  # noqa: F811
    tmp_path: Path,
    version: int,
    file_name: str,
) -> None:
    url, _ = publish(server, file_name, _csv(version))
    category = "Beauty" if version == 2014 else "All_Beauty"
    data_dir = tmp_path / "data"
    ds = Amazon("beauty", category, version=version, url=url).prepare(data_dir)
    assert (ds.num_users, ds.num_items, len(ds.interactions)) == (5, 6, 30)
    assert tree(data_dir / "raw") == [f"amazon-{version}", f"amazon-{version}/{file_name}"]
    item_map = pd.read_parquet(ds.directory / "item_map.parquet")
    assert item_map["raw_id"].tolist() == [
        "0000000000",
        "0000000001",
        "0000000002",
        "0000000003",
        "0000000004",
        "B00X",
    ]
    user_map = pd.read_parquet(ds.directory / "user_map.parquet")
    assert user_map["raw_id"].tolist() == ["A1", "A2", "A3", "A4", "A5"]
    first = ds.interactions[ds.interactions["user_id"] == 1]
    assert first["rating"].tolist() == [2.0, 3.0, 4.0, 5.0, 1.0, 2.0]


def test_unknown_category_lists_the_known_ones() -> None:
    with pytest.raises(UnknownCategoryError) as info:
        Amazon("x", "Beuty", url="http://unused")
    message = str(info.value)
    assert "unknown Amazon 2014 category 'Beuty' (did you mean 'Beauty'?)" in message
    assert "Toys_and_Games" in message and "Video_Games" in message
    with pytest.raises(UnknownCategoryError, match="Amazon 2018 category 'Beauty'.*All_Beauty"):
        Amazon("x", "Beauty", version=2018, url="http://unused")


def test_raw_dir_names_the_missing_file(tmp_path: Path) -> None:
    (tmp_path / "ratings_Books.csv").write_bytes(_csv(2014))
    source = Amazon("x", "Beauty", raw_dir=str(tmp_path))
    with pytest.raises(MissingFilesError, match="'ratings_Beauty.csv'"):
        source.prepare(tmp_path / "data")


def test_configs_pick_the_category(compose_config: Callable[..., DictConfig]) -> None:
    beauty = instantiate(compose_config(["dataset=amazon-beauty"]).dataset)
    assert (beauty.name, beauty.category, beauty.version) == ("amazon-beauty", "Beauty", 2014)
    assert beauty.url.endswith("/categoryFiles/ratings_Beauty.csv")
    any_category = compose_config(["dataset=amazon", "dataset.category=Baby"]).dataset
    assert instantiate(any_category).name == "amazon-Baby"
    newer = instantiate(
        compose_config(["dataset=amazon2018", "dataset.category=Luxury_Beauty"]).dataset
    )
    assert newer.version == 2018 and newer.url.endswith("/categoryFilesSmall/Luxury_Beauty.csv")
    with pytest.raises(Exception, match="unknown Amazon 2014 category 'Shoes'"):
        instantiate(compose_config(["dataset=amazon", "dataset.category=Shoes"]).dataset)
