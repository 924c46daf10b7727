"""The documentation: the site builds without a warning, and the README stays a short guide."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The set-up block README.md opens with; CI runs the line that installs and runs pytest.
SETUP_BLOCK = [
    "# recsys_midx",
    "",
    "```bash",
    "pip install torch==2.13.0 -e . && python train.py",
    'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q',
    "```",
]


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


def test_readme_is_a_short_guide_opening_with_the_setup_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; results belong in docs/"
    assert lines[: len(SETUP_BLOCK)] == SETUP_BLOCK

