"""The largest tensor torch allocates while a block of code runs, for tests of memory bounds."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LargestAllocation(TorchDispatchMode):
    """Records the largest storage that an operator creates while the mode is active.

    An output that shares storage with an input (a view, an in-place or ``out=`` result) creates
    nothing and is not counted, so a slice of a large table counts as nothing while a copy of it
    counts in full.

    Attributes:
        nbytes: bytes of the largest new storage so far.
        shape: shape of the tensor that created it.
        op: name of the operator that created it.

    Example:
        >>> import torch
        >>> table = torch.zeros(1000, 8)
        >>> with LargestAllocation() as largest:
        ...     block = table[:10] * 2
        >>> largest.nbytes, largest.shape
        (320, (10, 8))
    """

    def __init__(self) -> None:
        super().__init__()
        self.nbytes, self.shape, self.op = 0, (), ""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, Tensor)
        }
        for t in tree_leaves(out):
            if isinstance(t, Tensor) and t.untyped_storage().data_ptr() not in inputs:
                nbytes = t.untyped_storage().nbytes()
                if nbytes > self.nbytes:
                    self.nbytes, self.shape, self.op = nbytes, tuple(t.shape), str(func)
        return out
