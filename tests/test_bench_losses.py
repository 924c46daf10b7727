"""scripts/bench_losses.py: one table row per case, the same loss from both checkouts."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_each_case_prints_its_row_with_equal_losses_from_both_checkouts() -> None:
    command = [
        sys.executable,
        "scripts/bench_losses.py",
        *("--items", "40", "--batch-size", "3", "--max-len", "6", "--repeats", "1"),
        *("--cases", "softmax:5:8", "bce:3:8", "window:10:8", "--baseline", str(ROOT)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and ":" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| softmax:5:8", "| bce:3:8", "| window:10:8"]
    for row in rows:
        this_loss, baseline_loss = row.strip(" |").split(" | ")[-2:]
        assert this_loss == baseline_loss
