"""Negatives: the stage between the head and the loss that draws each batch's negatives.

A strategy takes the batch's scaled queries, positives and windows (:class:`QueryBatch`) and the
sampler's proposal, and returns :class:`Negatives`, the one structure every loss reads: per
query (:class:`PerQuery`, the default), shared by the batch (:class:`SharedByBatch`), per
sequence outside its window (:class:`OutsideWindow`), per sequence from the proposal
(:class:`PerSequence`), or none, the exact softmax (:class:`NoNegatives`). Each is one module
with one config in ``recsys_midx/conf/negatives``.
"""

from .base import SCOPES, Negatives, QueryBatch, Scope, exact_positive_log_q
from .none import NoNegatives
from .outside_window import OutsideWindow, draw_outside_windows
from .per_query import PerQuery, draw_mixture_negatives, draw_negatives
from .per_sequence import PerSequence, draw_from_proposal, merge_repeated_draws
from .shared import SharedByBatch, draw_shared_negatives
from .windows import SequenceWindows, sequence_hits, window_hits

__all__ = [
    "SCOPES",
    "Negatives",
    "NoNegatives",
    "OutsideWindow",
    "PerQuery",
    "PerSequence",
    "QueryBatch",
    "Scope",
    "SequenceWindows",
    "SharedByBatch",
    "draw_from_proposal",
    "draw_mixture_negatives",
    "draw_negatives",
    "draw_outside_windows",
    "draw_shared_negatives",
    "exact_positive_log_q",
    "merge_repeated_draws",
    "sequence_hits",
    "window_hits",
]
