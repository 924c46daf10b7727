"""Amazon product reviews as ratings (McAuley et al.): the 2014 and 2018 ratings-only CSVs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from recsys_midx.data.errors import UnknownCategoryError
from recsys_midx.data.preprocess import PreprocessSettings
from recsys_midx.data.readers import ColumnMap, Delimited, read_interactions
from recsys_midx.data.sources.remote import Download, RemoteSource

#: Categories of the 2014 release (``ratings_<Category>.csv``).
CATEGORIES_2014 = (
    "Amazon_Instant_Video",
    "Apps_for_Android",
    "Automotive",
    "Baby",
    "Beauty",
    "Books",
    "CDs_and_Vinyl",
    "Cell_Phones_and_Accessories",
    "Clothing_Shoes_and_Jewelry",
    "Digital_Music",
    "Electronics",
    "Grocery_and_Gourmet_Food",
    "Health_and_Personal_Care",
    "Home_and_Kitchen",
    "Kindle_Store",
    "Movies_and_TV",
    "Musical_Instruments",
    "Office_Products",
    "Patio_Lawn_and_Garden",
    "Pet_Supplies",
    "Sports_and_Outdoors",
    "Tools_and_Home_Improvement",
    "Toys_and_Games",
    "Video_Games",
)
#: Categories of the 2018 release (``<Category>.csv``).
CATEGORIES_2018 = (
    "AMAZON_FASHION",
    "All_Beauty",
    "Appliances",
    "Arts_Crafts_and_Sewing",
    "Automotive",
    "Books",
    "CDs_and_Vinyl",
    "Cell_Phones_and_Accessories",
    "Clothing_Shoes_and_Jewelry",
    "Digital_Music",
    "Electronics",
    "Gift_Cards",
    "Grocery_and_Gourmet_Food",
    "Home_and_Kitchen",
    "Industrial_and_Scientific",
    "Kindle_Store",
    "Luxury_Beauty",
    "Magazine_Subscriptions",
    "Movies_and_TV",
    "Musical_Instruments",
    "Office_Products",
    "Patio_Lawn_and_Garden",
    "Pet_Supplies",
    "Prime_Pantry",
    "Software",
    "Sports_and_Outdoors",
    "Tools_and_Home_Improvement",
    "Toys_and_Games",
    "Video_Games",
)
_CATEGORIES = {2014: CATEGORIES_2014, 2018: CATEGORIES_2018}
# The two releases write the same four fields, without a header, in a different order.
_FIELDS = {
    2014: ("user", "item", "rating", "timestamp"),
    2018: ("item", "user", "rating", "timestamp"),
}
_COLUMNS = ColumnMap(user="user", item="item", time="timestamp", rating="rating")


class Amazon(RemoteSource):
    """One category of Amazon reviews as (user, item, rating, time) rows.

    The ratings-only files have no header: 2014's are ``user,item,rating,timestamp``, 2018's
    ``item,user,rating,timestamp``; ids are text (reviewer ids and ASINs, whose leading zeros are
    kept), times are seconds. Files are streamed, so even Books (22.5M rows) is read in bounded
    memory. No md5 is published, so the cache is keyed by the url.

    Args:
        name: the dataset's name (labels the processed folder).
        category: the category as the file names spell it, e.g. ``"Beauty"`` or
            ``"Sports_and_Outdoors"`` (see :data:`CATEGORIES_2014` / :data:`CATEGORIES_2018`).
        version: 2014 or 2018.
        url: address of the category's CSV; unused with ``raw_dir``.
        md5: expected md5 of the CSV, or None.
        raw_dir: a folder that directly contains the category's CSV (nothing is downloaded).
        preprocess: filters (default: 5-core, all ratings kept).

    Raises:
        UnknownCategoryError: ``category`` is not a category of ``version`` (the message lists
            them).
        ValueError: ``version`` is not 2014 or 2018, or neither ``url`` nor ``raw_dir`` given.

    Example:
        ```python
        beauty = Amazon("amazon-beauty", "Beauty", url="http://snap.stanford.edu/data/"
                        "amazon/productGraph/categoryFiles/ratings_Beauty.csv")
        dataset = beauty.prepare("datasets")
        ```
    """

    family = "amazon"

    def __init__(
        self,
        name: str,
        category: str,
        version: int = 2014,
        url: str | None = None,
        md5: str | None = None,
        raw_dir: str | None = None,
        preprocess: Mapping[str, Any] | PreprocessSettings | None = None,
    ) -> None:
        version = int(version)
        if version not in _CATEGORIES:
            raise ValueError(f"Amazon version must be 2014 or 2018, got {version}")
        if category not in _CATEGORIES[version]:
            raise UnknownCategoryError(f"Amazon {version}", category, _CATEGORIES[version])
        self.category = category
        self.version = version
        super().__init__(name, url, md5, raw_dir, preprocess)

    @property
    def file_name(self) -> str:
        """The category's CSV as the release names it."""
        prefix = "ratings_" if self.version == 2014 else ""
        return f"{prefix}{self.category}.csv"

    def _identity(self) -> dict[str, Any]:
        return {"version": self.version, "category": self.category}

    def _download(self) -> Download:
        return Download(f"amazon-{self.version}/{self.file_name}")

    def _files(self) -> tuple[str, ...]:
        return (self.file_name,)

    def _read(self, folder: Path) -> pd.DataFrame:
        fmt = Delimited(",", header=False, names=_FIELDS[self.version])
        return read_interactions(folder / self.file_name, fmt, _COLUMNS)
