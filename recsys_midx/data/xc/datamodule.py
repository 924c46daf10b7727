"""The Lightning data module of extreme classification: splits and loaders of points."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from recsys_midx.data.resumable import ResumableLoader
from recsys_midx.data.xc.batches import make_batch
from recsys_midx.data.xc.containers import XCData
from recsys_midx.data.xc.sources import XCDataset, XCSource
from recsys_midx.distributed import eval_sampler


class XCDataModule(L.LightningDataModule):
    """Serves sparse-feature points and their label sets for extreme classification.

    Training uses the training points that have at least one label (a point without labels
    gives the softmax nothing to learn), shuffled; validation holds out a seeded
    ``val_fraction`` of the training points; test is the source's test file. Evaluation batches
    keep every point, labelled or not.

    Args:
        source: where the points come from (:class:`~recsys_midx.data.xc.XCRepository` or
            :class:`~recsys_midx.data.xc.XCSynthetic`).
        data_dir: root of raw files and the processed Parquet cache.
        batch_size: points per training batch.
        eval_batch_size: points per evaluation batch.
        val_fraction: share of the training points held out for validation, in ``(0, 1)``.
        split_seed: seed of the validation hold-out.
        num_workers: data loader worker processes (0 is usually fastest: collation is
            vectorised).

    Raises:
        ValueError: if a batch size is not positive or ``val_fraction`` is not in ``(0, 1)``.

    Example:
        ```python
        dm = XCDataModule(XCSynthetic(num_labels=100, num_train=500, num_test=100), "/tmp/d")
        dm.prepare_data(); dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))  # {"features": ..., "labels": [B, P]}
        ```
    """

    def __init__(
        self,
        source: XCSource,
        data_dir: str | Path,
        batch_size: int = 256,
        eval_batch_size: int = 1024,
        val_fraction: float = 0.1,
        split_seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        for field, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if value <= 0:
                raise ValueError(f"{field} must be > 0, got {value}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.source = source
        self.data_dir = Path(data_dir)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.num_workers = num_workers
        self.dataset: XCDataset | None = None
        self.splits: dict[str, XCData] = {}

    def prepare_data(self) -> None:
        self.source.prepare(self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.dataset = self.source.prepare(self.data_dir)
        train = self.dataset.train
        order = np.random.default_rng(self.split_seed).permutation(train.num_points)
        num_val = min(max(1, round(self.val_fraction * train.num_points)), train.num_points - 1)
        fit = train.take(np.sort(order[num_val:]))
        self.splits = {
            "train": fit.take(np.flatnonzero(fit.labels.row_lengths() > 0)),
            "val": train.take(np.sort(order[:num_val])),
            "test": self.dataset.test,
        }

    def _split(self, name: str) -> XCData:
        if not self.splits:
            raise RuntimeError("XCDataModule.setup() must run before the data is used")
        return self.splits[name]

    @property
    def num_items(self) -> int:
        """``L``: the labels are the catalog the samplers and the softmax range over."""
        return self._split("train").num_labels

    @property
    def num_features(self) -> int:
        """``F``."""
        return self._split("train").num_features

    @property
    def encoder_sizes(self) -> dict[str, int]:
        """The sizes an XC encoder is built with: ``num_features`` and ``num_labels``."""
        return {"num_features": self.num_features, "num_labels": self.num_items}

    @property
    def item_counts(self) -> Tensor:
        """``[L+1]`` training frequency of each label (entry 0, padding, is 0): the counts of
        popularity proposals and of the label propensities of PSP@k."""
        return torch.from_numpy(self._split("train").label_counts())

    @property
    def num_train_points(self) -> int:
        """Training points (labelled ones, validation held out) the frequencies count over."""
        return self._split("train").num_points

    @property
    def stats(self) -> dict[str, Any]:
        """The processed dataset's statistics plus the sizes of the three splits."""
        assert self.dataset is not None, "call setup() first"
        return {
            **self.dataset.stats,
            "name": self.dataset.name,
            "splits": {name: data.num_points for name, data in self.splits.items()},
        }

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size, shuffle=False)

    def _loader(self, split: str, batch_size: int, shuffle: bool) -> DataLoader:
        data = self._split(split)
        points = range(data.num_points)  # indexes points; the collate gathers a batch at once
        # Evaluation shards must not repeat points (Lightning's sampler pads them): see
        # recsys_midx.distributed.eval_sampler.
        # The training loader can replay its order, so that a run resumes mid-epoch exactly.
        return (ResumableLoader if shuffle else DataLoader)(
            points,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=None if shuffle else eval_sampler(points),
            collate_fn=partial(make_batch, data),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )
