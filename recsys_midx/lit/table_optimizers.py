"""Row-wise optimizers for item tables with sparse gradients, the optimizer that steps them with
the dense one, and the rules of ``task.module.table_optimizer``.

A sampled step reads a few rows of the item table; with ``task.module.table_optimizer`` set,
the table's gradient holds those rows only
(:meth:`~recsys_midx.models.SequenceEncoder.use_sparse_gradients`) and its optimizer updates
them alone: ``sparse_adam`` is :class:`torch.optim.SparseAdam` (lazy Adam: two moments per
entry, updated only where the gradient is), ``rowwise_adagrad`` is :class:`RowwiseAdagrad` (one
accumulator per row). The encoder and the head keep the dense
optimizer; :class:`TableAndDenseOptimizer` steps both as the one optimizer Lightning's automatic
optimization drives, and checkpoints both states.

The rules live here once: what a sparse update cannot serve (:func:`sparse_update_conflict`),
what ``auto`` chooses (:func:`resolve_table_optimizer`) and each optimizer's default learning
rate (:func:`default_table_lr`). The Lightning module, the pre-flight checks of
:mod:`recsys_midx.app.preflight` and the docs read them from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from recsys_midx.errors import ConfigError


class RowwiseAdagrad(torch.optim.Optimizer):
    """AdaGrad with one accumulator per row, for tables with sparse gradients.

    For each row ``i`` a step touches, with gradient row ``g_i`` of width ``D``:
    ``s_i += mean(g_i ** 2)`` and ``w_i -= lr * g_i / (sqrt(s_i) + eps)``. Rows the step does not
    touch keep their weights and accumulators. The state is one float32 per row (``sum``),
    against two moments per entry for Adam: the choice of large embedding tables in TorchRec and
    FBGEMM.

    Args:
        params: tables ``[R, D]`` (or parameter groups) whose gradients are sparse.
        lr: the step size.
        eps: added to the root of the accumulator.

    Raises:
        ValueError: if ``lr`` or ``eps`` is not positive.

    Example:
        >>> table = nn.Parameter(torch.ones(4, 2))
        >>> optimizer = RowwiseAdagrad([table], lr=0.5)
        >>> nn.functional.embedding(torch.tensor([1]), table, sparse=True).sum().backward()
        >>> optimizer.step()
        >>> table[:, 0].tolist(), optimizer.state[table]["sum"].tolist()
        ([1.0, 0.5, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0])
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.01, eps: float = 1e-8) -> None:
        if lr <= 0 or eps <= 0:
            raise ValueError(f"lr and eps must be > 0, got lr={lr}, eps={eps}")
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Update the rows of each table that its sparse gradient holds.

        Raises:
            RuntimeError: for a dense gradient (some lookup of the table did not ask for a
                sparse one).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for table in group["params"]:
                if table.grad is None:
                    continue
                if not table.grad.is_sparse:
                    raise RuntimeError(
                        "RowwiseAdagrad needs sparse gradients: look the table up with sparse=True"
                    )
                grad = table.grad.coalesce()
                rows, values = grad.indices()[0], grad.values().float()
                state = self.state[table]
                if not state:
                    state["sum"] = torch.zeros(
                        table.shape[0], dtype=torch.float32, device=table.device
                    )
                sums = state["sum"].index_select(0, rows) + values.square().mean(dim=1)
                state["sum"].index_copy_(0, rows, sums)
                scale = -group["lr"] / (sums.sqrt() + group["eps"])
                table.index_add_(0, rows, (values * scale[:, None]).to(table.dtype))
        return loss


def build_table_optimizer(
    name: str, tables: list[nn.Parameter], lr: float
) -> torch.optim.Optimizer:
    """The row-wise optimizer ``name`` (one of :data:`TABLE_OPTIMIZERS`) of ``tables``."""
    return _BUILDERS[name](tables, lr=lr)


def default_table_lr(name: str, dense_lr: float) -> float:
    """The learning rate of table optimizer ``name`` when ``task.module.table_lr`` is null.

    Lazy Adam takes the dense optimizer's rate. AdaGrad's steps shrink with each row's summed
    squared gradients, so row-wise AdaGrad takes :data:`ROWWISE_ADAGRAD_LR`, the rate its
    comparison with dense Adam was measured at (docs/archive/results-2026-11.md, "Sparse item-table
    updates").

    Args:
        name: one of :data:`TABLE_OPTIMIZERS`.
        dense_lr: the learning rate of the encoder's optimizer.

    Example:
        >>> default_table_lr("sparse_adam", 0.001), default_table_lr("rowwise_adagrad", 0.001)
        (0.001, 0.05)
    """
    return ROWWISE_ADAGRAD_LR if name == "rowwise_adagrad" else dense_lr


class TableAndDenseOptimizer(torch.optim.Optimizer):
    """One optimizer made of two: the dense parameters' and the item tables'.

    :meth:`step` evaluates the closure once (forward and backward) and steps both;
    ``param_groups`` are both optimizers' groups (the same dictionaries, so a learning-rate
    schedule reaches both), ``state`` a view of both states, and :meth:`state_dict` holds both,
    so a checkpoint resumes each.

    Args:
        dense: the optimizer of the encoder and the head (dense gradients).
        table: the optimizer of the tables (sparse gradients).

    Example:
        >>> dense, table = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(3, 2))
        >>> optimizer = TableAndDenseOptimizer(torch.optim.Adam([dense], lr=0.1),
        ...                                    RowwiseAdagrad([table], lr=0.1))
        >>> sorted(optimizer.state_dict())
        ['dense', 'table']
    """

    def __init__(self, dense: torch.optim.Optimizer, table: torch.optim.Optimizer) -> None:
        params = [
            p for opt in (dense, table) for group in opt.param_groups for p in group["params"]
        ]
        super().__init__(params, {})
        self.dense, self.table = dense, table
        self.param_groups = dense.param_groups + table.param_groups
        self.state = _States(dense, table)  # type: ignore[assignment]

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Run ``closure`` once, then step the dense and the table optimizer."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.dense.step()
        self.table.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"dense": self.dense.state_dict(), "table": self.table.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.dense.load_state_dict(state_dict["dense"])
        self.table.load_state_dict(state_dict["table"])
        # Loading replaces the children's groups. Update this view in place: a wrapper
        # (Lightning's) may hold the same list.
        self.param_groups[:] = self.dense.param_groups + self.table.param_groups


class _States(MutableMapping[Tensor, Any]):
    """The per-parameter states of several optimizers as one mapping. Unlike a ``ChainMap`` of
    their ``defaultdict`` states, reading a parameter adds it to no optimizer's state."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    def _owner(self, key: Tensor) -> MutableMapping[Tensor, Any]:
        for optimizer in self.optimizers:
            if key in optimizer.state:
                return optimizer.state
        raise KeyError(key)

    def __getitem__(self, key: Tensor) -> Any:
        return self._owner(key)[key]

    def __setitem__(self, key: Tensor, value: Any) -> None:
        self._owner(key)[key] = value

    def __delitem__(self, key: Tensor) -> None:
        del self._owner(key)[key]

    def __iter__(self) -> Iterator[Tensor]:
        return (key for optimizer in self.optimizers for key in optimizer.state)

    def __len__(self) -> int:
        return sum(len(optimizer.state) for optimizer in self.optimizers)


_BUILDERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sparse_adam": torch.optim.SparseAdam,
    "rowwise_adagrad": RowwiseAdagrad,
}
#: The values of ``task.module.table_optimizer`` that give the tables sparse gradients.
TABLE_OPTIMIZERS: tuple[str, ...] = tuple(_BUILDERS)
#: Row-wise AdaGrad's learning rate when ``task.module.table_lr`` is null.
ROWWISE_ADAGRAD_LR = 0.05
#: ``task.module.table_optimizer=auto``: :data:`AUTO_SPARSE_OPTIMIZER` wherever a sparse update
#: can go (:func:`resolve_table_optimizer`), else the dense optimizer.
AUTO_TABLE_OPTIMIZER = "auto"
#: What ``auto`` picks: the sparse update that trained best in docs/archive/results-2026-11.md
#: ("Sparse item-table updates") and holds the least memory.
AUTO_SPARSE_OPTIMIZER = "rowwise_adagrad"


@dataclass(frozen=True)
class TableNeeds:
    """What a run asks of its item tables' update, as far as a sparse one is concerned.

    Attributes:
        exact_softmax: the loss is the exact softmax over the catalog (``negatives=none`` with a
            softmax loss), which reads every row.
        gradient_clip_val: ``trainer.gradient_clip_val`` (torch computes no norm of a sparse
            gradient).
        weight_decay: the dense optimizer's ``weight_decay`` (the row-wise optimizers have
            none, so the tables would silently go without).
        grad_through_stats: ``loss.grad_through_stats`` (EDRep's statistics read the whole
            table with a gradient).
        nccl: the run reduces gradients over NCCL across processes, which all-reduces no sparse
            tensor outside NCCLX builds.
    """

    exact_softmax: bool = False
    gradient_clip_val: float | None = None
    weight_decay: float = 0.0
    grad_through_stats: bool = False
    nccl: bool = False


def sparse_update_conflict(name: str, needs: TableNeeds) -> str | None:
    """Why the sparse table optimizer ``name`` cannot serve a run, in one line naming the
    settings as the user writes them; ``None`` when it can.

    Example:
        >>> sparse_update_conflict("rowwise_adagrad", TableNeeds(weight_decay=0.01))[:45]
        'task.module.optimizer.weight_decay=0.01 would'
        >>> sparse_update_conflict("rowwise_adagrad", TableNeeds()) is None
        True
    """
    setting = f"task.module.table_optimizer={name}"
    if needs.exact_softmax:
        return (
            f"{setting} needs a sampled objective: the exact softmax (negatives=none, "
            "sampler=full) reads every row of the item table; choose a sampler or "
            "task.module.table_optimizer=null"
        )
    if needs.gradient_clip_val:
        return (
            f"trainer.gradient_clip_val={needs.gradient_clip_val} cannot clip the sparse gradients "
            f"of {setting}: set trainer.gradient_clip_val=null or task.module.table_optimizer=null"
        )
    if needs.weight_decay:
        return (
            f"task.module.optimizer.weight_decay={needs.weight_decay} would not reach the item "
            f"table under {setting}: set it to 0 or task.module.table_optimizer=null"
        )
    if needs.grad_through_stats:
        return (
            f"loss.grad_through_stats=true reads the whole item table with a gradient, which "
            f"{setting} cannot update: set loss.grad_through_stats=false"
        )
    if needs.nccl:
        return (
            f"{setting} gives the item table sparse gradients, which NCCL does not all-reduce "
            "across processes: set task.module.table_optimizer=null (or auto, which chooses it "
            "there)"
        )
    return None


def resolve_table_optimizer(name: str | None, needs: TableNeeds) -> str | None:
    """The table optimizer a run trains with: ``name`` as set, or for ``auto``
    :data:`AUTO_SPARSE_OPTIMIZER` unless the run asks what a sparse update cannot do
    (:func:`sparse_update_conflict`), where ``auto`` keeps the dense update (``None``).

    Example:
        >>> resolve_table_optimizer("auto", TableNeeds()), resolve_table_optimizer(
        ...     "auto", TableNeeds(exact_softmax=True))
        ('rowwise_adagrad', None)
    """
    if name != AUTO_TABLE_OPTIMIZER:
        return name
    return None if sparse_update_conflict(AUTO_SPARSE_OPTIMIZER, needs) else AUTO_SPARSE_OPTIMIZER


def check_table_optimizer(name: str | None, needs: TableNeeds) -> None:
    """Refuse an unknown table optimizer, or a sparse one the run cannot use.

    Args:
        name: ``task.module.table_optimizer``: ``None``, ``auto`` or one of
            :data:`TABLE_OPTIMIZERS`.
        needs: what the run asks of the table.

    Raises:
        ConfigError: one line naming the setting and how to fix it.
    """
    if name is None or name == AUTO_TABLE_OPTIMIZER:
        return
    if name not in TABLE_OPTIMIZERS:
        choices = ", ".join([AUTO_TABLE_OPTIMIZER, "null", *TABLE_OPTIMIZERS[:-1]])
        raise ConfigError(
            f"task.module.table_optimizer={name}: choose {choices} or {TABLE_OPTIMIZERS[-1]}"
        )
    conflict = sparse_update_conflict(name, needs)
    if conflict:
        raise ConfigError(conflict)
