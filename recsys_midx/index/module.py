"""The base of every module whose state is an index rebuilt from data and kept in buffers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


class IndexModule(torch.nn.Module):
    """A module whose state is an index rebuilt from data, kept in buffers.

    Two departures from ``torch.nn.Module``:

    * ``load_state_dict`` normally refuses tensors whose shape differs from the local buffer; here
      a buffer first takes the incoming shape and dtype (on its own device), so a checkpoint loads
      into a freshly constructed, never-built module.
    * Module-wide dtype casts (``.to(torch.bfloat16)``, ``.half()``, as done by "true" low
      precision training) move buffers but keep their dtypes: a bf16 cumulative weight table or
      codebook would silently coarsen the proposal and its ``log q``.

    Example:
        >>> class Table(IndexModule):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.register_buffer("rows", torch.empty(0))
        >>> built = Table()
        >>> built.rows = torch.arange(3.0)
        >>> fresh = Table()
        >>> fresh.load_state_dict(built.state_dict())
        <All keys matched successfully>
        >>> fresh.half().rows.dtype
        torch.float32
    """

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> IndexModule:
        def keep_dtype(t: Tensor) -> Tensor:
            if not t.is_floating_point():
                return fn(t)
            if t.dim() == 0:
                return fn(t).to(t.dtype)
            # A byte view is not floating point, so casts skip it while device moves still apply.
            return fn(t.view(torch.uint8)).view(t.dtype)

        return super()._apply(keep_dtype, recurse)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        for name, buf in self._buffers.items():
            incoming = state_dict.get(prefix + name)
            if buf is None or not isinstance(incoming, Tensor):
                continue
            if incoming.shape != buf.shape or incoming.dtype != buf.dtype:
                self._buffers[name] = torch.empty(
                    incoming.shape, dtype=incoming.dtype, device=buf.device
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
