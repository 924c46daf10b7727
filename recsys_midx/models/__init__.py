"""Encoders: a batch (item sequences, sparse feature vectors) -> query vectors."""

from recsys_midx.models.base import SequenceEncoder
from recsys_midx.models.bert4rec import BERT4Rec
from recsys_midx.models.gru4rec import GRU4Rec
from recsys_midx.models.sasrec import SASRec
from recsys_midx.models.xc_mlp import XCEncoder

__all__ = ["BERT4Rec", "GRU4Rec", "SASRec", "SequenceEncoder", "XCEncoder"]
