"""The reproduce command end to end on a tiny spec: it runs, publishes each finished run, is
killed, resumes, skips the complete runs and renders the table; a malformed spec stops it with one
line naming the field."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import TINY_RUN

from recsys_midx.reproduce.collect import read_curves, read_runs, run_curve
from recsys_midx.reproduce.render import (
    block_names,
    page_block,
    render_block,
    render_table,
    render_times,
)
from recsys_midx.reproduce.runs import (
    ADDED_SETTINGS,
    PlannedRun,
    execute,
    plan,
    resolved_config,
    status,
    upgraded,
)
from recsys_midx.reproduce.spec import load_spec, parse_spec

#: Two rows of two seeds on the tiny synthetic catalog; enough epochs that a kill lands mid-run.
SPEC = {
    "title": "Uniform negatives against the exact softmax, tiny",
    "command": [*TINY_RUN, "dataset.num_users=400", "trainer.max_epochs=6"],
    "rows": [
        {"name": "uniform", "overrides": ["sampler=uniform", "sampler.num_negatives=8"]},
        {"name": "exact softmax", "overrides": ["sampler=full"], "reference": True},
    ],
    "seeds": [0, 1],
    "metrics": ["test/ndcg@10", "test/hr@10"],
    "validation": "val/ndcg@10",
    "code": ["recsys_midx/losses"],
}
PAGE = "# Results\n\n<!-- reproduce: tiny -->\n<!-- /reproduce: tiny -->\n\nAfter.\n"


def _reproduce(tmp_path: Path, *args: str, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "recsys_midx.app.reproduce", "tiny.yaml", "--out", "out"]
    return subprocess.Popen(
        [*command, *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def _write(tmp_path: Path, spec: dict) -> None:
    data = [f"paths.data_dir={tmp_path / 'data'}"]
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({**spec, "command": spec["command"] + data}))


@pytest.mark.slow
def test_a_killed_table_resumes_skips_its_complete_runs_and_renders(tmp_path: Path) -> None:
    _write(tmp_path, SPEC)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text(PAGE)
    runs = tmp_path / "out" / "tiny"
    first, second = runs / "uniform" / "seed-0", runs / "uniform" / "seed-1"

    killed = _reproduce(tmp_path, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (second / "checkpoints" / "last.ckpt").is_file():
        assert killed.poll() is None, killed.communicate()
        assert time.monotonic() < deadline, "the second run never checkpointed"
        time.sleep(0.1)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert (first / "results.json").is_file() and not (second / "results.json").is_file()
    done_before = (first / "results.json").stat().st_mtime_ns
    # The run that finished before the kill is already in the CSV and on the page.
    assert list(read_runs(tmp_path / "tiny.csv")["seed"]) == [0]
    assert "| uniform |" in page_block((tmp_path / "docs" / "results.md").read_text(), "tiny")

    resumed = _reproduce(tmp_path)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert "tiny: 1 of 4 runs complete, 3 to run" in out
    assert (first / "results.json").stat().st_mtime_ns == done_before  # skipped
    assert "resume=auto: resuming from" in (second / "train.log").read_text()
    saved = json.loads((second / "results.json").read_text())
    assert saved["epochs_run"] == 6 and saved["stopped_by"] in ("max_epochs", "early stopping")

    frame = read_runs(tmp_path / "tiny.csv")
    assert list(frame["row"]) == ["uniform", "uniform", "exact softmax", "exact softmax"]
    assert frame["test/ndcg@10"].notna().all() and (frame["minutes"] > 0).all()
    spec = load_spec(tmp_path / "tiny.yaml")
    curves = read_curves(spec, tmp_path / "tiny.csv")
    # One line per epoch of every run, its minutes growing, the metric the spec's.
    assert curves.groupby(["row", "seed"]).size().sum() == frame["epochs"].sum()
    assert (curves.groupby(["row", "seed"])["minutes"].diff().dropna() > 0).all()
    page = (tmp_path / "docs" / "results.md").read_text()
    block = page_block(page, "tiny")
    assert block == render_block(spec, frame, "recsys-midx-reproduce tiny.yaml", curves)
    assert "| row | best val/ndcg@10 | minutes to 90% |" in block
    assert (tmp_path / "tiny.png").stat().st_size > 0
    assert block_names(page) == ["tiny"] and page.endswith("After.\n")

    again = _reproduce(tmp_path)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "tiny: 4 of 4 runs complete, 0 to run" in out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rows": [{"name": "a", "overrides": "sampler=full"}]},
            "tiny.yaml: rows[0].overrides: give a list",
        ),
        ({"seeds": []}, "tiny.yaml: seeds: give a non-empty list of integers"),
        (
            {"rows": [{"name": "a", "overrides": [], "reference": True, "seeds": [1, 1]}]},
            "tiny.yaml: rows[0].seeds: a seed is listed twice",
        ),
        ({"max_time": "1h"}, "tiny.yaml: max_time: '1h': give DD:HH:MM:SS"),
        ({"colour": "red"}, "tiny.yaml: colour: unknown field"),
        ({"ceiling": "high"}, "tiny.yaml: ceiling: 'high': give the first metric's best"),
        ({"checked": 1234567}, "tiny.yaml: checked: 1234567: give a commit"),
        ({"validation": "test/ndcg@10"}, "tiny.yaml: validation: 'test/ndcg@10': name a valid"),
        (
            {"rows": [{"name": "bad", "overrides": ["sampler=nope"], "reference": True}]},
            "tiny: rows: bad: In 'config': Could not find 'sampler/nope'",
        ),
        (
            {
                "rows": [
                    {"name": "bce", "overrides": ["loss=bce", "sampler=full"], "reference": True}
                ]
            },
            "tiny: rows: bce: loss=bce trains on drawn negatives",
        ),
    ],
    ids=[
        "overrides",
        "seeds",
        "row-seeds",
        "max-time",
        "unknown",
        "ceiling",
        "checked",
        "validation",
        "unknown-sampler",
        "preflight",
    ],
)
def test_a_malformed_spec_stops_with_one_line_before_anything_runs(tmp_path, change, message):
    _write(tmp_path, {**SPEC, **change})
    done = _reproduce(tmp_path)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 1 and err.startswith(f"error: {message}"), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_the_dry_run_prints_every_command_and_runs_nothing(tmp_path: Path) -> None:
    _write(tmp_path, SPEC)
    done = _reproduce(tmp_path, "--dry-run")
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    commands = [line for line in out.splitlines() if line.startswith("recsys-midx-train ")]
    assert len(commands) == 4 and all("resume=auto" in line for line in commands)
    assert out.count(": missing") == 4 and not (tmp_path / "out").exists()


def test_a_row_with_its_own_seeds_runs_those_and_the_others_the_specs(tmp_path: Path) -> None:
    # A frontier of one seed a row whose best rows run again at three: the seed-0 runs are the
    # same runs (same folders) with or without the extra seeds.
    rows = [{**SPEC["rows"][0], "seeds": [0, 1, 2]}, SPEC["rows"][1]]
    spec = parse_spec("tiny", {**SPEC, "rows": rows, "seeds": [0]})
    runs = plan(spec, tmp_path, tmp_path)
    assert [run.label for run in runs] == [
        "uniform/seed-0",
        "uniform/seed-1",
        "uniform/seed-2",
        "exact-softmax/seed-0",
    ]
    assert (
        runs[0].folder
        == plan(parse_spec("tiny", {**SPEC, "seeds": [0]}), tmp_path, tmp_path)[0].folder
    )


def test_a_checked_commit_in_the_spec_goes_into_the_tables_marker() -> None:
    frame = pd.DataFrame(
        {
            "row": ["uniform", "exact softmax"],
            "commit": ["45fcc1b", "45fcc1b"],
            "dirty": [False, False],
            "date": ["2026-11-29"] * 2,
            "machine": ["2-core CPU"] * 2,
            "device": ["cpu"] * 2,
            "torch": ["2.13.0"] * 2,
            "jobs": [1, 1],
            "minutes": [1.0, 2.0],
            "epochs": [3, 4],
            "stopped_by": ["max_epochs"] * 2,
            "test/ndcg@10": [0.1, 0.2],
            "test/hr@10": [0.2, 0.3],
        }
    )
    marker = "<!-- measured: 45fcc1b{}; code: recsys_midx/losses -->"
    for checked, shown in ((None, ""), ("bb4529b", "; checked: bb4529b")):
        spec = parse_spec("tiny", {**SPEC, **({"checked": checked} if checked else {})})
        assert render_block(spec, frame, "cmd").splitlines()[1] == marker.format(shown)


def test_a_curve_keeps_the_time_of_rows_without_validation(tmp_path: Path) -> None:
    spec = parse_spec("tiny", SPEC)
    run = plan(spec, tmp_path, tmp_path)[0]
    run.folder.mkdir(parents=True)
    pd.DataFrame(
        {
            "epoch": [0.0, 0.0, 1.0],
            "train_seconds": [60.0, 30.0, 60.0],
            "val_seconds": [6.0, 0.0, 6.0],
            "val/ndcg@10": [0.1, None, 0.2],
        }
    ).to_csv(run.folder / "epochs.csv", index=False)
    curve = run_curve(spec, run)
    assert curve["minutes"].tolist() == pytest.approx([1.1, 2.7])
    assert curve["value"].tolist() == [0.1, 0.2]


def test_a_ceiling_adds_each_rows_share_of_it() -> None:
    spec = parse_spec("tiny", {**SPEC, "ceiling": 0.4})
    runs = pd.DataFrame(
        {
            "row": ["uniform", "uniform", "exact softmax"],
            "test/ndcg@10": [0.1, 0.2, 0.3],
            "test/hr@10": [0.2, 0.3, 0.4],
            "minutes": 1.0,
            "epochs": 3,
            "stopped_by": "max_epochs",
        }
    )
    header, aligns, uniform, exact = render_table(spec, runs).splitlines()
    assert "| test/hr@10 | of the ceiling (0.4000) | vs exact softmax" in header
    assert len(aligns.split("|")) == len(header.split("|"))
    assert " | 37.5% | " in uniform and " | 75.0% | reference | " in exact


def test_perplexity_tables_read_lower_as_better() -> None:
    spec = parse_spec(
        "lm",
        {
            **SPEC,
            "metrics": ["test/ppl"],
            "validation": "val/ppl",
            "rows": [
                {"name": "midx", "overrides": ["sampler=midx"]},
                {"name": "exact softmax", "overrides": ["sampler=full"], "reference": True},
            ],
        },
    )
    runs = pd.DataFrame(
        {
            "row": ["midx"] * 2 + ["exact softmax"] * 2,
            "test/ppl": [110.0, 111.0, 120.0, 121.0],
            "minutes": 1.0,
            "epochs": 3,
            "stopped_by": "max_time",
        }
    )
    assert "-10.0000 [" in render_table(spec, runs) and "] better |" in render_table(spec, runs)
    curves = pd.DataFrame(
        {
            "row": ["midx"] * 3 + ["exact softmax"] * 2,
            "seed": 0,
            "minutes": [1.0, 2.0, 3.0, 1.0, 4.0],
            "value": [150.0, 105.0, 100.0, 200.0, 110.0],
        }
    )
    # Best 100: 90% is reached at 111.1 or less, 95% at 105.3, 97% at 103.1.
    assert render_times(spec, curves).splitlines()[2:] == [
        "| midx | 100.0000 | 2.0 (1/1) | 2.0 (1/1) | 3.0 (1/1) |",
        "| exact softmax | 110.0000 | 4.0 (1/1) | – (0/1) | – (0/1) |",
    ]


def test_a_run_finished_under_another_config_trains_again_from_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_spec("tiny", SPEC)
    run = plan(spec, tmp_path / "out", tmp_path)[0]
    (run.folder / "checkpoints").mkdir(parents=True)
    (run.folder / "checkpoints" / "last.ckpt").write_bytes(b"a finished run's last epoch")
    (run.folder / "results.json").write_text(json.dumps({"config": {"an": "older config"}}))
    assert status(run) == "stale"

    # The run's process: whatever it finds in its folder is what resume=auto would read.
    found = tmp_path / "found.txt"
    script = (
        f"import os; open({str(found)!r}, 'w').write(str(sorted(os.listdir({str(run.folder)!r}))))"
    )
    monkeypatch.setattr(PlannedRun, "command", lambda self: [sys.executable, "-c", script])
    lines: list[str] = []

    assert execute([run], "cpu", report=lines.append) == []
    aside = run.folder.with_name("seed-0.stale")
    assert (aside / "checkpoints" / "last.ckpt").is_file()  # kept, not resumed from
    assert found.read_text() == str(["console.log", "environment.json"])
    assert lines[0] == f"uniform/seed-0: stale, trained again from scratch (the old run: {aside})"


def test_a_run_recorded_before_a_setting_was_added_counts_as_complete(tmp_path: Path) -> None:
    spec = parse_spec("tiny", SPEC)
    run = plan(spec, tmp_path / "out", tmp_path)[0]
    today = resolved_config(run)
    for dotted, value in ADDED_SETTINGS.items():
        # Each added setting defaults to the value that trains as the code did before it.
        *parents, key = dotted.split(".")
        node = today
        for part in parents:
            node = node[part]
        assert node[key] == value, dotted
    older = upgraded(today)
    del older["trainer"]["val_check_interval"]
    run.folder.mkdir(parents=True)
    (run.folder / "results.json").write_text(json.dumps({"config": older}))
    assert status(run) == "complete"
    # Recorded with another value of the setting, it is stale.
    older["trainer"]["val_check_interval"] = 0.5
    (run.folder / "results.json").write_text(json.dumps({"config": older}))
    assert status(run) == "stale"


#: A stand-in for a run's process: the files a finished run leaves, with NDCG@10 0.12.
_FINISHED_RUN = """
import json, pathlib
folder = pathlib.Path({folder!r})
folder.joinpath("results.json").write_text(json.dumps({{"config": {{}}, "train_wall_seconds": 60,
    "epochs_run": 2, "best_epoch": 1, "stopped_by": "max_epochs",
    "metrics": {{"test/ndcg@10": 0.12, "test/hr@10": 0.2}}}}))
folder.joinpath("epochs.csv").write_text("epoch,train_seconds,val_seconds,val/ndcg@10\\n"
    "0,30,6,0.1\\n1,30,6,0.11\\n")
"""


def test_keep_recorded_trains_only_what_neither_the_folders_nor_the_csv_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from recsys_midx.app import reproduce

    _write(tmp_path, SPEC)
    monkeypatch.chdir(tmp_path)
    spec = load_spec(tmp_path / "tiny.yaml")
    uniform_0, uniform_1, exact_0, exact_1 = plan(spec, Path("out"), Path("../shared/data"))
    # The CSV of an earlier machine: two runs whose folders are gone, one that this machine has
    # since run again (its folder wins), and a row the spec no longer has.
    recorded = [("uniform", 0, 0.11), ("exact softmax", 0, 0.31), ("exact softmax", 1, 0.99)]
    frame = pd.DataFrame(
        [
            {"row": row, "seed": seed, "commit": "45fcc1b", "test/ndcg@10": value}
            for row, seed, value in [*recorded, ("dropped", 0, 0.5)]
        ]
    )
    frame.to_csv("tiny.csv", index=False)
    curves = frame[["row", "seed"]].assign(epoch=0, minutes=1.0, value=frame["test/ndcg@10"])
    curves.to_csv("tiny.curves.csv", index=False)
    exact_1.folder.mkdir(parents=True)
    (exact_1.folder / "results.json").write_text(
        json.dumps(
            {
                "config": resolved_config(exact_1),
                "train_wall_seconds": 120,
                "epochs_run": 1,
                "best_epoch": 0,
                "stopped_by": "max_epochs",
                "metrics": {"test/ndcg@10": 0.32, "test/hr@10": 0.4},
            }
        )
    )
    (exact_1.folder / "epochs.csv").write_text(
        "epoch,train_seconds,val_seconds,val/ndcg@10\n0,60,6,0.3\n"
    )

    assert reproduce.main(["tiny.yaml", "--out", "out", "--dry-run", "--keep-recorded"]) == 0
    states = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# ")]
    assert states == [
        "# uniform/seed-0: recorded",
        "# uniform/seed-1: missing",
        "# exact-softmax/seed-0: recorded",
        "# exact-softmax/seed-1: complete",
    ]
    monkeypatch.setattr(
        PlannedRun,
        "command",
        lambda self: [sys.executable, "-c", _FINISHED_RUN.format(folder=str(self.folder))],
    )
    assert reproduce.main(["tiny.yaml", "--out", "out", "--keep-recorded"]) == 0
    assert "tiny: 3 of 4 runs complete (2 kept from tiny.csv), 1 to run" in capsys.readouterr().out
    assert not uniform_0.folder.exists() and not exact_0.folder.exists()
    assert (uniform_1.folder / "results.json").is_file()
    written = read_runs(tmp_path / "tiny.csv")
    assert list(zip(written["row"], written["seed"], written["test/ndcg@10"])) == [
        ("uniform", 0, 0.11),
        ("uniform", 1, 0.12),
        ("exact softmax", 0, 0.31),
        ("exact softmax", 1, 0.32),
    ]
    assert written["commit"].tolist()[0] == "45fcc1b"  # a kept row keeps where it ran
    drawn = read_curves(spec, tmp_path / "tiny.csv")
    assert list(zip(drawn["row"], drawn["seed"], drawn["value"])) == [
        ("uniform", 0, 0.11),
        ("uniform", 1, 0.1),
        ("uniform", 1, 0.11),
        ("exact softmax", 0, 0.31),
        ("exact softmax", 1, 0.3),
    ]
