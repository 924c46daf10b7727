"""Top-k softmax inference over a class or item table: exact and AdaptiveSoftmax.

Recommendations of a trained run in raw ids are in :mod:`recsys_midx.inference.recommend`
(``recsys_midx.recommend``), the export of its item vectors and a faiss index in
:mod:`recsys_midx.inference.export`; both are command-line modules, imported on demand.
"""

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
