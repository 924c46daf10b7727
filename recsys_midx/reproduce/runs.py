"""The runs of a table spec: where each lives, whether it is done, and running the missing ones.

Each run is one ``recsys-midx-train`` process in a folder of its own, ``OUT/TABLE/ROW/seed-S``,
always started with ``resume=auto``: a run killed part way continues from its last checkpoint. A
run is complete when its folder holds a ``results.json`` whose resolved config is the one the spec
composes today; it is then skipped. One whose ``results.json`` records another config is stale: it
finished under settings that have changed since, so its folder is set aside (``seed-S.stale``) and
it trains again from scratch, never from that run's checkpoint. A setting added to the configs
since a run finished makes it stale too, unless :data:`ADDED_SETTINGS` lists it with the value that
trains as the code did before it existed: a recorded config without it is read as holding that
value, as Lightning upgrades the checkpoints of its older versions. Before it starts, a run records
where it runs (``environment.json``: commit, machine, device, torch, and how many runs shared the
machine), which the table's caption reports.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from recsys_midx.reproduce.spec import Row, TableSpec

#: A run's state: ``complete`` (skipped), ``stale`` (finished under another config: set aside and
#: trained again), ``resumable`` (a checkpoint to continue from) or ``missing``.
Status = Literal["complete", "stale", "resumable", "missing"]
#: What a stale run's folder is renamed to end with.
STALE_SUFFIX = ".stale"
#: What a run records beside its results.
ENVIRONMENT_FILE = "environment.json"
RESULTS_FILE = "results.json"
#: A run's per-epoch log (seconds and validation metrics).
EPOCHS_FILE = "epochs.csv"
#: The accelerator each spec device trains on.
_ACCELERATORS = {"cpu": "cpu", "gpu": "gpu"}
#: Settings added to the configs after tables were measured, each with the value under which the
#: code trains as it did before the setting existed; a recorded config without one is read as
#: holding that value (a test checks that each is today's default).
ADDED_SETTINGS: dict[str, Any] = {"trainer.val_check_interval": 1.0}


@dataclass(frozen=True)
class PlannedRun:
    """One run of a table: a row at a seed, its folder and its command line.

    Attributes:
        row: the table's row.
        seed: the run's seed.
        folder: where the run writes (``hydra.run.dir``).
        overrides: everything after ``train.py`` on its command line.
    """

    row: Row
    seed: int
    folder: Path
    overrides: tuple[str, ...]

    @property
    def label(self) -> str:
        """``ROW/seed-S``, as progress lines name the run."""
        return f"{self.row.slug}/seed-{self.seed}"

    @property
    def config_overrides(self) -> list[str]:
        """Its overrides of the config, without Hydra's own (``hydra.run.dir``), as
        ``compose`` takes them."""
        return [word for word in self.overrides if not word.startswith(("hydra.", "+hydra."))]

    def command(self) -> list[str]:
        """The process that trains it, with this interpreter."""
        return [sys.executable, "-m", "recsys_midx.app.train", *self.overrides]

    def shell(self) -> str:
        """The command a user would type (``--dry-run`` prints it)."""
        return " ".join(["recsys-midx-train", *(_quoted(word) for word in self.overrides)])


def plan(spec: TableSpec, out_dir: Path, data_dir: Path) -> list[PlannedRun]:
    """Every run of ``spec``, row by row and seed by seed.

    Args:
        spec: the table.
        out_dir: the folder the table's runs go under (``out_dir/TABLE/ROW/seed-S``).
        data_dir: the benchmark data folder that ``{data}`` in the spec stands for.

    Example:
        >>> from recsys_midx.reproduce.spec import parse_spec
        >>> spec = parse_spec("t", {"command": ["dataset.path={data}/x.txt"], "seeds": [3],
        ...     "rows": [{"name": "Exact softmax", "overrides": ["sampler=full"],
        ...               "reference": True}], "metrics": ["test/ndcg@10"], "code": ["x"]})
        >>> (run,) = plan(spec, Path("/out"), Path("/data"))
        >>> run.label, run.overrides[:3]
        ('exact-softmax/seed-3', ('dataset.path=/data/x.txt', 'sampler=full', 'seed=3'))
    """
    runs = []
    for row in spec.rows:
        for seed in row.seeds or spec.seeds:
            folder = (out_dir / spec.name / row.slug / f"seed-{seed}").resolve()
            overrides = [
                *(word.replace("{data}", str(data_dir)) for word in spec.command),
                *row.overrides,
                f"seed={seed}",
                f"threads={spec.threads}",
                f"trainer.accelerator={_ACCELERATORS[spec.device]}",
                *([f"++trainer.max_time={spec.max_time}"] if spec.max_time else []),
                f"paths.output_dir={folder}",
                "resume=auto",
                f"hydra.run.dir={folder}",
            ]
            runs.append(PlannedRun(row, seed, folder, tuple(overrides)))
    return runs


def resolved_config(run: PlannedRun) -> dict[str, Any]:
    """The config the run trains with, resolved, as its ``results.json`` records it."""
    with initialize_config_module("recsys_midx.conf", version_base="1.3"):
        cfg = compose("config", overrides=run.config_overrides)
    return _as_json(OmegaConf.to_container(cfg, resolve=True))


def upgraded(recorded: Any) -> Any:
    """A recorded config with every setting of :data:`ADDED_SETTINGS` it lacks filled in.

    Example:
        >>> upgraded({"trainer": {"max_epochs": 3}})
        {'trainer': {'max_epochs': 3, 'val_check_interval': 1.0}}
        >>> upgraded({"trainer": {"val_check_interval": 0.5}})["trainer"]
        {'val_check_interval': 0.5}
    """
    if not isinstance(recorded, dict):
        return recorded
    config = copy.deepcopy(recorded)
    for dotted, value in ADDED_SETTINGS.items():
        *parents, key = dotted.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node.setdefault(key, value)
    return config


def status(run: PlannedRun) -> Status:
    """Whether ``run`` is complete (a ``results.json`` of today's config), stale (a
    ``results.json`` of another), resumable (a last checkpoint in its folder) or missing."""
    results = run.folder / RESULTS_FILE
    if results.is_file():
        recorded = json.loads(results.read_text()).get("config")
        return "complete" if upgraded(recorded) == resolved_config(run) else "stale"
    if (run.folder / "checkpoints" / "last.ckpt").is_file():
        return "resumable"
    return "missing"


def execute(
    runs: Iterable[PlannedRun],
    device: str,
    jobs: int = 1,
    report: Callable[[str], None] = print,
    finished: Callable[[PlannedRun], None] | None = None,
) -> list[PlannedRun]:
    """Train ``runs``, ``jobs`` at a time, each in its own process; returns those that failed.

    Each run's output goes to ``console.log`` in its folder; ``report`` gets one line as each
    run starts and ends.

    Args:
        runs: the runs to train (complete ones should be left out; a stale one's folder is set
            aside first).
        device: the spec's device, recorded in ``environment.json``.
        jobs: how many run at once.
        report: where progress lines go.
        finished: called with each run that trained to its end, one call at a time, before the
            worker that trained it takes the next run.
    """
    one_at_a_time = threading.Lock()

    def train(run: PlannedRun) -> PlannedRun | None:
        if (run.folder / RESULTS_FILE).is_file():  # stale: resuming would train on past its end
            aside = run.folder.with_name(run.folder.name + STALE_SUFFIX)
            shutil.rmtree(aside, ignore_errors=True)
            run.folder.rename(aside)
            report(f"{run.label}: stale, trained again from scratch (the old run: {aside})")
        run.folder.mkdir(parents=True, exist_ok=True)
        where = {**environment(device), "jobs": jobs}
        (run.folder / ENVIRONMENT_FILE).write_text(json.dumps(where, indent=2))
        report(f"{run.label}: training ({run.folder})")
        with (run.folder / "console.log").open("w") as log:
            done = subprocess.run(run.command(), stdout=log, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            report(f"{run.label}: failed (exit {done.returncode}); see {run.folder}/console.log")
            return run
        report(f"{run.label}: done")
        if finished is not None:
            with one_at_a_time:
                finished(run)
        return None

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return [run for run in pool.map(train, list(runs)) if run is not None]


def environment(device: str) -> dict[str, Any]:
    """Where a run trains: the code's commit, the machine, the device and torch."""
    return {
        "commit": _commit(),
        "dirty": _dirty(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": machine(),
        "device": torch.cuda.get_device_name(0) if device == "gpu" else "cpu",
        "torch": torch.__version__,
    }


def machine() -> str:
    """The CPU model, its cores and memory, e.g. ``2-core AMD EPYC 7B13, 24 GiB``."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        model = names[0] if names else model
    memory = ""
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = f", {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB"
    return f"{os.cpu_count()}-core {model}{memory}"


def _git(*args: str) -> subprocess.CompletedProcess:
    here = Path(__file__).resolve().parent
    return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True)


def _commit() -> str | None:
    """The short commit of the checkout the package runs from, ``None`` outside one."""
    try:
        done = _git("rev-parse", "--short", "HEAD")
    except OSError:
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _dirty() -> bool:
    """Whether the checkout's package code differs from its commit."""
    try:
        done = _git("status", "--porcelain", "--", str(Path(__file__).resolve().parents[1]))
    except OSError:
        return False
    return bool(done.stdout.strip())


def _as_json(value: Any) -> Any:
    """``value`` as ``results.json`` holds it after its JSON round trip."""
    return json.loads(json.dumps(value, default=str))


def _quoted(word: str) -> str:
    return f"'{word}'" if any(char in word for char in " ${}") else word
