"""The built wheel is a complete tool: installed on its own, ``recsys-midx-train`` trains from an
empty folder with the configs it ships, and a newcomer gets recommendations in raw ids."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT
from trained_runs import TINY_CUSTOM_RUN, brute_force, csv_histories, write_interactions

from recsys_midx.app.trained import load_run

#: What a build must not see: outputs of runs and earlier builds (a stale ``build/`` would put
#: removed files into the wheel), caches and version control.
NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    "build",
    "*.egg-info",
    "datasets",
    "outputs",
    "multirun",
    "site",
    "__pycache__",
    ".pytest_cache",
    ".venv",
)

#: The console commands of ``pyproject.toml``'s ``[project.scripts]``.
COMMANDS = (
    "recsys-midx-train",
    "recsys-midx-summarize",
    "recsys-midx-recommend",
    "recsys-midx-eval",
    "recsys-midx-export",
    "recsys-midx-reproduce",
)


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def reuse_installed_dependencies(venv: Path, env: dict[str, str]) -> Path:
    """Let ``venv`` import the dependencies installed for the interpreter running the tests.

    ``venv --system-site-packages`` would expose the base interpreter's packages, not those of a
    virtual environment that runs pytest, so the running interpreter's own site-packages are
    listed in a ``.pth`` file instead. Plain paths in a ``.pth`` file are added after the venv's
    own site-packages and their ``.pth`` files are not run, so an editable install of this
    checkout there stays out: the package comes from the wheel only.

    Returns:
        The ``.pth`` file written.
    """
    own = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        venv,
        env,
    ).stdout.strip()
    outer = dict.fromkeys(
        [
            *site.getsitepackages(),
            sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["platlib"],
        ]
    )
    pth = Path(own) / "outer-site-packages.pth"
    pth.write_text("".join(f"{path}\n" for path in outer if Path(path).is_dir()))
    return pth


@dataclass(frozen=True)
class Installed:
    """The wheel installed in a venv of its own: its console commands, and the environment to
    run them with (this checkout neither on ``PYTHONPATH`` nor anywhere else)."""

    wheel: Path
    venv: Path
    env: dict[str, str]

    def command(self, name: str) -> str:
        return str(self.venv / "bin" / name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp_path = tmp_path_factory.mktemp("wheel")
    # Neither this checkout (PYTHONPATH) nor a data folder of the caller may leak into the run.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "RECSYS_MIDX_DATA_DIR", "HYDRA_FULL_ERROR")
    }
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        cwd=tmp_path,
        env=env,
    )
    (wheel,) = wheels.glob("recsys_midx-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    reuse_installed_dependencies(venv, env)
    _run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        tmp_path,
        env,
    )
    path = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return Installed(wheel, venv, {**env, "PATH": path})


@pytest.mark.slow
def test_the_wheel_trains_from_an_empty_folder(installed: Installed, tmp_path: Path) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert {
        "recsys_midx/conf/config.yaml",
        "recsys_midx/conf/sampler/midx.yaml",
        "recsys_midx/conf/debug/default.yaml",
        "recsys_midx/app/train.py",
    } <= names
    assert not any(name.startswith(("tests/", "conf/", "train.py")) for name in names)
    empty = tmp_path / "empty"
    empty.mkdir()
    located = _run(
        [installed.command("python"), "-c", "import recsys_midx; print(recsys_midx.__file__)"],
        empty,
        installed.env,
    )
    assert Path(located.stdout.strip()).is_relative_to(installed.venv), located.stdout
    for command in COMMANDS:
        assert Path(installed.command(command)).is_file(), command

    run = _run([installed.command("recsys-midx-train"), "debug=default"], empty, installed.env)

    (results,) = (empty / "outputs").rglob("results.json")
    saved = json.loads(results.read_text())
    assert saved["epochs_run"] == 1 and "test/ndcg@10" in saved["metrics"]
    assert (results.parent / "train.log").is_file()
    assert (empty / "datasets" / "processed").is_dir()
    assert "optimized_metric val/ndcg@10 = " in run.stdout


@pytest.mark.slow
def test_a_newcomer_trains_on_own_data_and_gets_unseen_raw_items(
    installed: Installed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From an empty folder: train on a CSV with text ids, then recommend for three raw user
    ids; the items are raw ids, none from the user's history, ranked as a brute-force scoring
    of the trained item table ranks them."""
    folder = tmp_path / "newcomer"
    folder.mkdir()
    write_interactions(folder / "interactions.csv")
    _run(
        [
            installed.command("recsys-midx-train"),
            "dataset=custom",
            "dataset.path=interactions.csv",
            "dataset.columns.user=uid",
            "dataset.columns.item=sku",
            "dataset.columns.time=ts",
            *TINY_CUSTOM_RUN,
            "sampler=uniform",
            "sampler.num_negatives=20",
            "hydra.run.dir=run",
        ],
        folder,
        installed.env,
    )
    users = ["user-003", "user-017", "user-042"]
    _run(
        [
            installed.command("recsys-midx-recommend"),
            "run",
            "--users",
            *users,
            "--k",
            "5",
            "--out",
            "recs.csv",
        ],
        folder,
        installed.env,
    )

    recs = pd.read_csv(folder / "recs.csv", dtype={"user": str, "item": str})
    # The run's settings name its data relative to the folder it was trained in.
    monkeypatch.chdir(folder)
    run = load_run("run")
    histories = csv_histories(folder / "run")
    assert list(recs["user"].unique()) == users
    for user, rows in recs.groupby("user", sort=False):
        assert not set(rows["item"]) & set(histories[user])
        expected, scores = brute_force(run, histories[user], k=5, exclude_seen=True)
        assert list(rows.sort_values("rank")["item"]) == expected
        np.testing.assert_allclose(rows.sort_values("rank")["score"], scores, rtol=1e-5)
