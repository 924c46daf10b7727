"""What importing a package loads: the layers stay apart.

Each package is imported in a fresh interpreter, so modules the test session already holds do
not hide an import. A case names the package imported and a module it must leave unloaded
(the module or any submodule of it); to guard another edge of the graph, add a case.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

CASES = [
    # A head is a score function: it needs no index (faiss) code and no objective.
    ("recsys_midx.heads", "faiss"),
    ("recsys_midx.heads", "recsys_midx.losses"),
    # Evaluation and sampling score the catalog through recsys_midx.scoring, not the losses.
    ("recsys_midx.metrics", "recsys_midx.losses"),
    ("recsys_midx.samplers", "recsys_midx.losses"),
    # A loss is a pure function of the head's output, targets, table and drawn negatives: it
    # never meets the sampler. A strategy draws through the sampler protocol alone.
    ("recsys_midx.losses", "recsys_midx.samplers"),
    ("recsys_midx.negatives", "recsys_midx.samplers"),
    ("recsys_midx.negatives", "recsys_midx.losses"),
    ("recsys_midx.samplers", "recsys_midx.negatives"),
    # Reports name and colour runs from their recorded configs, not from the samplers.
    ("recsys_midx.reports", "recsys_midx.samplers"),
    # Catalog scoring sits below every part that scores the catalog.
    ("recsys_midx.scoring", "recsys_midx.heads"),
    ("recsys_midx.scoring", "recsys_midx.index"),
    ("recsys_midx.scoring", "recsys_midx.losses"),
    ("recsys_midx.scoring", "recsys_midx.metrics"),
    ("recsys_midx.scoring", "recsys_midx.samplers"),
    ("recsys_midx.scoring", "faiss"),
    # Inference, analysis and sweep reports hold algorithms usable without the training stack:
    # only the commands (recsys_midx.app) and lit/ load Lightning and Hydra.
    *(
        (package, framework)
        for package in (
            "recsys_midx.inference",
            "recsys_midx.inference.ann",
            "recsys_midx.inference.query_encoder",
            "recsys_midx.analysis",
            "recsys_midx.reports",
        )
        for framework in ("lightning", "hydra")
    ),
    # No package below the commands imports them.
    *(
        (package, "recsys_midx.app")
        for package in (
            "recsys_midx.lit",
            "recsys_midx.data",
            "recsys_midx.inference",
            "recsys_midx.analysis",
            "recsys_midx.reports",
        )
    ),
]

_LIST_MODULES = (
    "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
    "print(json.dumps(sorted(sys.modules)))"
)


@functools.cache
def _modules_loaded_by(package: str) -> frozenset[str]:
    """Every module in ``sys.modules`` after importing ``package`` in a fresh interpreter (one
    interpreter per package, shared by its cases), with this checkout first on the path."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    completed = subprocess.run(
        [sys.executable, "-c", _LIST_MODULES, package],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return frozenset(json.loads(completed.stdout.splitlines()[-1]))


def _loaded(package: str, module: str) -> list[str]:
    return sorted(
        name
        for name in _modules_loaded_by(package)
        if name == module or name.startswith(module + ".")
    )


@pytest.mark.parametrize(("package", "unloaded"), CASES)
def test_importing_a_package_leaves_a_module_unloaded(package: str, unloaded: str) -> None:
    loaded = _loaded(package, unloaded)
    assert not loaded, f"import {package} loads {unloaded}: {loaded[:5]}"


def test_the_probe_sees_a_module_that_is_loaded() -> None:
    # The training command loads both frameworks: the probe itself is not blind.
    assert _loaded("recsys_midx.app.train", "lightning")
    assert _loaded("recsys_midx.app.train", "hydra")
