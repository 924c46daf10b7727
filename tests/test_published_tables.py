"""Every reproduced table in README and on the results and benchmarks pages is what its
committed CSV renders: a number edited by hand on the page, or a CSV changed without rendering it
again, fails here.

A page shows a table between ``<!-- reproduce: NAME -->`` and ``<!-- /reproduce: NAME -->``;
its spec is ``docs/results/tables/NAME.yaml``, its runs ``NAME.csv`` beside it, and the runs'
validation curves, where the spec asks for them, ``NAME.curves.csv`` (``recsys-midx-reproduce``,
:mod:`recsys_midx.reproduce`).
"""

from __future__ import annotations

import pytest
from conftest import ROOT

from recsys_midx.app.reproduce import PAGES
from recsys_midx.reproduce.collect import read_curves, read_runs
from recsys_midx.reproduce.render import block_names, page_block, render_block
from recsys_midx.reproduce.spec import load_spec

TABLES = ROOT / "docs" / "results" / "tables"
SHOWN = [
    (page, name)
    for page in PAGES
    if (ROOT / page).is_file()
    for name in block_names((ROOT / page).read_text())
]


def expected_block(name: str) -> str:
    """The block the page should hold for table ``name``: rendered from its committed CSV."""
    spec = load_spec(TABLES / f"{name}.yaml")
    runs = read_runs(TABLES / f"{name}.csv")
    curves = read_curves(spec, TABLES / f"{name}.csv")
    command = f"recsys-midx-reproduce docs/results/tables/{name}.yaml"
    return render_block(spec, runs, command, curves)


@pytest.mark.parametrize(("page", "name"), SHOWN, ids=[f"{p}:{n}" for p, n in SHOWN])
def test_the_page_shows_what_the_csv_renders(page: str, name: str) -> None:
    shown = page_block((ROOT / page).read_text(), name)
    assert shown == expected_block(name), (
        f"{page}: the table {name} differs from what docs/results/tables/{name}.csv renders: "
        f"run `recsys-midx-reproduce docs/results/tables/{name}.yaml --render` (never edit its "
        "numbers by hand)"
    )


def test_every_collected_spec_is_shown_on_a_page_once() -> None:
    # A spec whose runs are not collected yet (no CSV) is a table still to run, not shown.
    specs = sorted(
        path.stem for path in TABLES.glob("*.yaml") if path.with_suffix(".csv").is_file()
    )
    shown = sorted(name for page, name in SHOWN if page.startswith("docs/"))
    assert shown == specs, "each spec in docs/results/tables with a CSV has one block in docs/"


def test_every_spec_is_well_formed_and_a_collected_one_has_its_curves_and_figure() -> None:
    for path in TABLES.glob("*.yaml"):
        if load_spec(path).validation and path.with_suffix(".csv").is_file():
            assert path.with_suffix(".png").is_file(), f"{path.stem}: no figure; run --render"
            assert (TABLES / f"{path.stem}.curves.csv").is_file(), f"{path.stem}: no curves CSV"
