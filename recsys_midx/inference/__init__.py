"""Top-k softmax inference over a class or item table: exact and AdaptiveSoftmax."""

from .adaptive_softmax import AdaptiveSoftmax, adaptive_softmax_topk
from .exact import exact_softmax_topk
from .result import TopKResult
from .seqrec import ItemTableTopK

__all__ = [
    "AdaptiveSoftmax",
    "ItemTableTopK",
    "TopKResult",
    "adaptive_softmax_topk",
    "exact_softmax_topk",
]
