"""A trained sequential encoder and its head as one TorchScript function: history in, query out.

:func:`trace_query_encoder` turns a :class:`~recsys_midx.models.base.SequenceEncoder` and a
single-query head into a TorchScript module that maps ``[B, L]`` left-padded internal item ids to
the ``[B, D]`` ranking queries (the head's projection applied, the temperature not: the
temperature does not change the ranking, and the inner product of the query with an item vector
is then the score :func:`recsys_midx.recommend` reports). A saved module loads with
``torch.jit.load`` alone, without this package.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from recsys_midx.heads import Head
from recsys_midx.models.base import SequenceEncoder

__all__ = ["QueryEncoder", "trace_query_encoder"]


class QueryEncoder(nn.Module):
    """The ranking query after a history: ``head.queries(encoder.encode_last(item_seq))``.

    Args:
        encoder: the trained sequence encoder.
        head: a head with one query per context (not a mixture of softmaxes).

    Example:
        >>> from recsys_midx.heads import DotHead
        >>> from recsys_midx.models import GRU4Rec
        >>> encoder = QueryEncoder(GRU4Rec(num_items=9, dim=4, max_len=5), DotHead())
        >>> encoder(torch.tensor([[0, 0, 3, 1, 7]])).shape
        torch.Size([1, 4])
    """

    def __init__(self, encoder: SequenceEncoder, head: Head) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, item_seq: Tensor) -> Tensor:
        """``[B, L]`` left-padded internal item ids (0: padding) -> ``[B, D]`` queries."""
        return self.head.queries(self.encoder.encode_last(item_seq))[0]


@torch.no_grad()
def trace_query_encoder(encoder: SequenceEncoder, head: Head) -> torch.jit.ScriptModule:
    """Trace the encoder and head into TorchScript, for ``[B, max_len]`` histories on the CPU.

    Tracing records the operations of one call, so the module is traced in eval mode on the
    CPU for histories of exactly ``encoder.max_len`` items (pad on the left with 0, keep the last
    ``max_len``), then checked against the eager module on another batch size: a traced shape
    that did not generalise would fail here rather than in a service.

    Args:
        encoder: the trained encoder, on the CPU (it is put in eval mode).
        head: its single-query head, on the CPU.

    Returns:
        The traced module; ``torch.jit.save`` writes it.

    Raises:
        ValueError: if the head gives several queries per history, the encoder or head is
            not on the CPU, or the traced module does not reproduce the eager one.

    Example:
        >>> from recsys_midx.heads import DotHead
        >>> from recsys_midx.models import SASRec
        >>> sasrec = SASRec(num_items=9, dim=8, num_heads=2, max_len=5)
        >>> traced = trace_query_encoder(sasrec, DotHead())
        >>> traced(torch.tensor([[0, 0, 3, 1, 7]])).shape
        torch.Size([1, 8])
    """
    module = QueryEncoder(encoder, head).eval()
    if any(p.device.type != "cpu" for p in module.parameters()):
        raise ValueError("the query encoder is traced on the CPU: move the module there first")
    generator = torch.Generator().manual_seed(0)
    example = torch.randint(1, encoder.num_items + 1, (2, encoder.max_len), generator=generator)
    example[1, : encoder.max_len // 2] = 0  # a padded history too
    if module(example).dim() != 2:
        raise ValueError(f"head={head.name} gives several queries per history: not exportable")
    with warnings.catch_warnings():
        # The tracer warns about Python-level shape checks and the unpacking of the fused
        # attention projection; both are fixed by max_len and the model, and the check below
        # compares the traced module with the eager one.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(module, example, check_trace=False)
    check = torch.randint(1, encoder.num_items + 1, (5, encoder.max_len), generator=generator)
    check[:, 0] = 0
    if not torch.allclose(traced(check), module(check), rtol=1e-5, atol=1e-6):
        raise ValueError("the traced query encoder does not reproduce the encoder")
    return traced
