"""Every reproduced table on the results and benchmarks pages is what its committed CSV renders:
a number edited by hand on the page, or a CSV changed without rendering it again, fails here.

A page shows a table between ``<!-- reproduce: NAME -->`` and ``<!-- /reproduce: NAME -->``;
its spec is ``docs/results/tables/NAME.yaml`` and its runs ``NAME.csv`` beside it
(``recsys-midx-reproduce``, :mod:`recsys_midx.reproduce`).
"""

from __future__ import annotations

import pytest
from conftest import ROOT

from recsys_midx.reproduce.collect import read_runs
from recsys_midx.reproduce.render import block_names, page_block, render_block
from recsys_midx.reproduce.spec import load_spec

PAGES = ("docs/results.md", "docs/benchmarks.md")
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
    return render_block(spec, runs, f"recsys-midx-reproduce docs/results/tables/{name}.yaml")


@pytest.mark.parametrize(("page", "name"), SHOWN, ids=[f"{p}:{n}" for p, n in SHOWN])
def test_the_page_shows_what_the_csv_renders(page: str, name: str) -> None:
    shown = page_block((ROOT / page).read_text(), name)
    assert shown == expected_block(name), (
        f"{page}: the table {name} differs from what docs/results/tables/{name}.csv renders: "
        f"run `recsys-midx-reproduce docs/results/tables/{name}.yaml --render` (never edit its "
        "numbers by hand)"
    )


def test_every_spec_is_shown_on_a_page_once() -> None:
    specs = sorted(path.stem for path in TABLES.glob("*.yaml"))
    shown = sorted(name for _, name in SHOWN)
    assert shown == specs, "each spec in docs/results/tables has one block on the pages"
