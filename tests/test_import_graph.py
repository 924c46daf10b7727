"""The algorithm packages load without the application's frameworks: importing
``recsys_midx.inference``, ``recsys_midx.analysis`` or ``recsys_midx.reports`` pulls in neither
Lightning nor Hydra."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

#: Top-level packages that only the commands (``recsys_midx.app``) and ``lit/`` may load.
FRAMEWORKS = ("lightning", "hydra")


def _frameworks_loaded_by(module: str) -> list[str]:
    """The :data:`FRAMEWORKS` in ``sys.modules`` after importing ``module`` in a fresh process.

    A fresh interpreter each time: this test process has long since imported both.
    """
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps(sorted(name for name in {FRAMEWORKS!r} if name in sys.modules)))\n"
    )
    # The checkout first on the path, as for the tests themselves, not an installed copy.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=False,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["recsys_midx.inference", "recsys_midx.analysis",
                                    "recsys_midx.reports"])
def test_algorithm_packages_load_neither_lightning_nor_hydra(module: str) -> None:
    assert _frameworks_loaded_by(module) == []


def test_the_check_sees_a_framework_when_one_is_loaded() -> None:
    # The training command loads both: the probe itself is not blind.
    assert _frameworks_loaded_by("recsys_midx.app.train") == sorted(FRAMEWORKS)
