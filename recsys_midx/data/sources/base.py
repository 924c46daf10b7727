"""The interface every dataset source implements."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from recsys_midx.data.cache import checked_name
from recsys_midx.data.pipeline import PreparedDataset, prepare_dataset
from recsys_midx.data.preprocess import PreprocessSettings


class Source(abc.ABC):
    """A dataset source: knows how to obtain the raw interactions.

    Subclasses say what determines their raw content (:meth:`fingerprint`) and how to get it
    (:meth:`load_raw`); :meth:`prepare` then filters it and caches the result (see
    :mod:`recsys_midx.data.pipeline`).

    Args:
        name: the dataset's name; it labels the processed folder, so it must be a plain file name
            (letters, digits, ``.``, ``_``, ``-``).
        preprocess: the filters, as settings or as a mapping (e.g. a Hydra ``DictConfig``) of
            fields that override the source's defaults (:attr:`default_preprocess`).

    Raises:
        ValueError: the name is not a plain file name, or ``preprocess`` has unknown fields.
    """

    #: Filters used for the fields that ``preprocess`` does not set.
    default_preprocess: ClassVar[PreprocessSettings] = PreprocessSettings()

    def __init__(
        self, name: str, preprocess: Mapping[str, Any] | PreprocessSettings | None = None
    ) -> None:
        self.name = checked_name(name)
        self.preprocess = self._settings(preprocess)

    def _settings(
        self, preprocess: Mapping[str, Any] | PreprocessSettings | None
    ) -> PreprocessSettings:
        if preprocess is None:
            return self.default_preprocess
        if isinstance(preprocess, PreprocessSettings):
            return preprocess
        overrides = dict(preprocess)
        known = {field.name for field in dataclasses.fields(PreprocessSettings)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(
                f"unknown preprocess setting(s) {unknown} for {self.name!r}; known: {sorted(known)}"
            )
        return dataclasses.replace(self.default_preprocess, **overrides)

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """Everything that determines the raw content (url+md5, generator params, raw_dir...).

        Returns:
            A JSON-compatible dict; the processed cache is keyed by it (and by the settings).
        """

    @abc.abstractmethod
    def load_raw(self, data_dir: Path) -> pd.DataFrame:
        """Obtain the raw files (download into ``data_dir/raw/...``) and return the raw frame.

        Args:
            data_dir: the data root.

        Returns:
            Columns ``user``, ``item`` (ints or strings, possibly dictionary-encoded as the
            streaming reader delivers them), ``timestamp`` (int64 seconds) and optionally
            ``rating`` (float).

        Raises:
            DataError: the raw data cannot be obtained or read.
        """

    def prepare(self, data_dir: str | Path) -> PreparedDataset:
        """Filter the raw data and cache the result, or load the cached result.

        Args:
            data_dir: the data root (raw files in ``raw/``, processed folders in ``processed/``).

        Returns:
            The processed dataset.

        Raises:
            DataError: see :func:`recsys_midx.data.pipeline.prepare_dataset`.

        Example:
            >>> from recsys_midx.data import Synthetic
            >>> Synthetic(num_users=100, num_items=80).prepare("/tmp/datasets").num_users
            100
        """
        return prepare_dataset(self, data_dir)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, fingerprint={self.fingerprint()!r})"
