"""Sequence encoders: a batch of item sequences -> query vectors."""

from recsys_midx.models.base import SequenceEncoder
from recsys_midx.models.gru4rec import GRU4Rec
from recsys_midx.models.sasrec import SASRec

__all__ = ["GRU4Rec", "SASRec", "SequenceEncoder"]
