"""What importing a package loads: the layers stay apart.

Each package is imported in a fresh interpreter, so modules the test session already holds do
not hide an import. A case names the package imported and a module it must leave unloaded
(the module or any submodule of it); to guard another edge of the graph, add a case.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

#: Why a package still loads Lightning or Hydra: the algorithms under it need neither, but it
#: still holds code built on trained runs and their Lightning modules.
_READS_LIGHTNING_MODULES = "recsys_midx.inference.seqrec imports the Lightning modules (lit)"
_READS_TRAINED_RUNS = "recsys_midx.analysis re-exports load_run, which needs Lightning and Hydra"

CASES = [
    # A head is a score function: it needs no index (faiss) code and no objective.
    ("recsys_midx.heads", "faiss"),
    ("recsys_midx.heads", "recsys_midx.losses"),
    # Evaluation and sampling score the catalog through recsys_midx.scoring, not the losses.
    ("recsys_midx.metrics", "recsys_midx.losses"),
    ("recsys_midx.samplers", "recsys_midx.losses"),
    # Catalog scoring sits below every part that scores the catalog.
    ("recsys_midx.scoring", "recsys_midx.heads"),
    ("recsys_midx.scoring", "recsys_midx.losses"),
    ("recsys_midx.scoring", "recsys_midx.metrics"),
    ("recsys_midx.scoring", "recsys_midx.samplers"),
    ("recsys_midx.scoring", "faiss"),
    # Inference and analysis hold algorithms usable without the training stack.
    pytest.param("recsys_midx.inference", "lightning",
                 marks=pytest.mark.xfail(strict=True, reason=_READS_LIGHTNING_MODULES)),
    ("recsys_midx.inference", "hydra"),
    pytest.param("recsys_midx.analysis", "lightning",
                 marks=pytest.mark.xfail(strict=True, reason=_READS_TRAINED_RUNS)),
    pytest.param("recsys_midx.analysis", "hydra",
                 marks=pytest.mark.xfail(strict=True, reason=_READS_TRAINED_RUNS)),
]

_LIST_MODULES = (
    "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
    "print(json.dumps(sorted(sys.modules)))"
)


@functools.cache
def _modules_loaded_by(package: str) -> frozenset[str]:
    """Every module in ``sys.modules`` after importing ``package`` in a fresh interpreter (one
    interpreter per package, shared by its cases)."""
    completed = subprocess.run(
        [sys.executable, "-c", _LIST_MODULES, package], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return frozenset(json.loads(completed.stdout.splitlines()[-1]))


@pytest.mark.parametrize(("package", "unloaded"), CASES)
def test_importing_a_package_leaves_a_module_unloaded(package: str, unloaded: str) -> None:
    loaded = sorted(
        name for name in _modules_loaded_by(package)
        if name == unloaded or name.startswith(unloaded + ".")
    )
    assert not loaded, f"import {package} loads {unloaded}: {loaded[:5]}"
