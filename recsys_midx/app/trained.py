"""Trained runs of ``train.py``, rebuilt from their folder with their trained weights."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from recsys_midx.app.experiment import build
from recsys_midx.app.recorded_configs import in_current_settings
from recsys_midx.lit.base import CatalogModule
from recsys_midx.protocols import CatalogDataModule

#: How many unknown ids an error message names before it only counts the rest.
_NAMED_IN_ERRORS = 10


class UnknownIdsError(KeyError):
    """Raw ids that the run's dataset does not hold; ``str()`` is one line naming them."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class IdMap:
    """Raw ids of a processed dataset's users or items and their internal ids ``1..n``.

    Raw ids are the strings of the processed ``user_map.parquet`` / ``item_map.parquet``
    (numeric raw ids are written as their decimal text); lookups accept any value whose
    ``str()`` is such a raw id.

    Attributes:
        kind: ``"user"`` or ``"item"``, for error messages.
        raw: ``object [n + 1]`` raw id of each internal id (index 0, padding, is ``None``).

    Example:
        >>> items = IdMap("item", np.array([None, "a", "b"], dtype=object))
        >>> items.internal(["b"]).tolist(), items.raw[[1]].tolist()
        ([2], ['a'])
    """

    kind: str
    raw: np.ndarray

    @cached_property
    def _lookup(self) -> dict[str, int]:
        """Internal id of each raw id, built on the first lookup: recommendations for every
        user of a large catalog only read :attr:`raw` and never pay for it."""
        return {raw_id: internal for internal, raw_id in enumerate(self.raw) if internal > 0}

    def __len__(self) -> int:
        """``n``, the number of ids (padding excluded)."""
        return len(self.raw) - 1

    def internal(self, raw_ids: Iterable[object]) -> np.ndarray:
        """Internal ids (``int64``) of raw ids, in order.

        Args:
            raw_ids: raw ids (or values whose ``str()`` is one).

        Returns:
            ``int64`` internal ids in ``1..n``.

        Raises:
            UnknownIdsError: naming the raw ids the dataset does not hold.
        """
        keys = [str(raw_id) for raw_id in raw_ids]
        unknown = list(dict.fromkeys(key for key in keys if key not in self._lookup))
        if unknown:
            named = ", ".join(repr(key) for key in unknown[:_NAMED_IN_ERRORS])
            more = len(unknown) - _NAMED_IN_ERRORS
            raise UnknownIdsError(
                f"{len(unknown)} unknown {self.kind} id(s), not in the run's dataset: {named}"
                + (f" and {more} more" if more > 0 else "")
            )
        return np.fromiter((self._lookup[key] for key in keys), dtype=np.int64, count=len(keys))

    @classmethod
    def read(cls, path: Path, kind: str) -> IdMap:
        """Read a processed id map (``<kind>_id`` and ``raw_id`` columns, ids ``1..n``)."""
        frame = pd.read_parquet(path)
        raw = np.empty(len(frame) + 1, dtype=object)
        raw[frame[f"{kind}_id"].to_numpy(np.int64)] = frame["raw_id"].to_numpy(object)
        return cls(kind, raw)


@dataclass
class LoadedRun:
    """A trained run rebuilt from its folder: its config, module (eval mode) and data.

    For sequential recommendation runs it also gives the raw <-> internal id maps and every
    user's full history (training, validation and test items), read from the split's arrays.

    Attributes:
        config: the run's config (``paths.output_dir`` is the run folder, as an absolute path).
        module: the trained module, in eval mode on the CPU.
        datamodule: the run's data module, set up.
        checkpoint: the checkpoint whose weights the module holds.
    """

    config: DictConfig
    module: CatalogModule
    datamodule: CatalogDataModule
    checkpoint: Path

    @cached_property
    def users(self) -> IdMap:
        """Raw <-> internal ids of the dataset's users (``run.users.internal(["u1"])``)."""
        return IdMap.read(self._processed_directory / "user_map.parquet", "user")

    @cached_property
    def items(self) -> IdMap:
        """Raw <-> internal ids of the catalog's items (``run.items.raw[ids]``)."""
        return IdMap.read(self._processed_directory / "item_map.parquet", "item")

    @property
    def _processed_directory(self) -> Path:
        dataset = getattr(self.datamodule, "dataset", None)
        if dataset is None or not hasattr(self.datamodule, "user_sequences"):
            raise TypeError(
                "only sequential recommendation runs (task=seqrec) have user histories and raw "
                "id maps"
            )
        return Path(dataset.directory)

    @cached_property
    def _sequences(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._processed_directory  # noqa: B018 - raises for runs without sequences
        return self.datamodule.user_sequences()

    def histories(self, user_ids: Iterable[int]) -> list[np.ndarray]:
        """Full chronological item histories (internal ids) of internal user ids.

        The full history is the user's whole sequence in the split: training items, the
        validation target and the test target (see
        :meth:`~recsys_midx.data.datamodule.SeqRecDataModule.user_sequences`).

        Args:
            user_ids: internal user ids (e.g. ``run.users.internal(["u1", "u2"])``).

        Returns:
            One ``int64`` array of internal item ids per user, oldest first.

        Raises:
            UnknownIdsError: naming users that the split dropped (too few interactions).

        Example:
            ```python
            run.histories(run.users.internal(["u1"]))[0]
            # array([12,  3, 40])
            ```
        """
        known, offsets, items = self._sequences
        user_ids = np.asarray(list(user_ids), dtype=np.int64)
        rows = np.searchsorted(known, user_ids).clip(max=max(len(known) - 1, 0))
        missing = user_ids[known[rows] != user_ids] if len(known) else user_ids
        if len(missing):
            named = ", ".join(repr(raw) for raw in self.users.raw[missing[:_NAMED_IN_ERRORS]])
            raise UnknownIdsError(
                f"{len(missing)} user(s) without a sequence in the run's split (dropped for "
                f"having too few interactions): {named}"
            )
        return [items[offsets[row] : offsets[row + 1]] for row in rows]

    def all_user_ids(self) -> np.ndarray:
        """Internal ids of every user with a sequence in the split, ascending."""
        return self._sequences[0]


def run_checkpoint(run_dir: Path) -> Path:
    """The best checkpoint of a run folder (the one ``train.py`` tested), else its last one.

    Args:
        run_dir: the run folder.

    Returns:
        ``checkpoints/best-*.ckpt`` (the latest by name), else ``checkpoints/last.ckpt``.

    Raises:
        FileNotFoundError: the folder has neither.
    """
    best = sorted((run_dir / "checkpoints").glob("best-*.ckpt"))
    if best:
        return best[-1]
    last = run_dir / "checkpoints" / "last.ckpt"
    if not last.is_file():
        raise FileNotFoundError(f"no checkpoint under {run_dir / 'checkpoints'}")
    return last


def run_config(run_dir: str | Path) -> DictConfig:
    """The config a ``train.py`` run folder was composed with (``.hydra/config.yaml``).

    Args:
        run_dir: the run folder.

    Returns:
        The config, with interpolations unresolved as saved, in today's settings
        (:func:`~recsys_midx.app.recorded_configs.in_current_settings`).

    Raises:
        FileNotFoundError: the folder has no ``.hydra/config.yaml``.
    """
    config_path = Path(run_dir) / ".hydra" / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: not a train.py run folder")
    return in_current_settings(OmegaConf.load(config_path))


def load_weights(module: CatalogModule, checkpoint: str | Path) -> None:
    """Load a checkpoint's encoder, head and objective weights into ``module``.

    The sampler is left as built: it is not needed to score, and its buffers are sized when it
    is refreshed, so loading them into a fresh sampler would fail.

    Args:
        module: a module built from the checkpoint's config.
        checkpoint: a Lightning checkpoint of that module.
    """
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    for name in ("encoder", "head", "loss"):
        prefix = f"{name}."
        module.get_submodule(name).load_state_dict(
            {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
        )


def load_run(
    run_dir: str | Path, data_dir: str | Path | None = None, checkpoint: str | Path | None = None
) -> LoadedRun:
    """Rebuild the module and data of a ``train.py`` run folder with its trained weights.

    The folder must hold ``.hydra/config.yaml`` and ``checkpoints/`` (or ``checkpoint`` be
    given). Nothing is written into the run folder: the run is rebuilt with
    :func:`recsys_midx.app.experiment.build` writing into a temporary folder that is removed before
    this returns. The processed dataset is read from (and, if missing, built into) the data
    folder of the run's config.

    Args:
        run_dir: the run folder.
        data_dir: where the run's dataset lives, if not where its config says.
        checkpoint: the checkpoint to load; default: the run's best one (the one ``train.py``
            tested), else its ``last.ckpt``.

    Returns:
        The rebuilt run, module in eval mode on the CPU.

    Raises:
        FileNotFoundError: if the config or a checkpoint is missing.

    Example:
        ```python
        run = load_run("outputs/2026-01-01/12-00-00")
        run.histories(run.users.internal(["u1"]))
        ```
    """
    run_dir = Path(run_dir).resolve()
    cfg = run_config(run_dir)
    checkpoint = Path(checkpoint).resolve() if checkpoint is not None else run_checkpoint(run_dir)
    if data_dir is not None:
        OmegaConf.update(cfg, "paths.data_dir", str(data_dir))
    cfg.logger = None
    with tempfile.TemporaryDirectory(prefix="recsys-midx-load-") as scratch:
        OmegaConf.update(cfg, "paths.output_dir", scratch)
        experiment = build(cfg)
    OmegaConf.update(cfg, "paths.output_dir", str(run_dir))
    module = experiment.module
    load_weights(module, checkpoint)
    module.eval()
    return LoadedRun(cfg, module, experiment.datamodule, checkpoint)


#: What :func:`as_loaded_run` accepts: a run folder or an already loaded run.
RunLike = str | Path | LoadedRun


def as_loaded_run(run: RunLike) -> LoadedRun:
    """``run`` itself if already loaded, else :func:`load_run` of the folder."""
    return run if isinstance(run, LoadedRun) else load_run(run)


__all__ = [
    "IdMap",
    "LoadedRun",
    "RunLike",
    "UnknownIdsError",
    "as_loaded_run",
    "load_run",
    "load_weights",
    "run_checkpoint",
    "run_config",
]
