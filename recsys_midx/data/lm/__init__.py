"""Language-modelling data: a corpus's vocabulary and token streams, cached as Parquet, served
as stretches for truncated backpropagation through time.

:class:`TextCorpus` reads three tokenised files (Penn Treebank, WikiText-2, or any corpus laid out
the same way: ``dataset=ptb``, ``dataset=wikitext-2``); :class:`SyntheticCorpus` generates one
(``task=lm``'s offline default); :class:`LMDataModule` serves them.
"""

from recsys_midx.data.lm.corpus import (
    SPLITS,
    BuiltCorpus,
    Corpus,
    CorpusSource,
    TextCorpus,
    load_corpus,
)
from recsys_midx.data.lm.datamodule import LMDataModule, StreamStretches, batchify
from recsys_midx.data.lm.synthetic import SyntheticCorpus

__all__ = [
    "SPLITS",
    "BuiltCorpus",
    "Corpus",
    "CorpusSource",
    "LMDataModule",
    "StreamStretches",
    "SyntheticCorpus",
    "TextCorpus",
    "batchify",
    "load_corpus",
]
