"""Sparse item-table updates: the row-wise optimizers against re-derivations, a sampled step
that changes only the rows it read, the default (`auto`) and the dense update left as it was."""

from __future__ import annotations

import functools

import lightning as L
import pytest
import torch
from conftest import TINY_RUN, TINY_XC_RUN, sampler_overrides
from torch import nn

from recsys_midx.app.experiment import build
from recsys_midx.errors import ConfigError
from recsys_midx.heads import DotHead
from recsys_midx.lit import SeqRecModule
from recsys_midx.lit.table_optimizers import (
    ROWWISE_ADAGRAD_LR,
    RowwiseAdagrad,
    TableAndDenseOptimizer,
    TableNeeds,
    resolve_table_optimizer,
    sparse_update_conflict,
)
from recsys_midx.losses import SoftmaxLoss
from recsys_midx.models import SASRec
from recsys_midx.samplers import UniformSampler
from recsys_midx.scoring import lookup_rows, mark_sparse_rows

ROWS, DIM, STEPS = 12, 4, 5


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step: ids with repeats (their gradients add up) and the weights of a linear loss."""
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randint(1, ROWS, (7,), generator=generator),
            torch.randn(7, DIM, generator=generator, dtype=torch.float64),
        )
        for _ in range(STEPS)
    ]


def _train(optimizer_class: type[torch.optim.Optimizer], **options: float) -> torch.Tensor:
    """The float32 table after STEPS sparse steps of ``optimizer_class``."""
    table = nn.Parameter(torch.linspace(-1, 1, ROWS * DIM).view(ROWS, DIM))
    mark_sparse_rows(table)
    optimizer = optimizer_class([table], **options)
    for ids, weights in _batches():
        optimizer.zero_grad()
        (lookup_rows(table, ids) * weights.float()).sum().backward()
        assert table.grad.is_sparse
        optimizer.step()
    return table.detach()


def _row_gradients(ids: torch.Tensor, weights: torch.Tensor) -> dict[int, torch.Tensor]:
    rows: dict[int, torch.Tensor] = {}
    for i, w in zip(ids.tolist(), weights):
        rows[i] = rows.get(i, torch.zeros(DIM, dtype=torch.float64)) + w
    return rows


def test_sparse_adam_is_lazy_adam_in_float64():
    lr, (beta1, beta2), eps = 0.05, (0.9, 0.999), 1e-8
    table = torch.linspace(-1, 1, ROWS * DIM, dtype=torch.float64).view(ROWS, DIM)
    m, v = torch.zeros_like(table), torch.zeros_like(table)
    for step, (ids, weights) in enumerate(_batches(), start=1):
        for i, g in _row_gradients(ids, weights).items():  # only the rows the step touched
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat, v_hat = m[i] / (1 - beta1**step), v[i] / (1 - beta2**step)
            table[i] -= lr * m_hat / (v_hat.sqrt() + eps)
    trained = _train(torch.optim.SparseAdam, lr=lr)
    torch.testing.assert_close(trained.double(), table, atol=1e-6, rtol=1e-6)


def test_rowwise_adagrad_matches_a_rederivation():
    lr, eps = 0.1, 1e-8
    table = torch.linspace(-1, 1, ROWS * DIM, dtype=torch.float64).view(ROWS, DIM)
    accumulator = torch.zeros(ROWS, dtype=torch.float64)
    for ids, weights in _batches():
        for i, g in _row_gradients(ids, weights).items():
            accumulator[i] += (g * g).mean()
            table[i] -= lr * g / (accumulator[i].sqrt() + eps)
    trained = _train(RowwiseAdagrad, lr=lr, eps=eps)
    torch.testing.assert_close(trained.double(), table, atol=1e-6, rtol=1e-6)


def test_rowwise_adagrad_refuses_a_dense_gradient():
    table = nn.Parameter(torch.ones(3, 2))
    table.sum().backward()
    with pytest.raises(RuntimeError, match="needs sparse gradients"):
        RowwiseAdagrad([table]).step()


def _first_step(compose_config, overrides: list[str]):
    """A built module after one training step by hand, with the table before the step, the
    rows its gradient held and the optimizer."""
    experiment = build(compose_config(overrides))
    module = experiment.module
    table = module.encoder.item_table
    module.rebuild_indexes(experiment.datamodule.item_counts)
    optimizer = module.configure_optimizers()
    batch = next(iter(experiment.datamodule.train_dataloader()))
    optimizer.zero_grad()
    if "labels" in batch:
        loss = module.objective(module.encode(batch), batch["labels"])
        read = batch["labels"]
    else:
        query, targets, windows, positions = module.training_batch(batch)
        loss = module.objective(query, targets, windows, positions)
        read = windows.flatten()
    before = table.detach().clone()
    loss.backward()
    return module, optimizer, before, read[read > 0].unique()


@pytest.mark.parametrize("table_optimizer", ["sparse_adam", "rowwise_adagrad"])
@pytest.mark.parametrize(
    "overrides",
    [
        [*TINY_RUN, *sampler_overrides("uniform")],
        [*TINY_RUN, *sampler_overrides("midx_plain")],
        [*TINY_RUN, *sampler_overrides("uniform"), "negatives=shared", "head=mos"],
        [*TINY_RUN, *sampler_overrides("uniform"), "loss=edrep"],
        [*TINY_RUN, *sampler_overrides("uniform"), "loss=bce"],
        [*TINY_RUN, *sampler_overrides("uniform"), "loss=sce"],
        [*TINY_XC_RUN, *sampler_overrides("uniform")],
    ],
    ids=["uniform", "midx_plain", "shared-mos", "edrep", "bce", "sce", "xc"],
)
def test_a_sampled_step_changes_only_the_rows_it_read(compose_config, overrides, table_optimizer):
    module, optimizer, before, read = _first_step(
        compose_config, [*overrides, f"task.module.table_optimizer={table_optimizer}"]
    )
    table = module.encoder.item_table
    assert isinstance(optimizer, TableAndDenseOptimizer)
    assert all(
        p.grad is None or not p.grad.is_sparse
        for g in optimizer.dense.param_groups
        for p in g["params"]
    )
    assert table.grad.is_sparse
    touched = table.grad.coalesce().indices()[0].unique()
    assert set(read.tolist()) <= set(touched.tolist())
    assert 0 not in touched.tolist()
    optimizer.step()
    untouched = torch.ones(table.shape[0], dtype=torch.bool)
    untouched[touched] = False
    assert untouched.any()
    assert torch.equal(table.detach()[untouched], before[untouched])
    assert not torch.equal(table.detach()[touched], before[touched])
    state = optimizer.table.state[table]
    if table_optimizer == "rowwise_adagrad":  # one float per row, non-zero where touched
        assert set(state) == {"sum"} and state["sum"].shape == (table.shape[0],)
        assert bool((state["sum"][touched] > 0).all()) and not state["sum"][untouched].any()
    else:
        assert not state["exp_avg"][untouched].any() and not state["exp_avg_sq"][untouched].any()


def test_default_sampled_run_updates_the_table_by_rowwise_adagrad(compose_config):
    module, optimizer, _, _ = _first_step(
        compose_config, [*TINY_RUN, *sampler_overrides("uniform")]
    )
    assert isinstance(optimizer, TableAndDenseOptimizer)
    assert isinstance(optimizer.table, RowwiseAdagrad)
    assert [g["lr"] for g in optimizer.table.param_groups] == [ROWWISE_ADAGRAD_LR]
    assert [g["lr"] for g in optimizer.dense.param_groups] == [0.001]
    assert module.encoder.item_table.grad.is_sparse


@pytest.mark.parametrize(
    ("name", "lr"), [("sparse_adam", 0.001), ("rowwise_adagrad", ROWWISE_ADAGRAD_LR)]
)
def test_a_named_table_optimizer_takes_its_default_rate_unless_table_lr_is_set(
    compose_config, name, lr
):
    run = [*TINY_RUN, *sampler_overrides("uniform"), f"task.module.table_optimizer={name}"]
    _, optimizer, _, _ = _first_step(compose_config, run)
    assert [g["lr"] for g in optimizer.table.param_groups] == [lr]
    _, optimizer, _, _ = _first_step(compose_config, [*run, "task.module.table_lr=0.3"])
    assert [g["lr"] for g in optimizer.table.param_groups] == [0.3]


def test_dense_update_keeps_one_optimizer_over_every_parameter(compose_config):
    module, optimizer, _, _ = _first_step(
        compose_config,
        [*TINY_RUN, *sampler_overrides("uniform"), "task.module.table_optimizer=null"],
    )
    assert type(optimizer) is torch.optim.Adam
    assert [p for g in optimizer.param_groups for p in g["params"]] == list(module.parameters())
    assert not module.encoder.item_table.grad.is_sparse


def test_composite_checkpoints_both_states(compose_config):
    overrides = [
        *TINY_RUN,
        *sampler_overrides("uniform"),
        "task.module.table_optimizer=sparse_adam",
    ]
    module, optimizer, _, _ = _first_step(compose_config, overrides)
    optimizer.step()
    saved = optimizer.state_dict()
    _, restored, _, _ = _first_step(compose_config, overrides)
    restored.load_state_dict(saved)
    assert restored.state_dict()["table"]["state"][0]["step"] == 1
    assert len(restored.state) == len(optimizer.state)
    assert [g["lr"] for g in restored.param_groups] == [g["lr"] for g in optimizer.param_groups]


def _sparse_module(**adam: float) -> SeqRecModule:
    return SeqRecModule(
        SASRec(num_items=30, dim=8, max_len=5),
        DotHead(),
        UniformSampler(30, 4),
        SoftmaxLoss(),
        functools.partial(torch.optim.Adam, **adam),
        table_optimizer="rowwise_adagrad",
    )


def test_the_module_refuses_what_a_sparse_table_cannot_serve_in_one_line() -> None:
    # Through the Python API too, without a pre-flight: weight decay would silently skip the
    # table, clipping would fail with torch's bare NotImplementedError on a sparse gradient.
    decayed = _sparse_module(weight_decay=0.01)
    with pytest.raises(ConfigError, match=r"^task\.module\.optimizer\.weight_decay=0\.01 would"):
        decayed.configure_optimizers()
    clipped = _sparse_module()
    clipped.trainer = L.Trainer(gradient_clip_val=1.0, accelerator="cpu", logger=False)
    with pytest.raises(ConfigError, match=r"^trainer\.gradient_clip_val=1\.0 cannot clip"):
        clipped.configure_optimizers()
    with pytest.raises(ConfigError, match=r"needs a sampled objective: the exact softmax"):
        SeqRecModule(
            SASRec(num_items=30, dim=8, max_len=5),
            DotHead(),
            None,
            SoftmaxLoss(),
            functools.partial(torch.optim.Adam),
            table_optimizer="sparse_adam",
        )
    _sparse_module().configure_optimizers()  # neither: the composite optimizer


def test_auto_keeps_the_dense_update_where_a_sparse_one_cannot_go() -> None:
    for needs in (
        TableNeeds(exact_softmax=True),
        TableNeeds(gradient_clip_val=0.5),
        TableNeeds(weight_decay=1e-4),
        TableNeeds(grad_through_stats=True),
        TableNeeds(nccl=True),
    ):
        assert resolve_table_optimizer("auto", needs) is None, needs
        assert sparse_update_conflict("rowwise_adagrad", needs) is not None, needs
    assert resolve_table_optimizer("auto", TableNeeds()) == "rowwise_adagrad"
    assert resolve_table_optimizer("sparse_adam", TableNeeds()) == "sparse_adam"
    assert resolve_table_optimizer(None, TableNeeds()) is None
