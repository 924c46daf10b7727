"""The documentation: the site builds without a warning, and the README stays a short guide."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import recsys_midx

ROOT = Path(__file__).resolve().parents[1]

#: The set-up block README.md opens with; CI runs the line that installs and runs pytest.
SETUP_BLOCK = [
    "# recsys_midx",
    "",
    "```bash",
    "pip install torch==2.13.0 -e . && python train.py",
    'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q -n auto',
    "```",
]


@pytest.mark.slow
def test_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """Broken links, pages outside `nav` and docstrings griffe cannot parse all fail here."""
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "api" / "samplers" / "index.html").is_file()
    missing = sorted(set(_public_classes()) - _documented_names(tmp_path / "site" / "api"))
    assert not missing, f"public classes without an API entry (add them to docs/api/): {missing}"


def _public_classes() -> dict[str, str]:
    """Class name -> module of every public class defined in a public module of the package."""
    classes = {}
    for info in pkgutil.walk_packages(recsys_midx.__path__, "recsys_midx."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module.__name__ and name[0] != "_":
                classes[name] = module.__name__
    return classes


def _documented_names(api_dir: Path) -> set[str]:
    """The last part of every object id rendered on the API pages."""
    html = " ".join(page.read_text(encoding="utf-8") for page in api_dir.rglob("*.html"))
    return {anchor.rsplit(".", 1)[-1] for anchor in re.findall(r'id="([\w.]+)"', html)}


def test_readme_is_a_short_guide_opening_with_the_setup_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; results belong in docs/"
    assert lines[: len(SETUP_BLOCK)] == SETUP_BLOCK
