"""A user's mistake ends ``train.py`` with one ``error: ...`` line naming the setting, status 1,
no traceback (unless ``HYDRA_FULL_ERROR=1``) and nothing written: no run folder, no processed
dataset."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_train

#: The overrides of each bad input (``{tmp}`` is the test's folder) and the line it must print.
BAD_INPUTS = {
    "ks-without-monitor": (
        ["eval.ks=[5,50]"],
        "error: eval.ks=[5, 50] does not produce task.monitor=val/ndcg@10; the task logs "
        "val/hr@5, val/ndcg@5, val/mrr@5, val/hr@50, val/ndcg@50, val/mrr@50: add the cut-off "
        "to eval.ks or set task.monitor to one of them",
    ),
    "no-epochs": (
        ["trainer.max_epochs=0"],
        "error: trainer.max_epochs=0: a run trains at least one epoch; set "
        "trainer.max_epochs>=1 (or -1 with trainer.max_steps or trainer.max_time)",
    ),
    "missing-file": (
        ["dataset=custom", "dataset.path={tmp}/missing.csv"],
        "error: {tmp} lacks 'missing.csv'. dataset.path={tmp}/missing.csv names no existing "
        "file or folder",
    ),
    "missing-column": (
        ["dataset=custom", "dataset.path={tmp}/no_time.csv"],
        "error: {tmp}/no_time.csv has no column 'timestamp'; columns found: 'user', 'item'; "
        "set dataset.columns.time to one of them",
    ),
    "empty-csv": (
        ["dataset=custom", "dataset.path={tmp}/empty.csv"],
        "error: {tmp}/empty.csv is empty",
    ),
    "pq-dim": (
        ["model.dim=30", "sampler.num_codebooks=4"],
        "error: model.dim=30 is not divisible by sampler.num_codebooks=4: product quantisation "
        "(sampler.quantizer=pq) splits the item vectors into equal parts; choose "
        "sampler.num_codebooks dividing 30 or sampler=midx_rq",
    ),
}


def _bad_input(tmp_path: Path, case: str) -> tuple[list[str], str]:
    """The command-line arguments and expected line of ``case``, with its files in place."""
    (tmp_path / "no_time.csv").write_text("user,item\n1,2\n2,3\n")
    (tmp_path / "empty.csv").write_text("")
    overrides, line = BAD_INPUTS[case]
    arguments = [o.format(tmp=tmp_path) for o in overrides]
    return [
        *arguments,
        f"hydra.run.dir={tmp_path / 'run'}",
        f"paths.data_dir={tmp_path / 'data'}",
    ], line.format(tmp=tmp_path)


def _assert_nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "run").exists(), sorted((tmp_path / "run").rglob("*"))
    processed = tmp_path / "data" / "processed"
    assert not processed.exists() or not any(processed.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_prints_one_error_line_and_leaves_nothing(tmp_path, case):
    arguments, expected = _bad_input(tmp_path, case)

    done = run_train(*arguments, env={"HYDRA_FULL_ERROR": "0"})

    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1] == expected
    assert [line for line in lines if line.startswith("error:")] == [expected]
    assert "Traceback" not in done.stderr and "full_key" not in done.stderr
    assert "task.datamodule.source" not in done.stderr
    _assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_hydra_full_error_shows_the_traceback(tmp_path):
    arguments, expected = _bad_input(tmp_path, "empty-csv")

    done = run_train(*arguments, env={"HYDRA_FULL_ERROR": "1"})

    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "EmptyFileError" in done.stderr
    assert expected.removeprefix("error: ") in done.stderr
    _assert_nothing_written(tmp_path)
