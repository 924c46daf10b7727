"""Encoders: a batch (item sequences, sparse feature vectors, a token stream) -> query vectors."""

from recsys_midx.models.base import ItemTables, SequenceEncoder
from recsys_midx.models.bert4rec import BERT4Rec
from recsys_midx.models.gru4rec import GRU4Rec
from recsys_midx.models.lstm_lm import LSTMLanguageModel
from recsys_midx.models.sasrec import SASRec
from recsys_midx.models.xc_mlp import XCEncoder

__all__ = [
    "BERT4Rec",
    "GRU4Rec",
    "ItemTables",
    "LSTMLanguageModel",
    "SASRec",
    "SequenceEncoder",
    "XCEncoder",
]
