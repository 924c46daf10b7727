"""What the samplers declare about themselves, the configs that repeat it, and the names and
colours reports give them."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import CONF_DIR, sampler_config_class
from omegaconf import OmegaConf

from recsys_midx import samplers
from recsys_midx.app.auto_sampler import AUTO_SETTING
from recsys_midx.reports import run_names
from recsys_midx.samplers import MIDXSampler, Sampler, UniformSampler

#: The sampler configs that build a sampler (``sampler=full`` builds none).
SAMPLER_CONFIGS = [
    path
    for path in sorted((CONF_DIR / "sampler").glob("*.yaml"))
    if sampler_config_class(path.stem) is not None
]
#: Every concrete sampler the package exports.
SAMPLER_CLASSES = tuple(
    kind
    for kind in vars(samplers).values()
    if isinstance(kind, type) and issubclass(kind, Sampler) and not inspect.isabstract(kind)
)

#: Config values that differ from their constructor's default on purpose, with the reason.
JUSTIFIED = {
    ("lsh", "seed"): "${seed}: the run's seed",
    ("midx", "seed"): "${seed}: the run's seed",
    ("sir", "seed"): "${seed}: the run's seed",
}
#: Settings a base config leaves to the variant that uses them, with the variant.
LEFT_TO_VARIANTS = {
    ("midx", "pop_alpha"): "midx_pop",
    ("midx", "pop_smoothing"): "midx_pop",
}


def _raw(path: Path) -> dict[str, Any]:
    """A sampler config as written, interpolations unresolved."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def _quietly(cls: type[Sampler], **settings: Any) -> Sampler:
    """``cls(200, 1, **settings)`` without the approximate-log-q warnings of SIR and DNS."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(200, 1, **settings)


@pytest.mark.parametrize("path", SAMPLER_CONFIGS, ids=lambda path: path.stem)
def test_every_sampler_config_repeats_its_constructors_defaults(path: Path) -> None:
    raw = _raw(path)
    target = sampler_config_class(path.stem)
    defaults = target.defaults()
    # sampler=auto's limits choose between the exact softmax and MIDX, before any sampler is built.
    skipped = ("_target_", "defaults", AUTO_SETTING)
    settings = {key: value for key, value in raw.items() if key not in skipped}
    assert set(settings) <= set(defaults), f"{path.name} sets what the constructor does not take"
    if "_target_" not in raw:
        return  # a variant: the settings it changes are its point
    left = {
        key: variant for (config, key), variant in LEFT_TO_VARIANTS.items() if config == path.stem
    }
    assert set(settings) | set(left) == set(defaults), f"{path.name} leaves settings out"
    for key, variant in left.items():  # the variant that uses a setting repeats its default
        assert _raw(CONF_DIR / "sampler" / f"{variant}.yaml")[key] == defaults[key], (variant, key)
    for key, value in settings.items():
        if (path.stem, key) in JUSTIFIED:
            assert value != defaults[key], f"{path.stem}.{key} agrees now: drop it from JUSTIFIED"
        else:
            assert value == defaults[key], (
                f"{path.name}: {key}={value!r}, but {target.__name__} defaults to {defaults[key]!r}"
            )


def test_every_justified_difference_names_a_config_setting() -> None:
    names = {path.stem: _raw(path) for path in SAMPLER_CONFIGS}
    for config, key in JUSTIFIED:
        assert key in names[config], (config, key)


def test_reports_give_every_sampler_a_family_and_colour_of_its_own() -> None:
    assert {kind.__name__ for kind in SAMPLER_CLASSES} <= set(run_names.SAMPLER_FAMILIES)
    families, colours = zip(*run_names.SAMPLER_FAMILIES.values(), run_names.EXACT_FAMILY)
    assert len(set(families)) == len(families) and len(set(colours)) == len(colours)
    assert run_names.OTHER_COLOUR not in colours
    # Each family has a config of its name, the name summaries give its runs.
    assert set(families) <= {path.stem for path in (CONF_DIR / "sampler").glob("*.yaml")}


def test_midx_labels_leave_out_the_samplers_defaults() -> None:
    defaults = MIDXSampler.defaults()
    assert {key: defaults[key] for key in run_names.MIDX_LABEL_DEFAULTS} == (
        run_names.MIDX_LABEL_DEFAULTS
    )


@pytest.mark.parametrize("cls", SAMPLER_CLASSES, ids=lambda cls: cls.__name__)
def test_declared_choices_and_minimums_are_what_the_constructor_accepts(cls) -> None:
    for name, choices in cls.choices.items():
        for choice in choices:
            _quietly(cls, **{name: choice})
        with pytest.raises(ValueError, match=f"^{name}=none_of_these: choose one of "):
            _quietly(cls, **{name: "none_of_these"})
    for name, lowest in cls.minimums.items():
        _quietly(cls, **{name: lowest})
        with pytest.raises(ValueError, match=f"^{name}={lowest - 1}: it must be >= {lowest}$"):
            _quietly(cls, **{name: lowest - 1})


@pytest.mark.parametrize("cls", SAMPLER_CLASSES, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("num_items", [5, 80, 100_000])
def test_settings_for_a_catalog_build_a_sampler_of_it(cls, num_items) -> None:
    settings = cls.settings_for(num_items)
    assert set(settings) <= set(cls.defaults())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls(num_items, **settings)
    if num_items == 100_000:
        assert settings == {}, "the defaults suit a large catalog"


def test_small_catalogs_draw_fewer_negatives_from_fewer_cells() -> None:
    assert UniformSampler.settings_for(80) == {"num_negatives": 20}
    assert MIDXSampler.settings_for(80) == {"num_negatives": 20, "num_codewords": 8}
    assert MIDXSampler.settings_for(1000) == {"num_codewords": 16}
