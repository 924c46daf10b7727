"""Negative samplers: the :class:`Sampler` protocol and its implementations."""

from .base import Sampler
from .full import FullSampler
from .popularity import PopularitySampler
from .uniform import UniformSampler

__all__ = ["FullSampler", "PopularitySampler", "Sampler", "UniformSampler"]
