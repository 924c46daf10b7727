"""What a negatives strategy takes and what it gives every loss.

A strategy (one module of this package each) sees a training batch's scaled queries, their
positives and, for sequences, the batch's windows (:class:`QueryBatch`), and draws from the
sampler's proposal, or from none; it returns :class:`Negatives`, the one structure every loss
reads. A loss is then a pure function of ``(head output, targets, item table, negatives)``:
it never meets the sampler.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor

from ..protocols import NegativeSampler
from .windows import SequenceWindows

#: How the ids of :class:`Negatives` relate to the queries: ``"catalog"``, every item, scored
#: exactly (no ids); ``"query"``, ``[Q, M]`` ids of each query's own; ``"batch"``, ``[M]`` ids
#: shared by every query; ``"sequence"``, ``[B, M]`` ids of each training sequence, shared by
#: its queries.
Scope = Literal["catalog", "query", "batch", "sequence"]
#: Every :data:`Scope`, in the order above.
SCOPES: tuple[Scope, ...] = ("catalog", "query", "batch", "sequence")


@dataclass(frozen=True)
class QueryBatch:
    """The training queries of a batch as a strategy sees them.

    Attributes:
        queries: ``[Q, D]`` scaled queries, or ``[Q, K, D]`` component queries of a mixture head.
        positives: ``[Q]`` target ids in ``1..N``, or ``[Q, P]`` positive ids padded with ``0``.
        windows: ``[B, W]`` the batch's training sequences (inputs and targets, padded with
            ``0``); ``None`` for a task without sequences.
        positions: ``[B, L]`` boolean mask of the query positions, row-major as the queries;
            given with ``windows``.
        num_items: ``N``, the catalog the ids come from (a strategy that draws without a
            sampler needs it).
    """

    queries: Tensor
    positives: Tensor
    windows: Tensor | None = None
    positions: Tensor | None = None
    num_items: int | None = None

    def sequences(self, name: str) -> SequenceWindows:
        """The batch's sequences and the sequence of each query.

        Args:
            name: the setting that needs them, as the user writes it, for the error.

        Raises:
            ValueError: naming ``name`` when the batch has no windows (a task without
                sequences).
        """
        if self.windows is None or self.positions is None:
            raise ValueError(f"{name} needs each batch's training sequences: it needs task=seqrec")
        return SequenceWindows.of_batch(self.windows, self.positions)


@dataclass(frozen=True)
class Negatives:
    """The negatives of a batch, in the one form every loss reads.

    Attributes:
        scope: how ``ids`` relate to the queries (:data:`Scope`).
        ids: the drawn ids in ``1..N`` (``0`` in a column that holds none): ``[Q, M]``,
            ``[M]`` or ``[B, M]`` by ``scope``; ``None`` for ``"catalog"``.
        log_q: the normalised ``log q`` of each id under the proposal that drew it, shaped like
            ``ids``, which the loss subtracts from its score (the logQ correction); ``None``
            where the loss reads ``log_weights`` instead, or where nothing is corrected
            (``"catalog"``, a uniform draw outside the window).
        positive_log_q: the ``log q`` the loss corrects each positive by, shaped like the
            positives: its ``log q`` under the proposal, or ``-log M`` where the positive is
            counted exactly (:func:`exact_positive_log_q`), ``-inf`` at padding; ``None`` where
            the positive is scored as it is (per-sequence draws) or never corrected.
        log_weights: the log of the weight each column's score gets in a per-sequence loss,
            shaped like ``ids``: ``-log(M q) + log c`` for a column holding ``c`` of the ``M``
            draws of one id from a proposal (the counts of repeated draws folded in); ``None``:
            no weight (a uniform draw outside the window, whose constant correction cancels) or
            corrected by ``log_q``.
        excluded: boolean, true where a column does not count for its queries: the drawn ids
            that fall in the query's training window (``[Q, M]`` for query and batch scopes),
            or the columns of a sequence that hold no valid draw (``[B, M]``); ``None``: every
            column counts.
        sequences: the batch's sequences and the sequence of each query, for per-sequence
            ids and for the exact softmax outside each window (``"catalog"``); ``None``
            otherwise.

    Example:
        >>> Negatives("catalog").ids is None
        True
    """

    scope: Scope
    ids: Tensor | None = None
    log_q: Tensor | None = None
    positive_log_q: Tensor | None = None
    log_weights: Tensor | None = None
    excluded: Tensor | None = None
    sequences: SequenceWindows | None = None

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"scope={self.scope}: choose one of {', '.join(SCOPES)}")
        if (self.ids is None) != (self.scope == "catalog"):
            wants = "needs" if self.ids is None else "takes no"
            raise ValueError(f"scope={self.scope} {wants} ids")

    @property
    def num_drawn(self) -> int:
        """``M``: the columns each query is scored against (0 for the catalog scope)."""
        return 0 if self.ids is None else self.ids.shape[-1]


class Strategy(torch.nn.Module, abc.ABC):
    """Base of the package's strategies (:class:`~recsys_midx.protocols.NegativesStrategy`): a
    plain torch module that declares its name, scope and needs and implements :meth:`forward`.

    A strategy whose positive is always scored as it is leaves :meth:`counts_positives_exactly`
    as it is here; the log-q-corrected ones
    (:class:`~recsys_midx.negatives.corrected.LogQCorrected`) override it.
    """

    #: The strategy's name, as the ``negatives`` config group spells it.
    name: ClassVar[str]
    #: How the ids it returns relate to the queries.
    scope: ClassVar[Scope]
    #: Whether it draws from the sampler (no sampler is built for one that does not).
    uses_sampler: ClassVar[bool]
    #: Whether it reads each batch's training sequences.
    needs_windows: bool = False

    def counts_positives_exactly(self, sampler: NegativeSampler | None) -> bool | None:
        """``None``: the strategy leaves no choice of how a loss counts the positive."""
        return None

    def proposal(self, sampler: NegativeSampler | None) -> NegativeSampler:
        """The sampler a strategy that draws from one (``uses_sampler``) draws from.

        Raises:
            ValueError: naming the strategy, without a sampler.
        """
        if sampler is None:
            raise ValueError(f"negatives={self.name} draws from a sampler: give one")
        return sampler

    @abc.abstractmethod
    def forward(
        self, batch: QueryBatch, sampler: NegativeSampler | None, with_positive_log_q: bool = True
    ) -> Negatives:
        """The batch's negatives (:class:`~recsys_midx.protocols.NegativesStrategy`)."""


def exact_positive_log_q(positives: Tensor, num_drawn: int) -> Tensor:
    """The ``log q`` that makes a sampled loss count its positives exactly: ``-log M``.

    With it the positive's corrected logit ``s_p - log q_p`` is ``s_p + log M``; shifting all
    corrected logits by ``-log M`` (the loss does not change) gives ``o_p = s_p`` and
    ``o_j = s_j - log(M q_j)``: the normaliser is ``exp(s_p)`` plus the importance-sampling
    estimate of the sum over the other items, whose draws of the positive (accidental hits) are
    masked because it is already counted.

    Args:
        positives: ``[Q]`` target ids, or ``[Q, P]`` positive ids padded with ``0``.
        num_drawn: negatives drawn per query, ``M``.

    Returns:
        float32 tensor shaped like ``positives``: ``-log M``, ``-inf`` at padding.

    Example:
        >>> exact_positive_log_q(torch.tensor([[3, 0]]), 4)
        tensor([[-1.3863,    -inf]])
    """
    return torch.where(positives > 0, -math.log(num_drawn), -math.inf).float()


def real_positives(positives: Tensor) -> Tensor:
    """The positives a sampler observes before drawing (:meth:`observe_targets`): a ``[Q]``
    target vector as it is, without the host synchronisation of a boolean mask; a padded
    ``[Q, P]`` matrix without its padding."""
    return positives if positives.dim() == 1 else positives[positives > 0]
