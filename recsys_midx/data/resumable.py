"""A training data loader whose order depends only on the seed and the epoch, and which resumes
an interrupted epoch at the batch where it stopped.

Lightning calls ``set_epoch`` on a loader's sampler before each training epoch, saves the
``state_dict`` of a training loader that has one in every checkpoint, and, when a run resumes in
the middle of an epoch, hands it back to ``load_state_dict`` before the first batch is drawn.
:class:`EpochShuffle` and :class:`ResumableLoader` use those hooks so that a resumed run sees
exactly the batches the interrupted one would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

#: Indices converted to Python integers at a time by :class:`EpochShuffle`.
_CHUNK = 1 << 16


class EpochShuffle(RandomSampler):
    """A random order of ``0..n-1`` drawn from ``seed + epoch`` alone, like Lightning's
    distributed sampler.

    The global random state is never used (dropout and negative sampling consume it, so a
    resumed run could not replay it), and no state but the epoch is needed to replay an
    epoch's order. It is a :class:`~torch.utils.data.RandomSampler`, so Lightning recognises a
    shuffled loader and, for distributed training, replaces it with its own distributed
    sampler (seeded by ``L.seed_everything``, also ordered by epoch).

    Args:
        data_source: what is indexed (only its length is used).
        seed: base seed of the orders.

    Example:
        >>> sampler = EpochShuffle(range(5), seed=0)
        >>> sampler.set_epoch(3)
        >>> list(sampler) == list(sampler)
        True
    """

    def __init__(self, data_source: Sized, seed: int) -> None:
        super().__init__(data_source)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the order of ``epoch`` for the next iteration."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        # Seeds are 64-bit: an unseeded process's initial seed may use all of them.
        generator = torch.Generator().manual_seed((self.seed + self.epoch) % 2**64)
        order = torch.randperm(len(self.data_source), generator=generator)
        # Handed out in chunks: a Python list of every index (one per training sample, possibly
        # one per interaction) would take several times the tensor's memory.
        for chunk in order.split(_CHUNK):
            yield from chunk.tolist()


class ResumableLoader(DataLoader):
    """A :class:`~torch.utils.data.DataLoader` that resumes an epoch at the batch it stopped.

    With ``shuffle=True`` (and no sampler) the order comes from an :class:`EpochShuffle` seeded
    with :func:`torch.initial_seed`, i.e. the seed set by ``L.seed_everything``; the loader's
    ``generator`` (the workers' base seed) is seeded alike, so creating an iterator never draws
    from the global random state. Otherwise it takes :class:`~torch.utils.data.DataLoader`'s
    arguments unchanged, so Lightning can rebuild it with another sampler (as it does for
    distributed training).

    The underlying iterator is created when the first batch is requested, not by ``iter()``:
    Lightning calls ``iter()`` before it sets the sampler's epoch, and a multi-process iterator
    would draw its indices at once. :meth:`state_dict` records the sampler's epoch and the
    batches yielded in it; :meth:`load_state_dict` makes the next iteration skip those batches
    (they are drawn and dropped, so this holds for any sampler whose order depends only on the
    epoch). An epoch counts as unfinished while fewer than ``len(loader)`` batches were yielded,
    so an epoch cut short by Lightning's ``limit_train_batches`` resumes as an unfinished one.

    Example:
        >>> loader = ResumableLoader(range(10), batch_size=4, shuffle=True)
        >>> iterator = iter(loader)
        >>> first = next(iterator)
        >>> state = loader.state_dict()  # saved in a checkpoint
        >>> resumed = ResumableLoader(range(10), batch_size=4, shuffle=True)
        >>> resumed.load_state_dict(state)
        >>> [batch.tolist() for batch in resumed] == [batch.tolist() for batch in iterator]
        True
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("shuffle") and kwargs.get("sampler") is None:
            dataset = args[0] if args else kwargs["dataset"]
            seed = torch.initial_seed()
            kwargs["shuffle"] = False
            kwargs["sampler"] = EpochShuffle(dataset, seed)
            if kwargs.get("generator") is None:
                kwargs["generator"] = torch.Generator().manual_seed(seed)
        super().__init__(*args, **kwargs)
        self._batches_yielded = 0
        self._skip = 0

    def __iter__(self) -> Iterator[Any]:
        skip, self._skip = self._skip, 0
        # Batches skipped on resumption count as done: the epoch had yielded them.
        self._batches_yielded = skip
        return self._batches(skip)

    def _batches(self, skip: int) -> Iterator[Any]:
        iterator = super().__iter__()
        for _ in range(skip):
            if next(iterator, None) is None:
                return
        for batch in iterator:
            self._batches_yielded += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Where the current epoch stands.

        Returns:
            ``{"epoch", "batches_yielded"}``: the sampler's epoch (``None`` for a sampler
            without ``set_epoch``) and the batches yielded in it so far.
        """
        return {
            "epoch": getattr(self.sampler, "epoch", None),
            "batches_yielded": self._batches_yielded,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Make the next iteration continue the epoch recorded by :meth:`state_dict`.

        Args:
            state_dict: what :meth:`state_dict` returned.
        """
        done = int(state_dict["batches_yielded"])
        self._skip = done if 0 < done < len(self) else 0
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if state_dict["epoch"] is not None and callable(set_epoch):
            set_epoch(state_dict["epoch"])
