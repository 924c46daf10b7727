"""Training samples of sequential recommendation: which windows of the training sequences an
epoch trains on (the ``task.datamodule.train_samples`` setting).

- ``last_window``: one sample per user, its last ``max_len + 1`` training items; every position
  predicts the next item. Items before that window are never a target.
- ``windows``: windows of ``max_len + 1`` items ending at the sequence's end and every
  ``stride`` items before it, down to the one that holds the sequence's first item, so every
  training target is a target at least once per epoch; every position is a query.
- ``prefixes``: one sample per training target (every training item but a user's first): the
  up to ``max_len`` items before it are the input and only the last position is a query.

Samples are never materialised: sample ``i`` is found from per-row sample counts (a cumulative
sum, searched with :func:`numpy.searchsorted`) when its batch is made, and its window is cut
from the split's flat item array. Memory is one ``int64`` per training row, whatever the number
of samples.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import torch
from torch import Tensor

from recsys_midx.data.splits import Spans
from recsys_midx.errors import ConfigError

#: The values of ``task.datamodule.train_samples``.
SampleKind = Literal["last_window", "windows", "prefixes"]
SAMPLE_KINDS: tuple[str, ...] = get_args(SampleKind)


def check_sample_kind(kind: str, stride: int | None, max_len: int) -> None:
    """Refuse an unknown construction, or a window stride that would skip training targets.

    Args:
        kind: the value of ``task.datamodule.train_samples``.
        stride: the value of ``task.datamodule.window_stride`` (``None``: ``max_len``).
        max_len: longest input sequence.

    Raises:
        ConfigError: ``kind`` is not one of :data:`SAMPLE_KINDS`, or ``stride`` is not in
            ``1..max_len``.

    Example:
        >>> check_sample_kind("windows", stride=None, max_len=50)
    """
    if kind not in SAMPLE_KINDS:
        raise ConfigError(
            f"task.datamodule.train_samples={kind}: give one of {', '.join(SAMPLE_KINDS)}"
        )
    if stride is not None and not 1 <= stride <= max_len:
        raise ConfigError(
            f"task.datamodule.window_stride={stride}: give 1..max_len ({max_len}) so that "
            "windows leave no training target out"
        )


def left_padded_windows(
    items: np.ndarray, starts: np.ndarray, ends: np.ndarray, width: int
) -> np.ndarray:
    """The last ``width`` items of each ``items[start:end]``, left-padded with 0: ``[B, width]``.

    Example:
        >>> left_padded_windows(np.array([5, 6, 7]), np.array([0]), np.array([2]), 3)
        array([[0, 5, 6]])
    """
    index = ends[:, None] - width + np.arange(width)[None, :]
    return np.where(index >= starts[:, None], items[np.maximum(index, 0)], 0)


class TrainSamples:
    """The training samples of one epoch, indexed ``0..len - 1`` (see the module docstring).

    A sample is a window ``items[max(start, end - max_len - 1):end]`` of one training row's
    span ``items[start:stop]``; :meth:`batch` cuts the windows of a batch of sample indices.
    Within a row, sample ``k`` ends at ``stop - k * stride`` (``last_window``, ``windows``) or
    at ``start + 2 + k`` (``prefixes``).

    Args:
        items: the split's flat item array.
        spans: the training spans (``split.spans("train")``); no other item is ever read.
        max_len: longest input sequence.
        kind: one of :data:`SAMPLE_KINDS`.
        stride: items between consecutive windows' ends (``windows`` only; ``None``:
            ``max_len``).

    Raises:
        ConfigError: see :func:`check_sample_kind`.

    Example:
        >>> spans = Spans(np.array([0]), np.array([4]))
        >>> samples = TrainSamples(np.array([1, 2, 3, 4]), spans, max_len=2, kind="prefixes")
        >>> len(samples), samples.batch(np.array([2]))["targets"].tolist()
        (3, [[4]])
    """

    def __init__(
        self,
        items: np.ndarray,
        spans: Spans,
        max_len: int,
        kind: str = "last_window",
        stride: int | None = None,
    ) -> None:
        check_sample_kind(kind, stride, max_len)
        self.items, self.max_len, self.kind = items, max_len, kind
        self.stride = max_len if stride is None else stride
        self.starts, self.stops = spans.starts, spans.ends
        lengths = self.stops - self.starts
        width = max_len + 1
        if kind == "windows":
            # Enough windows, ``stride`` apart, that the earliest starts at the span's start.
            counts = 1 + -(-np.maximum(lengths - width, 0) // self.stride)
        elif kind == "prefixes":
            counts = np.maximum(lengths - 1, 0)
        else:
            counts = np.ones(len(lengths), dtype=np.int64)
        # first[r]: index of row r's first sample; first[-1]: the number of samples.
        self.first = np.r_[0, np.cumsum(counts)].astype(np.int64)

    def __len__(self) -> int:
        return int(self.first[-1])

    def locate(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The training row and the window end (exclusive, in ``items``) of each sample.

        Args:
            samples: ``int [B]`` sample indices in ``0..len - 1``.

        Returns:
            ``(rows, ends)``, both ``int64 [B]``.
        """
        samples = np.asarray(samples, dtype=np.int64)
        if self.kind == "last_window":  # one sample per row: no search on the default path
            return samples, self.stops[samples]
        rows = np.searchsorted(self.first, samples, side="right") - 1
        k = samples - self.first[rows]
        if self.kind == "prefixes":
            return rows, self.starts[rows] + 2 + k
        return rows, self.stops[rows] - k * self.stride

    def batch(self, samples: np.ndarray) -> dict[str, Tensor]:
        """``inputs`` ``int64 [B, max_len]`` and next-item ``targets`` of samples ``samples``.

        Each window is left-padded with 0; ``targets`` is ``inputs`` shifted by one position,
        ``[B, max_len]``, except for ``prefixes``, whose ``targets`` ``[B, 1]`` is the item
        after the last input position only: the training step then encodes that position only.

        Args:
            samples: ``int [B]`` sample indices in ``0..len - 1``.

        Returns:
            ``{"inputs", "targets"}``.
        """
        rows, ends = self.locate(samples)
        window = left_padded_windows(self.items, self.starts[rows], ends, self.max_len + 1)
        targets = window[:, -1:] if self.kind == "prefixes" else window[:, 1:]
        return {"inputs": torch.from_numpy(window[:, :-1]), "targets": torch.from_numpy(targets)}
