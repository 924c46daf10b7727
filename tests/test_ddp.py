"""Multi-process (DDP, gloo on CPU) runs: one proposal on every rank, evaluation equal to one
process's, and sweeps that refuse to start DDP.

Marked ``ddp``: ``pytest -m "not ddp"`` skips them; they skip themselves where torch has no gloo.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ROOT, TINY_RUN, sampler_overrides

from recsys_midx.app.experiment import build
from recsys_midx.distributed import (
    broadcast_module_state,
    eval_sampler,
    raise_on_every_rank,
)
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


def _sparse_gradient_worker(rank: int, port: int, out_dir: str) -> None:
    """Each rank backpropagates its own rows through a sparse lookup under DDP."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        table = torch.nn.Embedding(10, 3, sparse=True)
        torch.nn.init.constant_(table.weight, 1.0)
        model = torch.nn.parallel.DistributedDataParallel(table)
        model(torch.tensor([[1, 2, 2], [5, 7, 8]][rank])).pow(2).sum().backward()
        torch.save(table.weight.grad, Path(out_dir) / f"rank{rank}.pt")
        # Tearing the group down under a live DDP wrapper can leave a rank waiting.
        del model
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_sparse_table_gradients_are_averaged_over_the_ranks(tmp_path):
    mp.spawn(_sparse_gradient_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    grads = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    expected = torch.zeros(10, 3)
    for rows in ([1, 2, 2], [5, 7, 8]):  # d/dw sum(w^2) = 2 w = 2 per lookup, halved by the mean
        expected.index_add_(0, torch.tensor(rows), torch.ones(3, 3))
    for grad in grads:
        assert grad.is_sparse
        torch.testing.assert_close(grad.to_dense(), expected)


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
