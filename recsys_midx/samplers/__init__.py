"""Negative samplers: the :class:`Sampler` protocol and its implementations."""

from .base import Sampler
from .candidate_pool import CandidatePoolSampler
from .diagnostics import proposal_divergence
from .dns import DNSSampler
from .inbatch import InBatchSampler
from .kernel import KernelSampler
from .lsh import LSHSampler
from .midx import MIDXSampler
from .popularity import PopularitySampler
from .sir import SIRSampler
from .uniform import UniformSampler

__all__ = [
    "CandidatePoolSampler",
    "DNSSampler",
    "InBatchSampler",
    "KernelSampler",
    "LSHSampler",
    "MIDXSampler",
    "PopularitySampler",
    "SIRSampler",
    "Sampler",
    "UniformSampler",
    "proposal_divergence",
]
