"""Dataset sources: each knows how to obtain one family of raw interaction data."""

from recsys_midx.data.sources.base import Source
from recsys_midx.data.sources.movielens import MovieLens
from recsys_midx.data.sources.synthetic import Synthetic

__all__ = ["MovieLens", "Source", "Synthetic"]
