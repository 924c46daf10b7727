"""Top-k softmax inference over a class or item table: exact and AdaptiveSoftmax.

Plain torch: nothing here loads Lightning or Hydra. Recommendations of a trained run in raw ids
(:mod:`recsys_midx.app.recommend`, ``recsys_midx.recommend``) and the export of its item vectors
and a faiss index (:mod:`recsys_midx.app.export`) are commands of the application layer; the
inner-product faiss indexes the export builds and measures (:mod:`recsys_midx.inference.ann`)
and its TorchScript query encoder (:mod:`recsys_midx.inference.query_encoder`) live here, imported
from their modules.
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
