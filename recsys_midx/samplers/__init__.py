"""Negative samplers: the :class:`Sampler` protocol and its implementations."""

from .base import Sampler
from .candidate_pool import CandidatePoolSampler
from .diagnostics import proposal_divergence
from .dns import DNSSampler
from .full import FullSampler
from .inbatch import InBatchSampler
from .kernel import KernelSampler
from .lsh import LSHSampler
from .midx import MIDXSampler
from .popularity import PopularitySampler
from .registry import sampler_class, sampler_classes
from .sir import SIRSampler
from .uniform import UniformSampler

__all__ = [
    "CandidatePoolSampler",
    "DNSSampler",
    "FullSampler",
    "InBatchSampler",
    "KernelSampler",
    "LSHSampler",
    "MIDXSampler",
    "PopularitySampler",
    "SIRSampler",
    "Sampler",
    "UniformSampler",
    "proposal_divergence",
    "sampler_class",
    "sampler_classes",
]
