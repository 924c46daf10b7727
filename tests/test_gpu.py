"""The main paths on a CUDA device agree with the CPU: samplers, codebooks, losses, ranking, and a
short training run. Skipped without CUDA.

``RECSYS_MIDX_TEST_DEVICE=cpu`` runs the same checks with the CPU standing in for the
accelerator, which exercises the tests themselves on machines without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import faiss
import pytest
import torch
from conftest import ROOT, TINY_RUN, drawn_loss, sampler_overrides
from goodness_of_fit import chi_square_pvalue

from recsys_midx.app.experiment import train
from recsys_midx.heads import DotHead
from recsys_midx.losses import SoftmaxLoss, full_softmax_loss
from recsys_midx.metrics.ranking import target_ranks
from recsys_midx.samplers import MIDXSampler, PopularitySampler, UniformSampler

DEVICE = torch.device(os.environ.get("RECSYS_MIDX_TEST_DEVICE", "cuda"))

pytestmark = pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"
)

NUM_ITEMS, DIM = 2000, 16
# Without exact top cells, which a catalog of this size would get by default.
MIDX_VARIANTS = {
    "pq_uniform": {"exact_top_codewords": 0},
    "pq_popularity": {"last_stage": "popularity", "exact_top_codewords": 0},
    "rq_uniform": {"quantizer": "rq", "exact_top_codewords": 0},
}


def _table(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    table = torch.randn(NUM_ITEMS + 1, DIM, generator=generator)
    counts = torch.randint(0, 100, (NUM_ITEMS + 1,), generator=generator)
    return table, counts


def _queries(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, DIM, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", sorted(MIDX_VARIANTS))
def test_midx_built_on_device_matches_cpu(variant):
    table, counts = _table()
    on_cpu = MIDXSampler(NUM_ITEMS, 20, num_codewords=16, **MIDX_VARIANTS[variant])
    on_cpu.update(table, counts)
    on_device = MIDXSampler(NUM_ITEMS, 20, num_codewords=16, **MIDX_VARIANTS[variant])
    on_device.update(table.to(DEVICE), counts.to(DEVICE))
    assert on_device.codebooks.codes.device.type == DEVICE.type
    if DEVICE.type == "cuda" and faiss.get_num_gpus() > 0:
        # A faiss GPU build assigns k-means points on the GPU: other rounding, other codewords,
        # but a quantisation as good as the host's.
        errors = [
            (table[1:].to(s.codebooks.codes.device) - s.codebooks.reconstruct(s.codebooks.codes))
            .square()
            .sum()
            .item()
            for s in (on_cpu, on_device)
        ]
        assert errors[1] == pytest.approx(errors[0], rel=0.05)
        return
    # k-means runs in faiss on the host either way; encoding runs on the device, where a
    # near-tie between two codewords may round the other way for a few items.
    torch.testing.assert_close(on_device.codebooks.codewords.cpu(), on_cpu.codebooks.codewords)
    agree = (on_device.codebooks.codes.cpu() == on_cpu.codebooks.codes).all(1).float().mean()
    assert agree > 0.995


@pytest.mark.parametrize("variant", sorted(MIDX_VARIANTS))
def test_midx_log_prob_and_draws_on_device(variant):
    table, counts = _table()
    sampler = MIDXSampler(NUM_ITEMS, 20, num_codewords=16, **MIDX_VARIANTS[variant])
    sampler.update(table, counts)
    queries = _queries(3)
    all_ids = torch.arange(1, NUM_ITEMS + 1).expand(3, -1)
    log_q_cpu = sampler.log_prob(queries, all_ids)
    sampler.to(DEVICE)
    log_q = sampler.log_prob(queries.to(DEVICE), all_ids.to(DEVICE))
    torch.testing.assert_close(log_q.cpu(), log_q_cpu, atol=1e-4, rtol=1e-4)
    assert torch.logsumexp(log_q.double(), 1).abs().max() < 1e-4  # normalised

    generator = torch.Generator(device=DEVICE).manual_seed(0)
    ids, drawn_log_q = sampler.sample(queries.to(DEVICE), 20_000, generator=generator)
    assert ids.device.type == DEVICE.type
    torch.testing.assert_close(drawn_log_q, log_q.gather(1, ids - 1), atol=1e-4, rtol=1e-4)
    assert chi_square_pvalue(ids.cpu(), log_q_cpu.exp()) > 1e-3


@pytest.mark.parametrize("sampler_class", [UniformSampler, PopularitySampler])
def test_query_independent_samplers_on_device(sampler_class):
    table, counts = _table()
    sampler = sampler_class(NUM_ITEMS, 20)
    sampler.update(table, counts)
    all_ids = torch.arange(1, NUM_ITEMS + 1).view(1, -1)
    log_q_cpu = sampler.log_prob(_queries(1), all_ids)
    sampler.to(DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    ids, log_q = sampler.sample(_queries(1).to(DEVICE), 50_000, generator=generator)
    assert ids.device.type == DEVICE.type
    torch.testing.assert_close(
        log_q.cpu(), log_q_cpu[0, ids.cpu()[0] - 1].view(1, -1), atol=1e-5, rtol=1e-5
    )
    assert chi_square_pvalue(ids.cpu(), log_q_cpu.exp()) > 1e-3


def test_full_softmax_loss_on_device_matches_float64_reference():
    table, _ = _table()
    queries = _queries(64)
    targets = torch.randint(1, NUM_ITEMS + 1, (64,), generator=torch.Generator().manual_seed(2))
    reference_q = queries.double().requires_grad_()
    reference_t = table.double().requires_grad_()
    logits = reference_q @ reference_t[1:].T
    reference = torch.nn.functional.cross_entropy(logits, targets - 1, reduction="none")
    reference.sum().backward()

    q = queries.to(DEVICE).requires_grad_()
    t = table.to(DEVICE).requires_grad_()
    loss = full_softmax_loss(q, t, targets.to(DEVICE), chunk_size=300)
    loss.sum().backward()
    torch.testing.assert_close(loss.double().cpu(), reference.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(q.grad.double().cpu(), reference_q.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(t.grad.double().cpu(), reference_t.grad, atol=1e-4, rtol=1e-4)


def test_sampled_softmax_with_midx_trains_on_device():
    table, _ = _table()
    item_table = table.to(DEVICE).requires_grad_()
    sampler = MIDXSampler(NUM_ITEMS, 50, num_codewords=16, exact_top_codewords=0)
    sampler.update(item_table.detach())
    queries = _queries(32).to(DEVICE).requires_grad_()
    targets = torch.randint(1, NUM_ITEMS + 1, (32,), device=DEVICE)
    loss = drawn_loss(SoftmaxLoss(), DotHead()(queries), targets, item_table, sampler)
    loss.backward()
    assert loss.device.type == DEVICE.type and torch.isfinite(loss)
    assert torch.isfinite(item_table.grad).all() and item_table.grad.abs().sum() > 0


def test_target_ranks_on_device_with_host_table_match_cpu():
    table, _ = _table()
    queries = _queries(40)
    targets = torch.randint(1, NUM_ITEMS + 1, (40,), generator=torch.Generator().manual_seed(3))
    history = torch.randint(0, NUM_ITEMS + 1, (40, 7), generator=torch.Generator().manual_seed(4))
    expected = target_ranks(queries, table, targets, history, chunk_size=512)
    ranks = target_ranks(queries.to(DEVICE), table, targets, history, chunk_size=512)
    assert ranks.device.type == DEVICE.type
    # Float32 products of different kernels may break a near-tie differently.
    assert (ranks.cpu() - expected).abs().max() <= 1


def test_training_run_on_the_accelerator(compose_config, tmp_path):
    accelerator = "gpu" if DEVICE.type == "cuda" else "cpu"
    overrides = [o for o in TINY_RUN if not o.startswith("trainer.accelerator")]
    cfg = compose_config(
        [
            *overrides,
            *sampler_overrides("midx"),
            "trainer=gpu",
            f"trainer.accelerator={accelerator}",
        ]
    )
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["metrics"] == pytest.approx(results["metrics"])
    assert 0.0 <= results["metrics"]["test/ndcg@10"] <= 1.0


def _bench(script: str, *arguments: str) -> list[str]:
    """The table rows that ``scripts/SCRIPT ARGUMENTS --device DEVICE`` prints."""
    command = [sys.executable, f"scripts/{script}", "--device", str(DEVICE), *arguments]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    return [line for line in lines if line.startswith("| ") and "---" not in line]


def test_sampler_benchmark_runs_every_sampler_on_the_device():
    rows = _bench(
        "bench_samplers.py",
        *("--sizes", "2000", "--samplers", "uniform", "popularity", "midx"),
        *("--queries", "64", "--kl-queries", "16", "--repeats", "1", "--peak-queries", "128"),
    )
    measured = {row.split(" | ")[0].strip("| ").split(" (")[0] for row in rows[1:]}
    assert {"uniform", "popularity", "midx"} <= measured


def test_training_benchmark_runs_on_the_device_in_bf16():
    rows = _bench(
        "bench_training.py",
        *("--sizes", "2000", "--samplers", "uniform", "midx", "--steps", "1", "--users", "200"),
        *("--precision", "bf16-mixed"),
    )
    assert [row.split(" | ")[1] for row in rows[1:]] == ["uniform", "midx"]
    assert not any("failed" in row for row in rows)
