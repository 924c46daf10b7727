"""Dataset sources: each knows how to obtain one family of raw interaction data."""

from recsys_midx.data.sources.amazon import Amazon
from recsys_midx.data.sources.base import Source
from recsys_midx.data.sources.custom import Custom
from recsys_midx.data.sources.gowalla import Gowalla
from recsys_midx.data.sources.lastfm import LastFM1K
from recsys_midx.data.sources.movielens import MovieLens
from recsys_midx.data.sources.remote import RemoteSource
from recsys_midx.data.sources.steam import Steam
from recsys_midx.data.sources.synthetic import Synthetic
from recsys_midx.data.sources.yelp import Yelp

__all__ = [
    "Amazon",
    "Custom",
    "Gowalla",
    "LastFM1K",
    "MovieLens",
    "RemoteSource",
    "Source",
    "Steam",
    "Synthetic",
    "Yelp",
]
