"""recsys_midx: sampled-softmax recommenders and extreme classifiers with MIDX samplers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["load_run", "recommend"]

if TYPE_CHECKING:
    from recsys_midx.app.recommend import recommend
    from recsys_midx.app.trained import load_run

#: Public names imported on first use: they pull in torch, Lightning and Hydra.
_LAZY = {
    "recommend": "recsys_midx.app.recommend",
    "load_run": "recsys_midx.app.trained",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recsys_midx' has no attribute {name!r}")
