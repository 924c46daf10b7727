"""Negative samplers: the :class:`Sampler` protocol and its implementations."""

from .base import Sampler
from .diagnostics import proposal_divergence
from .full import FullSampler
from .inbatch import InBatchSampler
from .kernel import KernelSampler
from .lsh import LSHSampler
from .midx import MIDXSampler
from .popularity import PopularitySampler
from .uniform import UniformSampler

__all__ = [
    "FullSampler",
    "InBatchSampler",
    "KernelSampler",
    "LSHSampler",
    "MIDXSampler",
    "PopularitySampler",
    "Sampler",
    "UniformSampler",
    "proposal_divergence",
]
