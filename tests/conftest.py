"""Shared test helpers: compose the real Hydra configs for tiny, fast runs."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import pytest

# One thread per pytest-xdist worker (`pytest -n auto` runs one worker per core), for
# torch, faiss and every train.py a test starts, so the workers' thread pools do not contend for
# the same cores; a value the caller exported stays. Set before torch loads its OpenMP runtime.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

import torch  # noqa: E402
from hydra import compose, initialize_config_dir
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from recsys_midx.data.datamodule import SeqRecDataModule
from recsys_midx.heads import DotHead, HeadOutput
from recsys_midx.lit import SeqRecModule
from recsys_midx.losses import SoftmaxLoss
from recsys_midx.negatives import NoNegatives, PerQuery, QueryBatch
from recsys_midx.protocols import NegativeSampler, NegativesStrategy, Objective
from recsys_midx.samplers import Sampler

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "recsys_midx" / "conf"


def load_script(name: str) -> ModuleType:
    """The module of ``scripts/<name>.py`` (scripts are not a package), loaded once per call."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Items (or labels) of the tiny runs' catalogs, at most.
TINY_CATALOG = 80
#: Overrides that make a whole train + test run take a few seconds.
TINY_RUN = (
    "dataset.num_users=120",
    f"dataset.num_items={TINY_CATALOG}",
    "model.dim=16",
    "model.max_len=12",
    "trainer.max_epochs=2",
    "trainer.accelerator=cpu",
    "task.datamodule.batch_size=32",
    # One window per user: the cheapest epoch (the default, windows, is tested on its own).
    "task.datamodule.train_samples=last_window",
    "callbacks.progress_bar.refresh_rate=0",
)
#: A few optimiser steps and one evaluation batch per split: enough to exercise the wiring.
FEW_STEPS = (
    "trainer.max_epochs=1",
    "++trainer.limit_train_batches=3",
    "++trainer.limit_val_batches=1",
    "++trainer.limit_test_batches=1",
    "logger=none",
)
#: Overrides that make an extreme classification run take a few seconds.
TINY_XC_RUN = (
    "task=xc",
    f"dataset.num_labels={TINY_CATALOG}",
    "dataset.num_features=300",
    "dataset.num_train=300",
    "dataset.num_test=100",
    "dataset.num_topics=8",
    "model.dim=16",
    "model.hidden=[32]",
    "trainer.max_epochs=2",
    "trainer.accelerator=cpu",
    "task.datamodule.batch_size=64",
    "task.datamodule.eval_batch_size=64",
    "callbacks.progress_bar.refresh_rate=0",
)


def pytest_report_header(config: pytest.Config) -> str:
    """Say in every run's header whether the slow tests (``@pytest.mark.slow``) are selected."""
    selection = config.getoption("markexpr") or "all tests, slow ones included"
    return f"marker selection: {selection} (quick loop: -m 'not slow'; only the slow: -m slow)"


def run_train(
    *overrides: str, env: Mapping[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python train.py OVERRIDES`` from the repository root, its output captured as text.

    Args:
        overrides: the command-line arguments after ``train.py``.
        env: variables added to (or replacing those of) this process's environment.
        timeout: seconds before the run is killed and the test fails.

    Returns:
        The finished process (``returncode``, ``stdout``, ``stderr``).
    """
    return subprocess.run(
        [sys.executable, "train.py", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def exact_softmax_module(encoder: torch.nn.Module) -> SeqRecModule:
    """``encoder`` trained by the exact softmax with a dot head (Adam), in evaluation mode: the
    training step of a module built by hand, without configs."""
    return SeqRecModule(
        encoder, DotHead(), None, SoftmaxLoss(), functools.partial(torch.optim.Adam)
    ).eval()


def drawn_loss(
    loss: Objective,
    output: HeadOutput,
    targets: torch.Tensor,
    item_emb: torch.Tensor,
    sampler: NegativeSampler | None = None,
    strategy: NegativesStrategy | None = None,
    windows: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """``loss`` of a batch on the negatives ``strategy`` draws from ``sampler``, as a training
    step computes it (default: per query with a sampler, the whole catalog without)."""
    if strategy is None:
        strategy = NoNegatives() if sampler is None else PerQuery()
    batch = QueryBatch(output.queries, targets, windows, positions, item_emb.shape[0] - 1)
    return loss(output, targets, item_emb, strategy(batch, sampler, loss.corrects_by_log_q))


def sampler_config_class(name: str) -> type[Sampler] | None:
    """The sampler class that ``sampler=NAME`` builds (a variant's, its base config's);
    ``None`` for ``sampler=full``, which builds none."""
    config = OmegaConf.load(CONF_DIR / "sampler" / f"{name}.yaml")
    if "sampler" in config:  # a global-package config: sampler=full, the exact softmax
        return None
    while "_target_" not in config:
        (base,) = config.defaults
        config = OmegaConf.load(CONF_DIR / "sampler" / f"{base}.yaml")
    return get_class(config._target_)


def sampler_overrides(sampler: str, num_items: int = TINY_CATALOG) -> list[str]:
    """Select ``sampler`` with the settings it declares for a catalog of ``num_items`` items
    (:meth:`~recsys_midx.samplers.Sampler.settings_for`; by default the tiny runs')."""
    kind = sampler_config_class(sampler)
    settings = {} if kind is None else kind.settings_for(num_items)
    return [f"sampler={sampler}", *(f"sampler.{name}={value}" for name, value in settings.items())]


def check_leave_one_out(
    module: SeqRecDataModule, sequences: Mapping[int, Sequence[int]]
) -> dict[str, dict]:
    """Assert that a set-up data module holds out each user's last two items of ``sequences``
    (ids as in the file, users in order) and tests on the rest; returns its first validation
    and test batches, ``{"val": ..., "test": ...}``."""
    val = next(iter(module.val_dataloader()))
    test = next(iter(module.test_dataloader()))
    assert val["targets"].tolist() == [items[-2] for items in sequences.values()]
    assert test["targets"].tolist() == [items[-1] for items in sequences.values()]
    for row, items in enumerate(sequences.values()):
        inputs = test["inputs"][row]
        assert inputs[inputs > 0].tolist() == list(items[:-1])
    return {"val": val, "test": test}


@pytest.fixture
def compose_config(tmp_path: Path) -> Callable[..., DictConfig]:
    """Compose ``recsys_midx/conf/config.yaml`` with overrides; outputs and data go under
    ``tmp_path``."""

    def _compose(overrides: Sequence[str] = ()) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(
                "config",
                overrides=[
                    f"paths.output_dir={tmp_path / 'run'}",
                    f"paths.data_dir={tmp_path / 'data'}",
                    *overrides,
                ],
            )

    return _compose
