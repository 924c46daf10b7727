"""Yelp reviews (the Yelp Open Dataset), read from a folder the user downloaded by hand."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from recsys_midx.data.preprocess import PreprocessSettings
from recsys_midx.data.readers import ColumnMap, JsonLines, read_interactions
from recsys_midx.data.sources.remote import RemoteSource

_FILE = "yelp_academic_dataset_review.json"


class Yelp(RemoteSource):
    """Yelp reviews as ratings: user ``user_id``, item ``business_id``, ``stars``, ``date``.

    Yelp's terms forbid automated downloads, so the files are fetched by hand (see
    :attr:`manual_steps`) and ``raw_dir`` points at them. The review file (JSON lines, several GB
    with the review texts) is streamed and only the four fields are parsed.

    Args:
        name: the dataset's name (labels the processed folder).
        raw_dir: the folder that contains ``yelp_academic_dataset_review.json``; without it,
            preparing raises :class:`~recsys_midx.data.errors.ManualDownloadError` with the steps.
        preprocess: filters (default: 5-core, all ratings kept).

    Example:
        ```python
        yelp = Yelp("yelp", raw_dir="~/data/yelp")
        dataset = yelp.prepare("datasets")
        ```
    """

    family = "yelp"
    manual_steps = (
        "Yelp's terms do not allow automated downloads. To use it:\n"
        "  1. open https://business.yelp.com/data/resources/open-dataset/, accept the Dataset "
        "License and download the JSON dataset;\n"
        "  2. extract the archive (and the .tar inside it); keep the folder that holds "
        f"{_FILE};\n"
        "  3. pass that folder as dataset.raw_dir, e.g.\n"
        "     python -m recsys_midx.data prepare dataset=yelp dataset.raw_dir=/path/to/yelp"
    )

    def __init__(
        self,
        name: str = "yelp",
        raw_dir: str | None = None,
        preprocess: Mapping[str, Any] | PreprocessSettings | None = None,
    ) -> None:
        super().__init__(name, None, None, raw_dir, preprocess)

    def _files(self) -> tuple[str, ...]:
        return (_FILE,)

    def _raw_dir_hint(self) -> str:
        return f"{super()._raw_dir_hint()}.\n{self.manual_steps}"

    def _read(self, folder: Path) -> pd.DataFrame:
        columns = ColumnMap(user="user_id", item="business_id", time="date", rating="stars")
        return read_interactions(folder / _FILE, JsonLines(), columns)
