"""The built wheel is a complete tool: installed on its own, ``recsys-midx-train`` trains from an
empty folder with the configs it ships."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

#: What a build must not see: outputs of runs and earlier builds (a stale ``build/`` would put
#: removed files into the wheel), caches and version control.
NOT_SOURCES = shutil.ignore_patterns(".git", "build", "*.egg-info", "datasets", "outputs",
                                     "multirun", "site", "__pycache__", ".pytest_cache", ".venv")

#: The console commands of ``pyproject.toml``'s ``[project.scripts]`` that exist today.
COMMANDS = ("recsys-midx-train", "recsys-midx-summarize")


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_the_wheel_trains_from_an_empty_folder(tmp_path):
    # Neither this checkout (PYTHONPATH) nor a data folder of the caller may leak into the run.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RECSYS_MIDX_DATA_DIR", "HYDRA_FULL_ERROR")}
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(wheels), str(source)], cwd=tmp_path, env=env)
    (wheel,) = wheels.glob("recsys_midx-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"recsys_midx/conf/config.yaml", "recsys_midx/conf/sampler/midx.yaml",
            "recsys_midx/conf/debug/default.yaml", "recsys_midx/cli.py"} <= names
    assert not any(name.startswith(("tests/", "conf/", "train.py")) for name in names)

    # The venv reuses the installed dependencies; the package itself comes from the wheel only.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp_path, env)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
         tmp_path, env)
    empty = tmp_path / "empty"
    empty.mkdir()
    located = _run([str(python), "-c", "import recsys_midx; print(recsys_midx.__file__)"],
                   empty, env)
    assert Path(located.stdout.strip()).is_relative_to(venv), located.stdout
    for command in COMMANDS:
        assert (bin_dir / command).is_file(), command

    run = _run([str(bin_dir / "recsys-midx-train"), "debug=default"], empty,
               {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"})

    (results,) = (empty / "outputs").rglob("results.json")
    saved = json.loads(results.read_text())
    assert saved["epochs_run"] == 1 and "test/ndcg@10" in saved["metrics"]
    assert (results.parent / "train.log").is_file()
    assert (empty / "datasets" / "processed").is_dir()
    assert "optimized_metric val/ndcg@10 = " in run.stdout
