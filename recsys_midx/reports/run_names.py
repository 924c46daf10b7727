"""How a sweep's reports name and colour its runs, from the configs the runs recorded.

A run is named by its sampler's family (``midx``), the variant it ran (``midx[rq,uniform]``) and
how its negatives were drawn (``, shared``); the exact softmax is ``full``; an objective that
estimates the softmax without drawn negatives (SCE's buckets, EDRep's Gaussian mixture) names
the run instead. Every family has one plot colour, so all figures of a sweep agree. Runs are read
from their ``results.json`` configs, so the names cover runs recorded before the negatives were a
config group of their own (``loss.shared_negatives``, ``sampler=full``'s former sampler).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The family name and plot colour of each of the package's samplers, by the class name a
#: config's ``_target_`` ends with.
SAMPLER_FAMILIES: dict[str, tuple[str, str]] = {
    "UniformSampler": ("uniform", "C1"),
    "PopularitySampler": ("popularity", "C2"),
    "MIDXSampler": ("midx", "C3"),
    "InBatchSampler": ("inbatch", "C4"),
    "KernelSampler": ("kernel", "C5"),
    "SIRSampler": ("sir", "C6"),
    "DNSSampler": ("dns", "C7"),
    "LSHSampler": ("lsh", "C8"),
}
#: The exact softmax's family and colour.
EXACT_FAMILY = ("full", "C0")
#: The colour of a sampler or objective from outside the package, which no family takes.
OTHER_COLOUR = "C9"
#: The objectives that estimate the softmax without drawn negatives, by class name: their
#: runs are named by them, not by a sampler they never drew from.
OBJECTIVES_NAMING_RUNS: dict[str, str] = {
    "ScalableCrossEntropyLoss": "sce",
    "EDRepLoss": "edrep",
}
#: The MIDX settings a label leaves out at these values (the sampler's defaults).
MIDX_LABEL_DEFAULTS: dict[str, Any] = {
    "quantizer": "pq",
    "last_stage": "uniform",
    "num_codewords": 64,
}
#: How each strategy of the ``negatives`` group shows in a label (none: the default, per query).
_STRATEGY_LABELS: dict[str, str] = {
    "SharedByBatch": "shared",
    "PerSequence": "per sequence",
    "OutsideWindow": "outside window",
}


def _class_name(node: Mapping[str, Any] | None) -> str:
    return str((node or {}).get("_target_", "")).rsplit(".", 1)[-1]


def objective_name(config: Mapping[str, Any]) -> str | None:
    """The objective that names a run (:data:`OBJECTIVES_NAMING_RUNS`), else ``None``."""
    return OBJECTIVES_NAMING_RUNS.get(_class_name(config.get("loss")))


def is_exact(config: Mapping[str, Any]) -> bool:
    """Whether a run trained the exact softmax: ``negatives=none`` with a softmax loss, or a
    run recorded with ``sampler=full``'s former sampler."""
    if objective_name(config) is not None:
        return False
    negatives = _class_name(config.get("negatives"))
    return negatives == "NoNegatives" or _class_name(config.get("sampler")) == "FullSampler"


def strategy(config: Mapping[str, Any]) -> str:
    """The class name of a run's negatives strategy, read from the ``negatives`` group or, for
    a run recorded before it, from how its loss and sampler drew: ``loss=window_softmax``'s
    draw per sequence, ``NoNegatives`` for an objective naming the run or ``sampler=full``'s
    former sampler, ``loss.shared_negatives``, else ``PerQuery``.

    Example:
        >>> strategy({"loss": {"_target_": "recsys_midx.losses.SoftmaxLoss",
        ...                    "shared_negatives": True}})
        'SharedByBatch'
    """
    recorded = _class_name(config.get("negatives"))
    if recorded:
        return recorded
    loss = config.get("loss") or {}
    if _class_name(loss) == "WindowSoftmaxLoss":
        return "PerSequence" if loss.get("negatives") == "proposal" else "OutsideWindow"
    if objective_name(config) is not None or _class_name(config.get("sampler")) == "FullSampler":
        return "NoNegatives"
    return "SharedByBatch" if loss.get("shared_negatives") else "PerQuery"


def family(config: Mapping[str, Any]) -> str:
    """The run's family: the objective naming it, ``full`` for the exact softmax, the family of
    a package's sampler, or a foreign sampler's class name (``MySampler`` is ``my``)."""
    name = objective_name(config)
    if name is not None:
        return name
    if is_exact(config):
        return EXACT_FAMILY[0]
    target = _class_name(config.get("sampler"))
    known = SAMPLER_FAMILIES.get(target)
    return known[0] if known else target.removesuffix("Sampler").lower()


def colour(config: Mapping[str, Any]) -> str:
    """The plot colour of the run's family (:data:`OTHER_COLOUR` for one from elsewhere)."""
    if objective_name(config) is not None:
        return OTHER_COLOUR
    if is_exact(config):
        return EXACT_FAMILY[1]
    known = SAMPLER_FAMILIES.get(_class_name(config.get("sampler")))
    return known[1] if known else OTHER_COLOUR


def negatives_count(config: Mapping[str, Any]) -> int | None:
    """Negatives drawn per query (or per batch or sequence); ``None`` where none are drawn."""
    if objective_name(config) is not None or is_exact(config):
        return None
    return (config.get("sampler") or {}).get("num_negatives")


def midx_label_parts(
    settings: Mapping[str, Any], sizing: Mapping[str, Any], every_n_steps: int | None
) -> list[str]:
    """The quantiser and the last stage, then, where they are not the defaults, the codewords
    per codebook (``K=256``), the step refresh schedule and the exact top cells as used.

    Args:
        settings: the run's sampler config (older runs may lack settings added since).
        sizing: the sizes the run's sampler derived from its catalog (``sampler.sizing`` of
            ``results.json``).
        every_n_steps: the run's step refresh schedule (``None`` or 0: none).

    Example:
        >>> midx_label_parts({"quantizer": "rq", "num_codewords": 256}, {}, 10)
        ['rq', 'uniform', 'K=256', 'refresh/10 steps']
    """
    defaults = MIDX_LABEL_DEFAULTS
    parts = [
        settings.get("quantizer", defaults["quantizer"]),
        settings.get("last_stage", defaults["last_stage"]),
    ]
    codewords = settings.get("num_codewords", defaults["num_codewords"])
    if codewords != defaults["num_codewords"]:
        parts.append(f"K={codewords}")
    if every_n_steps:
        parts.append(f"refresh/{every_n_steps} steps")
    # A run sized from the catalog records what it used; a config without the setting
    # predates exact top cells.
    top_codewords = sizing.get("exact_top_codewords", settings.get("exact_top_codewords"))
    if top_codewords:
        parts.append(f"exact top {top_codewords}")
    return parts


def sampler_label(config: Mapping[str, Any], result: Mapping[str, Any] | None = None) -> str:
    """The readable name of a run's sampled softmax: its family, with the variant a MIDX
    sampler ran (:func:`midx_label_parts`); how its negatives were drawn where not per query
    (``shared``, ``per sequence``, ``outside window``); and ``exact positives`` where a loss
    correcting by ``log q`` counted the positive exactly. Settings sized from the catalog are
    read from the run's ``result`` (``sampler.sizing``, ``exact_positives``).

    Example:
        >>> sampler_label({"sampler": {"_target_": "recsys_midx.samplers.UniformSampler"},
        ...                "loss": {"_target_": "recsys_midx.losses.SoftmaxLoss"},
        ...                "negatives": {"_target_": "recsys_midx.negatives.SharedByBatch",
        ...                              "correct_positive": False}})
        'uniform, shared, exact positives'
    """
    name = family(config)
    if objective_name(config) is not None or is_exact(config):
        return name
    result = result or {}
    sampler = config.get("sampler") or {}
    if _class_name(sampler) == "MIDXSampler":
        sizing = (result.get("sampler") or {}).get("sizing") or {}
        # The schedule is the refresh callback's (older runs kept it in the sampler).
        refresh = (config.get("callbacks") or {}).get("sampler_refresh") or {}
        every_n_steps = refresh.get("every_n_steps") or sampler.get("refresh_every_n_steps")
        name = f"{name}[{','.join(midx_label_parts(sampler, sizing, every_n_steps))}]"
    drawn = _STRATEGY_LABELS.get(strategy(config))
    if drawn:
        name = f"{name}, {drawn}"
    return f"{name}, exact positives" if _counted_exactly(config, result) else name


def _counted_exactly(config: Mapping[str, Any], result: Mapping[str, Any]) -> bool:
    """Whether a softmax loss correcting by ``log q`` counted the positive exactly: as the run
    recorded it, else as its config set it (``negatives.correct_positive: false``, or before
    that ``loss.exact_positives: true``)."""
    if not _class_name(config.get("loss")).endswith("SoftmaxLoss"):
        return False
    if "exact_positives" in result:
        return bool(result["exact_positives"])
    negatives, loss = config.get("negatives") or {}, config.get("loss") or {}
    if "correct_positive" in negatives:
        return negatives["correct_positive"] is False
    return bool(loss.get("exact_positives"))
