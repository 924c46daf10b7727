"""The training command's console: library warnings it hides (each narrowly), whole runs that
print none of them, and a hint to continue after Ctrl-C."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import ROOT, TINY_RUN, run_train, sampler_overrides
from lightning.fabric.utilities.warnings import PossibleUserWarning

from recsys_midx.app.train import HARMLESS_WARNINGS, filter_harmless_warnings

#: Each harmless warning as Lightning issues it: message, category and issuing module.
LIGHTNING_WARNINGS = [
    (
        "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and "
        "treespec.is_leaf()` instead.",
        FutureWarning,
        "lightning.pytorch.utilities._pytree",
    ),
    (
        '`.test(ckpt_path="best")` is called with Trainer configured with multiple '
        "`ModelCheckpoint` callbacks. It will use the best checkpoint path from first checkpoint "
        "callback.",
        UserWarning,
        "lightning.pytorch.trainer.connectors.checkpoint_connector",
    ),
    (
        "The 'train_dataloader' does not have many workers which may be a bottleneck.",
        PossibleUserWarning,
        "lightning.pytorch.trainer.connectors.data_connector",
    ),
    (
        "Checkpoint directory /runs/a/checkpoints exists and is not empty.",
        UserWarning,
        "lightning.pytorch.callbacks.model_checkpoint",
    ),
    (
        "The number of training batches (4) is smaller than the logging interval "
        "Trainer(log_every_n_steps=10).",
        PossibleUserWarning,
        "lightning.pytorch.loops.fit_loop",
    ),
]


def _shown(message: str, category: type[Warning], module: str) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        filter_harmless_warnings()
        warnings.simplefilter("always", append=True)
        warnings.warn_explicit(message, category, "somewhere.py", 1, module=module)
    return bool(caught)


@pytest.mark.parametrize(("message", "category", "module"), LIGHTNING_WARNINGS)
def test_each_harmless_warning_is_hidden_only_where_lightning_issues_it(message, category, module):
    assert len(LIGHTNING_WARNINGS) == len(HARMLESS_WARNINGS)
    assert not _shown(message, category, module)
    assert _shown(message, category, "recsys_midx.app.experiment")
    assert _shown(message, DeprecationWarning, module)
    assert _shown("Something else went wrong.", category, module)


@pytest.mark.slow
def test_a_run_prints_none_of_the_harmless_library_warnings(tmp_path):
    # Few batches per epoch at the default logging interval, two checkpoint callbacks and a test
    # of the best checkpoint: the situations in which Lightning warns.
    done = run_train(
        *TINY_RUN,
        *sampler_overrides("uniform"),
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=10",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"paths.data_dir={tmp_path / 'data'}",
    )

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
        *TINY_RUN,
        *sampler_overrides("uniform"),
        f"paths.data_dir={tmp_path / 'data'}",
        "+callbacks.pause._target_=pausing.PauseBeforeStep",
        "+callbacks.pause.step=5",
        f"+callbacks.pause.marker={paused}",
        f"hydra.run.dir={run_dir}",
    ]
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    errors = tmp_path / "train.err"
    with errors.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "train.py", *arguments],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=environment,
        )
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
    expected = shlex.join(
        [sys.executable, "train.py", *arguments[:-1], "resume=auto", f"hydra.run.dir={run_dir}"]
    )
    assert "interrupted; to continue this run:" in lines
    assert lines[lines.index("interrupted; to continue this run:") + 1] == expected
