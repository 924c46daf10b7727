"""Multi-process (DDP, gloo on CPU) runs: one proposal on every rank, evaluation equal to one
process's, and sweeps that refuse to start DDP.

Marked ``ddp``: ``pytest -m "not ddp"`` skips them; they skip themselves where torch has no gloo.
"""

from __future__ import annotations

import copy
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ROOT, TINY_RUN, TINY_XC_RUN, run_train, sampler_overrides

from recsys_midx.app.experiment import build
from recsys_midx.distributed import (
    broadcast_module_state,
    eval_sampler,
    raise_on_every_rank,
)
from recsys_midx.heads import DotHead
from recsys_midx.lit.table_optimizers import RowwiseAdagrad, TableAndDenseOptimizer
from recsys_midx.losses import MultiLabelSoftmaxLoss, SoftmaxLoss
from recsys_midx.models import SASRec, XCEncoder
from recsys_midx.negatives import Negatives, exact_positive_log_q
from recsys_midx.samplers import MIDXSampler, PopularitySampler

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ddp,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with the gloo backend is not available",
    ),
]

NUM_ITEMS = 3000
#: An odd user count: two ranks get 61 and 60 users, so a padded shard would repeat one.
DDP_RUN = (*TINY_RUN, "trainer.max_epochs=1", "dataset.num_users=121", *sampler_overrides("midx"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _samplers() -> dict[str, torch.nn.Module]:
    return {
        "midx_pq": MIDXSampler(NUM_ITEMS, 16, num_codewords=16, exact_top_codewords=0),
        "midx_rq_pop": MIDXSampler(
            NUM_ITEMS,
            16,
            num_codewords=16,
            quantizer="rq",
            last_stage="popularity",
            exact_top_codewords=0,
        ),
        "popularity": PopularitySampler(NUM_ITEMS, 16),
    }


def _broadcast_worker(rank: int, port: int, out_dir: str) -> None:
    """Rank 0 builds every sampler from its own table, then broadcasts; all ranks report."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        # A different table and counts per rank: only the broadcast can make the ranks agree.
        generator = torch.Generator().manual_seed(rank)
        table = torch.randn(NUM_ITEMS + 1, 16, generator=generator)
        counts = torch.randint(0, 50, (NUM_ITEMS + 1,), generator=generator)
        queries = torch.randn(8, 16, generator=torch.Generator().manual_seed(99))
        report = {}
        for name, sampler in _samplers().items():
            if rank == 0:
                sampler.update(table, counts)
            broadcast_module_state(sampler)
            ids, log_q = sampler.sample(queries, 32, generator=torch.Generator().manual_seed(7))
            report[name] = {"state": sampler.state_dict(), "ids": ids, "log_q": log_q}
        report["eval_rows"] = list(eval_sampler(range(121)))
        # A build that fails on rank 0 must stop rank 1 too, not leave it waiting for a state.
        try:
            raise_on_every_rank(ValueError("item table holds NaN") if rank == 0 else None)
        except (ValueError, RuntimeError) as exc:
            report["failure"] = f"{type(exc).__name__}: {exc}"
        torch.save(report, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_broadcast_gives_every_rank_rank_zeros_sampler(tmp_path):
    mp.spawn(_broadcast_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for name in _samplers():
        first, second = ranks[0][name], ranks[1][name]
        assert first["state"].keys() == second["state"].keys()
        for key, value in first["state"].items():
            assert torch.equal(value, second["state"][key]), f"{name}: {key}"
        assert torch.equal(first["ids"], second["ids"]), name
        assert torch.equal(first["log_q"], second["log_q"]), name
    # Rank 0's own build (the table of seed 0) is what both ranks hold.
    reference = _samplers()["midx_pq"]
    reference.update(torch.randn(NUM_ITEMS + 1, 16, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(
        reference.codebooks.codewords, ranks[1]["midx_pq"]["state"]["codebooks.codewords"]
    )
    # Evaluation shards cover each of the 121 rows exactly once, without padding.
    rows = ranks[0]["eval_rows"] + ranks[1]["eval_rows"]
    assert sorted(rows) == list(range(121)) and len(ranks[0]["eval_rows"]) == 61
    # Rank 0's failure reaches rank 1 as an error naming it.
    assert ranks[0]["failure"] == "ValueError: item table holds NaN"
    assert ranks[1]["failure"] == "RuntimeError: rank 0 failed: ValueError: item table holds NaN"


#: The encoders of the sparse-table cases: SASRec (one table, input and output), SASRec with a
#: separate output table (gSASRec's), and the XC MLP (feature and label tables).
TABLE_KINDS = ("tied", "separate_output", "xc")


def _table_case(kind: str, rank: int) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The same encoder on every rank (seeded, in evaluation mode: without dropout, every
    forward pass computes the same function) and this rank's own batch of it."""
    torch.manual_seed(0)
    if kind == "xc":
        encoder = XCEncoder(num_features=40, num_labels=30, dim=8, hidden=16)
        data = torch.Generator().manual_seed(10 + rank)
        lengths = torch.randint(1, 5, (4,), generator=data)
        batch = {
            "indices": torch.randint(0, 40, (int(lengths.sum()),), generator=data),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            "weights": torch.rand(int(lengths.sum()), generator=data),
            "targets": torch.randint(1, 31, (4, 2), generator=data),
        }
    else:
        encoder = SASRec(30, dim=8, max_len=5, separate_output_table=kind == "separate_output")
        data = torch.Generator().manual_seed(10 + rank)
        batch = {
            "inputs": torch.randint(1, 31, (4, 5), generator=data),
            "targets": torch.randint(1, 31, (4,), generator=data),
        }
    batch["negatives"] = torch.randint(1, 31, (4, 6), generator=data)
    return encoder.eval(), batch


class _TableStep(torch.nn.Module):
    """An encoder and the sampled softmax of its batch, the pieces a training step joins."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.tables = encoder.use_sparse_gradients()

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if "inputs" in batch:
            queries = self.encoder.encode_last(batch["inputs"])
        else:
            queries = self.encoder(batch["indices"], batch["offsets"], batch["weights"])
        ids, targets = batch["negatives"], batch["targets"]
        log_q = torch.full(ids.shape, -math.log(30))
        negatives = Negatives("query", ids, log_q, exact_positive_log_q(targets, ids.shape[1]))
        loss = SoftmaxLoss() if targets.dim() == 1 else MultiLabelSoftmaxLoss()
        return loss(DotHead()(queries), targets, self.encoder.item_table, negatives)


def _dense_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
        for name, p in model.named_parameters()
        if p.grad is not None
    }


def _sparse_table_worker(rank: int, port: int, out_dir: str) -> None:
    """Per table kind: this rank's own gradient, the DDP-reduced one, and the weights after
    three DDP steps of the row-wise and dense optimizers."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        found = {}
        for kind in TABLE_KINDS:
            encoder, batch = _table_case(kind, rank)
            local = _TableStep(copy.deepcopy(encoder))
            local(batch).backward()
            step = _TableStep(encoder)
            model = torch.nn.parallel.DistributedDataParallel(step)
            model(batch).backward()
            reduced = _dense_grads(step)
            sparse = {
                name
                for name, p in step.named_parameters()
                if p.grad is not None and p.grad.is_sparse
            }
            tables = {id(table) for table in step.tables}
            optimizer = TableAndDenseOptimizer(
                torch.optim.Adam([p for p in step.parameters() if id(p) not in tables], lr=0.01),
                RowwiseAdagrad(step.tables, lr=0.1),
            )
            for _ in range(3):
                optimizer.step()
                optimizer.zero_grad()
                model(batch).backward()
            found[kind] = {
                "local": _dense_grads(local),
                "reduced": reduced,
                "sparse": sparse,
                "weights": {name: p.detach().clone() for name, p in step.named_parameters()},
            }
            del model
        torch.save(found, Path(out_dir) / f"rank{rank}.pt")
        # Tearing the group down under a live DDP wrapper can leave a rank waiting.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_sparse_tables_of_every_kind_are_reduced_to_the_mean_over_the_ranks(tmp_path):
    mp.spawn(_sparse_table_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    expected_sparse = {
        "tied": {"encoder.item_emb.weight"},
        "separate_output": {"encoder.item_emb.weight", "encoder.output_emb.weight"},
        "xc": {"encoder.feature_emb.weight", "encoder.label_emb.weight"},
    }
    for kind in TABLE_KINDS:
        first, second = ranks[0][kind], ranks[1][kind]
        assert first["sparse"] == second["sparse"] == expected_sparse[kind], kind
        for name, grad in first["local"].items():
            mean = (grad + second["local"][name]) / 2
            for rank in (first, second):
                torch.testing.assert_close(rank["reduced"][name], mean, msg=f"{kind}: {name}")
        for name, weight in first["weights"].items():
            assert torch.equal(weight, second["weights"][name]), f"{kind}: {name}"


@pytest.mark.parametrize("table_optimizer", ["null", "sparse_adam"])
def test_ddp_run_evaluates_like_one_process(compose_config, tmp_path, table_optimizer):
    run = (*DDP_RUN, f"task.module.table_optimizer={table_optimizer}")
    run_dir = tmp_path / "ddp"
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "trainer=ddp",
            "trainer.devices=2",
            *run,
            f"paths.data_dir={tmp_path / 'data'}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["config"]["trainer"]["strategy"] == "ddp"

    # The same best checkpoint, evaluated by a single process.
    experiment = build(compose_config(run))
    checkpoint = results["best_checkpoint"]
    test = experiment.trainer.test(
        experiment.module, experiment.datamodule, ckpt_path=checkpoint, verbose=False
    )[0]
    val = experiment.trainer.validate(
        experiment.module, experiment.datamodule, ckpt_path=checkpoint, verbose=False
    )[0]
    for name, value in {**test, **val}.items():
        assert results["metrics"][name] == pytest.approx(value, abs=1e-6), name


@pytest.mark.parametrize(
    "run",
    [
        (*TINY_RUN[:2], "model=gsasrec", "model.dim=16", "model.max_len=12"),
        (*TINY_XC_RUN, "task.module.table_optimizer=rowwise_adagrad"),
    ],
    ids=["gsasrec-auto", "xc-rowwise-adagrad"],
)
def test_ddp_trains_separate_output_and_xc_tables_sparse(tmp_path, run):
    ddp = ("trainer=ddp", "trainer.devices=2", "trainer.max_epochs=1")
    files = (f"paths.data_dir={tmp_path / 'data'}", f"hydra.run.dir={tmp_path / 'run'}")
    done = run_train(*run, *sampler_overrides("uniform"), *ddp, *files)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["table_optimizer"] == "rowwise_adagrad"


def test_multirun_with_ddp_fails_with_a_clear_message(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "trainer=ddp",
            "sampler=full,uniform",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            f"paths.data_dir={tmp_path / 'data'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "cannot run inside a Hydra multirun" in done.stderr
    assert not list((tmp_path / "sweep").glob("*/results.json"))
