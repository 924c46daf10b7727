"""Check, before a run starts, that the libraries of its chosen loggers are installed."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

INSTALL_HINT = 'pip install "recsys_midx[loggers]"'


@dataclass(frozen=True)
class Requirement:
    """A library a logger needs: met when any of ``modules`` can be imported.

    Args:
        modules: importable module names, any one of which will do.
        package: the pip package that provides the first of them.
    """

    modules: tuple[str, ...]
    package: str

    def met(self) -> bool:
        """Whether one of the modules is installed (found without importing it)."""
        return any(importlib.util.find_spec(module) is not None for module in self.modules)


#: Logger class name (the last part of its ``_target_``) -> the libraries it needs.
#: TensorBoardLogger also writes through tensorboardX; MLFlowLogger needs only MLflow's tracking
#: client, which the lighter mlflow-skinny package provides (as does the full mlflow).
LOGGER_REQUIREMENTS: dict[str, tuple[Requirement, ...]] = {
    "TensorBoardLogger": (Requirement(("tensorboard", "tensorboardX"), "tensorboard"),),
    "MLFlowLogger": (Requirement(("mlflow",), "mlflow-skinny"),),
    "WandbLogger": (Requirement(("wandb",), "wandb"),),
}

#: MLflow's database store (``tracking_uri: sqlite:///...``) needs SQLAlchemy and Alembic, which
#: mlflow-skinny leaves out.
MLFLOW_DATABASE_REQUIREMENTS = (
    Requirement(("sqlalchemy",), "sqlalchemy"),
    Requirement(("alembic",), "alembic"),
)


def logger_requirements(logger: DictConfig) -> tuple[Requirement, ...]:
    """The libraries one logger config needs beyond the core dependencies.

    Args:
        logger: one entry of the ``logger`` config, with a ``_target_``.

    Returns:
        Its requirements; none for a logger not in :data:`LOGGER_REQUIREMENTS` (the CSV logger).
    """
    name = str(logger.get("_target_", "")).rsplit(".", 1)[-1]
    requirements = LOGGER_REQUIREMENTS.get(name, ())
    if name == "MLFlowLogger" and str(logger.get("tracking_uri") or "").startswith("sqlite:"):
        requirements += MLFLOW_DATABASE_REQUIREMENTS
    return requirements


def check_logger_packages(cfg: DictConfig) -> None:
    """Refuse a run whose ``logger`` config names a logger whose library is not installed.

    Lightning would only fail when the trainer is built, after the data was prepared; this check
    fails at once.

    Args:
        cfg: a config composed from ``conf/``; its ``logger`` maps names to logger configs
            (``conf/logger``).

    Raises:
        ModuleNotFoundError: naming the ``logger`` choice and the pip package it needs.

    Example:
        ```python
        check_logger_packages(hydra.compose("config", overrides=["logger=tensorboard"]))
        ```
    """
    for name, logger in (cfg.get("logger") or {}).items():
        for requirement in logger_requirements(logger):
            if not requirement.met():
                raise ModuleNotFoundError(
                    f"{_logger_setting(name)} needs the {requirement.package} package: "
                    f"{INSTALL_HINT}",
                    name=requirement.modules[0],
                )


def _logger_setting(name: str) -> str:
    """The logger as the user chose it: ``logger=many`` (and the entry) when Hydra runs the
    app, else the config key ``logger.<name>``."""
    choice = HydraConfig.get().runtime.choices.get("logger") if HydraConfig.initialized() else None
    if choice is None:
        return f"logger.{name}"
    return f"logger={choice}" if choice == name else f"logger={choice} (its {name} entry)"
