"""The package's samplers, for code that meets them by name: a config's ``_target_``."""

from __future__ import annotations

import inspect

from recsys_midx.samplers.base import Sampler


def sampler_classes() -> tuple[type[Sampler], ...]:
    """Every concrete sampler that :mod:`recsys_midx.samplers` exports (its ``__all__``).

    Example:
        >>> [cls.family for cls in sampler_classes()][:3]
        ['dns', 'full', 'inbatch']
    """
    from recsys_midx import samplers  # the package imports this module: import it once built

    exported = (getattr(samplers, name) for name in samplers.__all__)
    return tuple(
        cls
        for cls in exported
        if isinstance(cls, type) and issubclass(cls, Sampler) and not inspect.isabstract(cls)
    )


def sampler_class(target: str) -> type[Sampler] | None:
    """The package's sampler named by ``target``, or ``None`` for one from elsewhere.

    Only the class name is compared, so the config of a run recorded before a sampler moved
    between modules still finds it.

    Args:
        target: a config's ``_target_``, e.g. ``recsys_midx.samplers.MIDXSampler``.

    Returns:
        The class, or ``None``.

    Example:
        >>> sampler_class("recsys_midx.samplers.MIDXSampler").family
        'midx'
    """
    name = target.rsplit(".", 1)[-1]
    return next((cls for cls in sampler_classes() if cls.__name__ == name), None)
