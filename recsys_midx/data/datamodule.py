"""Lightning data module for sequential recommendation, split leave-one-out or by global time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from recsys_midx.data.pipeline import PreparedDataset
from recsys_midx.data.resumable import ResumableLoader
from recsys_midx.data.sources.base import Source
from recsys_midx.data.splits import LeaveOneOut, SequenceSplit, Spans, SplitStrategy, Stage
from recsys_midx.data.train_samples import TrainSamples, check_sample_kind, left_padded_windows
from recsys_midx.distributed import eval_sampler
from recsys_midx.errors import ConfigError

Batch = dict[str, Tensor]

# Seed of the evaluation user samples (``val_users``, ``test_users``): not the run's seed, so that
# runs of every seed are compared on the same users.
EVAL_SAMPLE_SEED = 0


class _Rows(Dataset):
    """Indexes users or training samples; batches are assembled in one vectorised collate call,
    not item by item."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, row: int) -> int:
        return row


class SeqRecDataModule(L.LightningDataModule):
    """Serves training sequences and evaluation queries for one dataset, split by ``split``.

    Training batches hold windows of the training sequences, chosen by ``train_samples`` (see
    :mod:`recsys_midx.data.train_samples`): by default windows of ``max_len + 1`` items covering
    every training item, each position a query.
    Evaluation batches hold the last ``max_len`` items before the target, the target, and the
    whole history before it (for excluding seen items from the ranking).

    Args:
        source: where the interactions come from (see :mod:`recsys_midx.data.sources`).
        data_dir: root of raw downloads and the processed Parquet cache.
        max_len: longest input sequence fed to the encoder.
        batch_size: samples per training batch.
        eval_batch_size: users per evaluation batch.
        num_workers: data loader worker processes (0 is usually fastest: collation is vectorised).
        split: how training, validation and test are formed (the ``split`` config group):
            :class:`~recsys_midx.data.splits.LeaveOneOut` (default) or
            :class:`~recsys_midx.data.time_split.GlobalTime`.
        train_samples: the training samples of an epoch: ``"windows"`` (default),
            ``"prefixes"`` or ``"last_window"`` (see :mod:`recsys_midx.data.train_samples`).
        window_stride: items between consecutive windows' ends for ``"windows"``, in
            ``1..max_len`` (``None``: ``max_len``).
        val_users: validate on this many users, a fixed sample (``None``: every user). The sample
            is drawn with a seed of its own, so every run and seed of a dataset and split
            validates on the same users; it bounds validation's cost on catalogs where ranking
            every item for every user takes longer than an epoch.
        test_users: the same for the test.

    Raises:
        ValueError: if ``max_len`` or a batch size is not positive.
        ConfigError: if ``train_samples`` or ``window_stride`` is not a valid choice, or
            ``val_users`` or ``test_users`` is not positive.

    Example:
        ```python
        dm = SeqRecDataModule(Synthetic(num_users=100, num_items=50), "datasets", max_len=20)
        dm.prepare_data(); dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))  # {"inputs": [B, 20], "targets": [B, 20]}
        ```
    """

    def __init__(
        self,
        source: Source,
        data_dir: str | Path,
        max_len: int,
        batch_size: int = 128,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        split: SplitStrategy | None = None,
        train_samples: str = "windows",
        window_stride: int | None = None,
        val_users: int | None = None,
        test_users: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("max_len", max_len),
            ("batch_size", batch_size),
            ("eval_batch_size", eval_batch_size),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        check_sample_kind(train_samples, window_stride, max_len)
        self.eval_users: dict[Stage, int | None] = {"val": val_users, "test": test_users}
        for stage, users in self.eval_users.items():
            if users is not None and users <= 0:
                raise ConfigError(
                    f"task.datamodule.{stage}_users must be a positive number of users or null, "
                    f"got {users}"
                )
        self.train_samples = train_samples
        self.window_stride = window_stride
        self.source = source
        self.data_dir = Path(data_dir)
        self.max_len = max_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.splitter: SplitStrategy = split if split is not None else LeaveOneOut()
        self.dataset: PreparedDataset | None = None
        self.split: SequenceSplit | None = None

    def prepare_data(self) -> None:
        self.source.prepare(self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.split is None:
            dataset = self.source.prepare(self.data_dir)
            self.split = self.splitter.build(dataset)
            # The split holds what training and evaluation read (8 bytes per interaction); the
            # frame (24+ bytes per interaction) would otherwise stay alive in every DDP rank.
            self.dataset = replace(dataset, interactions=dataset.interactions.iloc[:0])

    @property
    def num_items(self) -> int:
        return self._split.num_items

    @property
    def encoder_sizes(self) -> dict[str, int]:
        """The sizes a sequence encoder is built with: ``num_items``."""
        return {"num_items": self.num_items}

    @property
    def stats(self) -> dict[str, Any]:
        assert self.dataset is not None, "call setup() first"
        return self.dataset.stats

    @property
    def item_counts(self) -> Tensor:
        """``[N + 1]`` training-part frequency of each item (for popularity proposals)."""
        return torch.from_numpy(self._split.train_item_counts())

    def user_sequences(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every kept user's whole chronological sequence: training, validation and test items.

        Read from the split's arrays (``dataset.interactions`` is emptied by :meth:`setup`). For
        leave-one-out a user's sequence is all its interactions; for the global time split, its
        interactions up to its test target (later ones are not kept).

        Returns:
            ``(user_ids, offsets, items)``: row ``r`` is dataset user ``user_ids[r]`` (ascending),
            whose items are ``items[offsets[r]:offsets[r + 1]]``, oldest first.

        Example:
            ```python
            user_ids, offsets, items = dm.user_sequences()
            items[offsets[0]:offsets[1]]  # user user_ids[0]'s items
            ```
        """
        split = self._split
        return split.user_ids, split.offsets, split.items

    @cached_property
    def sample_index(self) -> TrainSamples:
        """The epoch's training samples (``train_samples``), indexed ``0..len - 1``.

        It holds one ``int64`` per training row (the cumulative sample counts), whatever the
        number of samples: each batch's windows are cut from the split's items when it is made.

        Raises:
            RuntimeError: if :meth:`setup` has not run.
        """
        split = self._split
        return TrainSamples(
            split.items, split.spans("train"), self.max_len, self.train_samples, self.window_stride
        )

    @property
    def _split(self) -> SequenceSplit:
        if self.split is None:
            raise RuntimeError("SeqRecDataModule.setup() must run before the data is used")
        return self.split

    def train_dataloader(self) -> DataLoader:
        samples = self.sample_index
        # The loader shuffles (and, distributed, shards) sample indices, never users.
        return self._loader(len(samples), samples.batch, self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def eval_spans(self, stage: Stage) -> Spans:
        """The queries ``stage`` evaluates: every user's, or the fixed sample of ``{stage}_users``.

        Args:
            stage: ``"val"`` or ``"test"``.

        Returns:
            The split's spans of ``stage``, restricted to the sampled rows (in ascending order)
            when ``{stage}_users`` is set and smaller than the number of users.
        """
        spans = self._split.spans(stage)
        users = self.eval_users[stage]
        if users is None or users >= len(spans):
            return spans
        rows = np.sort(
            np.random.default_rng(EVAL_SAMPLE_SEED).choice(len(spans), users, replace=False)
        )
        return Spans(spans.starts[rows], spans.ends[rows])

    def _eval_loader(self, stage: Stage) -> DataLoader:
        spans = self.eval_spans(stage)
        return self._loader(
            len(spans), partial(self._eval_batch, spans=spans), self.eval_batch_size, shuffle=False
        )

    def _loader(
        self, size: int, collate: Callable[[list[int]], Batch], batch_size: int, shuffle: bool
    ) -> DataLoader:
        rows = _Rows(size)
        # Training shards come from Lightning's distributed sampler; evaluation shards must not
        # repeat users to even out the ranks, so they get an unpadded sampler.
        # The training loader can replay its order, so that a run resumes mid-epoch exactly.
        return (ResumableLoader if shuffle else DataLoader)(
            rows,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=None if shuffle else eval_sampler(rows),
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _eval_batch(self, rows: list[int], spans: Spans) -> Batch:
        """Collate queries ``rows`` of ``spans``: history ``items[start:end]``, target ``end``."""
        split, index = self._split, np.asarray(rows)
        starts, ends = spans.starts[index], spans.ends[index]
        history_width = int((ends - starts).max())
        return {
            "inputs": torch.from_numpy(
                left_padded_windows(split.items, starts, ends, self.max_len)
            ),
            "targets": torch.from_numpy(split.items[ends]),
            "history": torch.from_numpy(
                left_padded_windows(split.items, starts, ends, history_width)
            ),
        }
