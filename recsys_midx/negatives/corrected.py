"""What the two strategies whose negatives a loss logQ-corrects share: how the positive is
counted, and the window each query's normaliser may leave out.

:class:`~recsys_midx.negatives.PerQuery` and :class:`~recsys_midx.negatives.SharedByBatch`
subclass :class:`LogQCorrected` and implement :meth:`LogQCorrected.draw`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

from torch import Tensor

from ..protocols import NegativeSampler
from .base import Negatives, QueryBatch, Strategy
from .windows import window_hits


class LogQCorrected(Strategy):
    """Base of the strategies that draw ``sampler.num_negatives`` ids from the proposal with
    their normalised ``log q``, for the logQ correction ``o = s - log q``.

    Args:
        correct_positive: how a sampled loss counts the positive in its normaliser. ``True``:
            like a negative, ``o_p = s_p - log q(p)`` (the usual logQ correction). ``False``:
            exactly, ``o_p = s_p`` with ``o_j = s_j - log(M q_j)`` for the negatives (see
            :func:`~recsys_midx.negatives.exact_positive_log_q`). Both estimate the same
            normaliser, but the first weighs the positive by ``1 / (M q(p))``: where the model
            puts much of its mass on the positive and the proposal does not (``q(p) << p(p)``,
            as for a proposal that follows a peaked softmax only coarsely), the positive
            dominates the estimate and its gradient ``-(1 - p(p))`` shrinks towards 0. Counted
            exactly, it does not depend on ``q(p)``. ``None``: as the sampler prefers
            (``not sampler.prefers_exact_positives``; exactly only for MIDX with top cells).
        exclude_window: leave each query's training-sequence items other than its target out
            of its normaliser: the drawn ids that fall in the query's window are marked
            ``excluded`` (sequences only, ``task=seqrec``).
    """

    uses_sampler: ClassVar[bool] = True

    def __init__(self, correct_positive: bool | None = None, exclude_window: bool = False) -> None:
        super().__init__()
        self.correct_positive = None if correct_positive is None else bool(correct_positive)
        self.exclude_window = self.needs_windows = bool(exclude_window)

    def counts_positives_exactly(self, sampler: NegativeSampler | None) -> bool:
        """Whether the positive is counted exactly with ``sampler``: as set, or as the sampler
        prefers when ``correct_positive`` is ``None``."""
        if self.correct_positive is None:
            return bool(sampler is not None and sampler.prefers_exact_positives)
        return not self.correct_positive

    def forward(
        self, batch: QueryBatch, sampler: NegativeSampler | None, with_positive_log_q: bool = True
    ) -> Negatives:
        """The batch's negatives, drawn from ``sampler``.

        Args:
            batch: the scaled queries, their positives, and with ``exclude_window`` the
                batch's windows.
            sampler: the proposal, built.
            with_positive_log_q: compute the positives' ``log q`` where they are corrected by
                it; ``False`` for a loss that never corrects (binary cross-entropy), which
                then gets ``-log M``.

        Raises:
            ValueError: without a sampler; with ``exclude_window``, without the windows.
        """
        sampler = self.proposal(sampler)
        sequences = (
            batch.sequences("negatives.exclude_window=true") if self.exclude_window else None
        )
        exact = not with_positive_log_q or self.counts_positives_exactly(sampler)
        drawn = self.draw(sampler, batch.queries, batch.positives, exact)
        if sequences is None:
            return drawn
        return dataclasses.replace(
            drawn, excluded=window_hits(drawn.ids, sequences), sequences=sequences
        )

    @abc.abstractmethod
    def draw(
        self, sampler: NegativeSampler, queries: Tensor, positives: Tensor, exact_positives: bool
    ) -> Negatives:
        """Draw for ``[Q, D]`` (or ``[Q, K, D]``) scaled ``queries`` and their ``positives``;
        ``exact_positives`` gives the positives :func:`exact_positive_log_q`."""

    def extra_repr(self) -> str:
        return f"correct_positive={self.correct_positive}, exclude_window={self.exclude_window}"
