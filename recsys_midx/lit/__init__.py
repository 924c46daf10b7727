"""Lightning modules and callbacks: they wire encoders, samplers and losses together."""

from recsys_midx.lit.seqrec import SeqRecModule

__all__ = ["SeqRecModule"]
