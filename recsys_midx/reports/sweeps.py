"""Which settings tell the runs of a sweep apart: every config value that differs between runs,
except the seed and what follows from it or from the run's own folder.

A sweep summary must average only over seeds: two runs that differ in any other setting (a
learning rate, a dimension, a data path) belong to different rows, and the row names what sets it
apart. :func:`varying_settings` finds those settings from the runs' resolved configs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Keys that identify a run, or only guard its start, rather than configure it.
_RUN_KEYS = frozenset({"seed", "resume", "preflight.memory"})


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values of a nested config (lists are leaves, as tuples).

    Example:
        >>> flatten_config({"model": {"dim": 16, "ks": [10, 20]}, "seed": 0})
        {'model.dim': 16, 'model.ks': (10, 20), 'seed': 0}
    """
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = tuple(value) if isinstance(value, list) else value
    return flat


def varying_settings(
    configs: Sequence[Mapping[str, Any]], output_dirs: Sequence[str | None] = ()
) -> list[dict[str, Any]]:
    """For each run, the settings whose values are not the same in every run.

    Left out: the seed, ``resume`` and ``preflight.memory``; any key whose value equals the run's
    seed in every run that has it (``sampler.seed: ${seed}`` resolves to it; an exact softmax has
    no such key); any key whose value, in some run, is a string inside that run's output folder
    (checkpoint and log folders). A key missing from some runs (a sampler without codebooks)
    varies, and is left out of the dicts of the runs that lack it.

    Args:
        configs: the resolved configs of the runs (``results.json``'s ``config``).
        output_dirs: each run's output folder, in the same order (optional).

    Returns:
        One dict per run, dotted key -> value, holding the varying settings it has.

    Example:
        >>> runs = [{"seed": s, "model": {"dim": d}, "sampler": {"seed": s}}
        ...         for d in (16, 64) for s in (0, 1)]
        >>> varying_settings(runs)
        [{'model.dim': 16}, {'model.dim': 16}, {'model.dim': 64}, {'model.dim': 64}]
    """
    flat = [flatten_config(config) for config in configs]
    folders = list(output_dirs) + [None] * (len(flat) - len(output_dirs))
    keys = sorted({key for run in flat for key in run} - _RUN_KEYS)

    def follows_the_run(key: str) -> bool:
        if all(run[key] == run.get("seed") for run in flat if key in run):
            return True
        return any(
            folder and isinstance(run.get(key), str) and str(run[key]).startswith(str(folder))
            for run, folder in zip(flat, folders)
        )

    varying = [
        key
        for key in keys
        if len({repr(run.get(key)) for run in flat}) > 1 and not follows_the_run(key)
    ]
    return [{key: run[key] for key in varying if key in run} for run in flat]
