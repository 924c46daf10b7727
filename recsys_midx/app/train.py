"""The ``recsys-midx-train`` command (and ``python train.py`` in a clone): train and test one
configuration composed by Hydra from ``recsys_midx/conf`` and the command line.

Around :func:`recsys_midx.app.experiment.train` the command sets the thread count (``threads``),
checks the settings before anything is read or written (:mod:`recsys_midx.app.preflight`), reports
a user's mistake as one ``error: ...`` line (the traceback only with ``HYDRA_FULL_ERROR=1``),
removes the run folder such a mistake leaves empty, prints how to continue a run stopped with
Ctrl-C, and hides the library warnings that every run would print.

Example:
    recsys-midx-train sampler=uniform dataset=ml-1m
    recsys-midx-train -m sampler=full,midx seed=0,1,2
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import InstantiationException
from hydra.types import RunMode
from lightning.fabric.utilities.warnings import PossibleUserWarning
from omegaconf import DictConfig

from recsys_midx.app import experiment, preflight
from recsys_midx.app.threads import apply_threads
from recsys_midx.data.errors import DataError
from recsys_midx.errors import ConfigError

#: Errors that are the user's to fix: reported as one line, without a traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError)

#: Library warnings that a run prints and that ask nothing of the user, as
#: ``(message regex, category, module regex)``: a deprecation inside Lightning itself; the test
#: of the best checkpoint, which comes from the first checkpoint callback (``model_checkpoint``;
#: ``step_checkpoint`` keeps only ``last.ckpt``); data loaders in the main process, chosen with
#: ``task.datamodule.num_workers``; a resumed run writing into its own checkpoint folder; and
#: small datasets with fewer batches per epoch than the logging interval.
HARMLESS_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        r"lightning\.pytorch\.utilities\._pytree",
    ),
    (
        r"`\.test\(ckpt_path=\"best\"\)` is called with Trainer configured with multiple "
        r"`ModelCheckpoint` callbacks",
        UserWarning,
        r"lightning\.pytorch\.",
    ),
    (r"The '\w+' does not have many workers", PossibleUserWarning, r"lightning\.pytorch\."),
    (r"Checkpoint directory .* exists and is not empty", UserWarning, r"lightning\.pytorch\."),
    (
        r"The number of training batches \(\d+\) is smaller than the logging interval",
        PossibleUserWarning,
        r"lightning\.pytorch\.",
    ),
)

#: Lightning's advertisement for its hosted logger, logged at the start of every run.
_ADVERT = re.compile(r"💡 Tip: For seamless cloud logging")
#: The loggers Lightning's ``rank_zero_info`` writes to.
_RANK_ZERO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
)


def optimized_metric(cfg: DictConfig, results: dict[str, Any]) -> float | None:
    """The value of the metric named by ``optimized_metric`` in a run's results.

    Args:
        cfg: the composed config of the run; ``cfg.optimized_metric`` names a metric of
            ``results["metrics"]`` (``${task.monitor}`` by default: ``val/ndcg@10`` for
            ``task=seqrec``, ``val/p@1`` for ``task=xc``, the best epoch's value), or is null.
        results: what :func:`~recsys_midx.app.experiment.train` returned.

    Returns:
        The metric's value, or ``None`` when ``optimized_metric`` is null.

    Raises:
        KeyError: the run's results have no such metric.

    Example:
        ```python
        value = optimized_metric(cfg, train(cfg))  # cfg.optimized_metric: val/p@1
        ```
    """
    name = cfg.get("optimized_metric")
    if not name:
        return None
    metrics = results["metrics"]
    if name not in metrics:
        raise KeyError(
            f"optimized_metric={name} is not among the run's metrics: "
            f"{', '.join(sorted(metrics)) or '(none)'}"
        )
    return float(metrics[name])


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Train and test one configuration (see :func:`~recsys_midx.app.experiment.train`).

    Args:
        cfg: the composed config (Hydra passes it; a test may pass one directly).

    Returns:
        The value of the config's ``optimized_metric`` (the task's monitored validation metric
        at the best epoch), which Hydra sweepers optimise; it is printed as well.

    Raises:
        SystemExit: with status 1 after printing ``error: ...`` for a user error (see
            :data:`USER_ERRORS`), unless ``HYDRA_FULL_ERROR=1`` asks for the traceback.
    """
    run_dir = Path(cfg.paths.output_dir)
    with user_errors_reported(run_dir), _interrupt_hint(run_dir):
        apply_threads(cfg)
        preflight.check(cfg)
        value = optimized_metric(cfg, experiment.train(cfg))
    if value is not None:
        print(f"optimized_metric {cfg.optimized_metric} = {value:.4f}")
    return value


def train() -> None:
    """The ``recsys-midx-train`` console command: :func:`main` with quiet library warnings.

    Example:
        recsys-midx-train debug=default
    """
    filter_harmless_warnings()
    main()


def filter_harmless_warnings() -> None:
    """Ignore the warnings of :data:`HARMLESS_WARNINGS` and Lightning's logger advertisement;
    any other warning still shows.

    Python's ``-W`` options and ``PYTHONWARNINGS`` come first, so ``-W default`` shows them
    again.
    """
    for message, category, module in HARMLESS_WARNINGS:
        warnings.filterwarnings(
            "ignore", message=message, category=category, module=module, append=True
        )
    for name in _RANK_ZERO_LOGGERS:
        logging.getLogger(name).addFilter(_drop_advert)


def _drop_advert(record: logging.LogRecord) -> bool:
    return not _ADVERT.match(record.getMessage())


def user_error(error: BaseException | None) -> Exception | None:
    """The user-facing error behind ``error``, or ``None`` if it is not one.

    Hydra wraps an error raised while instantiating a component in an
    :class:`~hydra.errors.InstantiationException` that names the internal config key; the
    component's own error, the cause, is what the user can act on.

    Args:
        error: an exception raised by the run.

    Returns:
        ``error`` or its cause when it is one of :data:`USER_ERRORS`, else ``None``.

    Example:
        >>> user_error(ConfigError("threads=0: give a positive integer"))
        ConfigError('threads=0: give a positive integer')
    """
    while isinstance(error, InstantiationException):
        error = error.__cause__
    return error if isinstance(error, USER_ERRORS) else None


@contextmanager
def user_errors_reported(run_dir: Path) -> Iterator[None]:
    """Report a user error raised in the block as one ``error: ...`` line and exit with status 1.

    The run folder is removed if the error left it unused (:func:`remove_if_unused`); with
    ``HYDRA_FULL_ERROR=1`` the error propagates with its traceback. Any other error propagates.

    Args:
        run_dir: the run's output folder.

    Raises:
        SystemExit: with status 1 after a user error (see :data:`USER_ERRORS`).
    """
    try:
        yield
    except Exception as error:
        cause = user_error(error)
        if cause is None:
            raise
        remove_if_unused(run_dir)
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {cause}", file=sys.stderr)
        raise SystemExit(1) from None


def remove_if_unused(run_dir: Path) -> bool:
    """Delete a run folder that holds nothing but what Hydra writes before a run starts.

    A run that stopped at a user error before training left only ``.hydra/`` and its log; a
    folder with anything else (a resumed run's checkpoints, a results file) is kept.

    Args:
        run_dir: the run's output folder.

    Returns:
        Whether it was removed.
    """
    if not run_dir.is_dir():
        return False
    for entry in run_dir.iterdir():
        unused = (
            entry.name == ".hydra"
            or (entry.is_file() and entry.suffix == ".log")
            or (entry.is_dir() and not any(entry.rglob("*")))
        )
        if not unused:
            return False
    shutil.rmtree(run_dir)
    return True


def resume_command(run_dir: Path) -> str:
    """The command line that continues this run: the original one with ``resume=auto`` and
    ``hydra.run.dir=<run_dir>`` (replacing any earlier values of those two).

    Args:
        run_dir: the run's output folder.

    Returns:
        A shell-quoted command, e.g. ``python train.py sampler=uniform resume=auto
        hydra.run.dir=/abs/outputs/2026-11-24/10-00-00``.
    """
    replaced = ("resume=", "+resume=", "hydra.run.dir=", "+hydra.run.dir=")
    args = [arg for arg in sys.argv[1:] if not arg.startswith(replaced)]
    return shlex.join([*_program(), *args, "resume=auto", f"hydra.run.dir={run_dir.resolve()}"])


def _program() -> list[str]:
    """How this process was started, before its arguments: ``python train.py``,
    ``python -m recsys_midx.app.train`` or a console command such as ``recsys-midx-train``."""
    script = sys.argv[0]
    if script.endswith(".py"):
        original = getattr(sys, "orig_argv", [sys.executable, *sys.argv])
        return list(original[: len(original) - len(sys.argv) + 1])
    name = Path(script).name
    on_path = shutil.which(name)
    same = on_path is not None and Path(on_path).resolve() == Path(script).resolve()
    return [name if same else script]


@contextmanager
def _interrupt_hint(run_dir: Path) -> Iterator[None]:
    """On Ctrl-C inside the block, print the command that continues the run.

    Lightning turns a ``KeyboardInterrupt`` during ``fit`` into ``SystemExit(1)``, so the
    interruption is recorded by a SIGINT handler rather than recognised by its exception.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted.set()
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except BaseException:
        if interrupted.is_set() and preflight.run_mode() != RunMode.MULTIRUN:
            print(
                f"\ninterrupted; to continue this run:\n  {resume_command(run_dir)}",
                file=sys.stderr,
            )
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    train()
