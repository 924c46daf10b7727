"""Errors that a run reports to its user as one line (see :mod:`recsys_midx.app.train`).

The data layer's errors live in :mod:`recsys_midx.data.errors` (:class:`DataError` and its
subclasses); this module holds the errors of the settings themselves.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting, or a combination of settings, that cannot give a sensible run.

    The message names each setting as it is written on the command line (``eval.ks=[5, 50]``,
    ``sampler.num_codebooks=4``) and says how to fix it. It is raised by
    :func:`recsys_midx.app.preflight.check` before any data is read or any file written.

    Example:
        >>> raise ConfigError("trainer.max_epochs=0: a run trains at least one epoch")
        Traceback (most recent call last):
        ...
        recsys_midx.errors.ConfigError: trainer.max_epochs=0: a run trains at least one epoch
    """
