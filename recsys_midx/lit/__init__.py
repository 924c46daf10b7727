"""Lightning modules and callbacks: they wire encoders, samplers and losses together."""

from recsys_midx.lit.base import CatalogModule
from recsys_midx.lit.lm import LMModule
from recsys_midx.lit.seqrec import SeqRecModule
from recsys_midx.lit.xc import XCModule

__all__ = ["CatalogModule", "LMModule", "SeqRecModule", "XCModule"]
