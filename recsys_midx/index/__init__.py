"""Indexes rebuilt from an item table: quantisation codebooks, faiss k-means, buffer-held state.

The MIDX samplers and the EDRep loss build their proposals and cluster statistics on these.
"""

from .codebooks import (
    QUANTIZERS,
    Codebooks,
    ProductCodebooks,
    ResidualCodebooks,
    make_codebooks,
    nearest_codeword,
)
from .kmeans import kmeans
from .module import IndexModule

__all__ = [
    "QUANTIZERS",
    "Codebooks",
    "IndexModule",
    "ProductCodebooks",
    "ResidualCodebooks",
    "kmeans",
    "make_codebooks",
    "nearest_codeword",
]
