"""The Lightning data module of language modelling: contiguous token streams cut into stretches
for truncated backpropagation through time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from recsys_midx.data.lm.corpus import SPLITS, Corpus, CorpusSource
from recsys_midx.errors import ConfigError


def batchify(stream: Tensor, columns: int) -> Tensor:
    """Lay a stream out as ``columns`` contiguous streams side by side: ``[columns, n]``, the
    first ``n`` tokens in row 0, the next ``n`` in row 1, ...; the last ``len % columns`` tokens
    are dropped, as the language-modelling literature does.

    Example:
        >>> batchify(torch.arange(1, 8), 2)
        tensor([[1, 2, 3],
                [4, 5, 6]])
    """
    length = len(stream) // columns
    return stream[: columns * length].reshape(columns, length)


class StreamStretches(Dataset):
    """Consecutive stretches of ``[B, n]`` streams: stretch ``i`` is ``inputs`` =
    ``streams[:, i*T : i*T + T]`` and ``targets`` the same shifted by one token; the last stretch
    may be shorter. Served in order (the model carries its state from one to the next).

    Args:
        streams: ``[B, n]`` token ids.
        bptt: ``T``, the tokens of a stretch.

    Example:
        >>> stretches = StreamStretches(torch.arange(1, 9).reshape(1, 8), bptt=3)
        >>> len(stretches), stretches[2]["inputs"].tolist(), stretches[2]["targets"].tolist()
        (3, [[7]], [[8]])
    """

    def __init__(self, streams: Tensor, bptt: int) -> None:
        self.streams = streams
        self.bptt = bptt

    def __len__(self) -> int:
        return -(-(self.streams.shape[1] - 1) // self.bptt)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.bptt
        stop = min(start + self.bptt, self.streams.shape[1] - 1)
        return {
            "inputs": self.streams[:, start:stop],
            "targets": self.streams[:, start + 1 : stop + 1],
        }


class LMDataModule(L.LightningDataModule):
    """Serves a corpus's three streams as stretches for truncated backpropagation through time.

    Each split's stream is laid out as contiguous columns (``batch_size`` for training,
    ``eval_batch_size`` for validation and test: :func:`batchify`) and served in order, ``bptt``
    tokens at a time (:class:`StreamStretches`): a batch is ``{"inputs": [B, T], "targets":
    [B, T]}``, and batch ``i + 1`` continues each column where batch ``i`` stopped, so the model
    carries its state across batches. Every token but each column's first is a target once.

    Args:
        source: where the corpus comes from (:class:`~recsys_midx.data.lm.TextCorpus` or
            :class:`~recsys_midx.data.lm.SyntheticCorpus`).
        data_dir: root of the processed Parquet cache.
        batch_size: columns of the training stream.
        eval_batch_size: columns of the validation and test streams.
        bptt: tokens per stretch: how far back the gradient flows.
        num_workers: data loader worker processes (0: a stretch is a slice, nothing to gain).

    Raises:
        ConfigError: if a size is not positive; from :meth:`setup`, if a split's columns are
            not longer than ``bptt``.

    Example:
        ```python
        dm = LMDataModule(SyntheticCorpus(), "/tmp/d", batch_size=20, bptt=35)
        dm.prepare_data(); dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))  # {"inputs": [20, 35], "targets": [20, 35]}
        ```
    """

    def __init__(
        self,
        source: CorpusSource,
        data_dir: str | Path,
        batch_size: int = 20,
        eval_batch_size: int = 10,
        bptt: int = 35,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        sizes = (("batch_size", batch_size), ("eval_batch_size", eval_batch_size), ("bptt", bptt))
        for setting, value in sizes:
            if value <= 0:
                raise ConfigError(f"task.datamodule.{setting}={value}: give a positive number")
        self.source = source
        self.data_dir = Path(data_dir)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.bptt = bptt
        self.num_workers = num_workers
        self.corpus: Corpus | None = None
        self.streams: dict[str, Tensor] = {}

    def prepare_data(self) -> None:
        self.source.prepare(self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.streams:
            return
        corpus = self.source.prepare(self.data_dir)
        streams = {}
        for split in SPLITS:
            columns = self.batch_size if split == "train" else self.eval_batch_size
            streams[split] = batchify(torch.from_numpy(corpus.streams[split]), columns)
            if streams[split].shape[1] <= self.bptt:
                setting = "batch_size" if split == "train" else "eval_batch_size"
                raise ConfigError(
                    f"task.datamodule.bptt={self.bptt} is not shorter than the {split} stream's "
                    f"{columns} columns of {streams[split].shape[1]} tokens: lower "
                    f"task.datamodule.bptt or task.datamodule.{setting}"
                )
        self.corpus, self.streams = corpus, streams

    def _corpus(self) -> Corpus:
        if self.corpus is None:
            raise RuntimeError("LMDataModule.setup() must run before the data is used")
        return self.corpus

    @property
    def num_items(self) -> int:
        """``V``: the vocabulary is the catalog the samplers and the softmax range over."""
        return self._corpus().num_tokens

    @property
    def item_counts(self) -> Tensor:
        """``[V+1]`` training occurrences of each token id (entry 0 is 0)."""
        return torch.from_numpy(self._corpus().counts)

    @property
    def encoder_sizes(self) -> dict[str, int]:
        """The size a language model is built with: ``num_items`` (the vocabulary)."""
        return {"num_items": self.num_items}

    @property
    def stats(self) -> dict[str, Any]:
        """The corpus's statistics (``stats.json``): its vocabulary and tokens per split."""
        return dict(self._corpus().stats, items=self.num_items)

    def _loader(self, split: str) -> DataLoader:
        if not self.streams:
            raise RuntimeError("LMDataModule.setup() must run before the data is used")
        # batch_size=None: each stretch already is a batch of columns.
        return DataLoader(
            StreamStretches(self.streams[split], self.bptt),
            batch_size=None,
            shuffle=False,
            num_workers=self.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
