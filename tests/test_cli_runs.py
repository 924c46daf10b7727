"""Whole runs of the training command: a quiet console, and a hint to continue after Ctrl-C."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY_RUN, run_train, sampler_overrides
from recsys_midx.cli import HARMLESS_WARNINGS


@pytest.mark.slow
def test_a_run_prints_none_of_the_harmless_library_warnings(tmp_path):
    # Few batches per epoch at the default logging interval, two checkpoint callbacks and a test
    # of the best checkpoint: the situations in which Lightning warns.
    done = run_train(*TINY_RUN, *sampler_overrides("uniform"), "trainer.max_epochs=1",
                     "trainer.log_every_n_steps=10", f"hydra.run.dir={tmp_path / 'run'}",
                     f"paths.data_dir={tmp_path / 'data'}")

    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "results.json").is_file()
    output = done.stdout + done.stderr
    for message, _, _ in HARMLESS_WARNINGS:
        assert not re.search(message, output), message
    assert "Warning" not in output and "Tip:" not in output, output[-3000:]


@pytest.mark.slow
def test_ctrl_c_prints_the_command_that_continues_the_run(tmp_path):
    # Block inside the second epoch (tests/pausing.py), after the first epoch's checkpoints.
    run_dir, paused = tmp_path / "run", tmp_path / "paused"
    arguments = [
        *TINY_RUN, *sampler_overrides("uniform"), f"paths.data_dir={tmp_path / 'data'}",
        "+callbacks.pause._target_=pausing.PauseBeforeStep", "+callbacks.pause.step=5",
        f"+callbacks.pause.marker={paused}", f"hydra.run.dir={run_dir}",
    ]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    errors = tmp_path / "train.err"
    with errors.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "train.py", *arguments], cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=stderr, env=environment)
        deadline = time.monotonic() + 240
        while not paused.exists():
            assert process.poll() is None, f"train.py ended: {errors.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "train.py never reached the second epoch"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)

    assert process.returncode != 0
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    lines = [line.strip() for line in errors.read_text().splitlines() if line.strip()]
    expected = shlex.join([sys.executable, "train.py", *arguments[:-1], "resume=auto",
                           f"hydra.run.dir={run_dir}"])
    assert "interrupted; to continue this run:" in lines
    assert lines[lines.index("interrupted; to continue this run:") + 1] == expected
