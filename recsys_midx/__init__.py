"""recsys_midx: sampled-softmax recommenders and extreme classifiers with MIDX samplers."""

__version__ = "0.1.0"
