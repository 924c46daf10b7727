"""Query chunks sized by the device: 1,024 queries on a CPU, a share of the device's memory on
CUDA; MIDX draws the same ids with the default as with 1,024 on a CPU, and its draws and log q
agree whatever the chunk."""

from __future__ import annotations

import types

import pytest
import torch
from goodness_of_fit import chi_square_pvalue

from recsys_midx.samplers import MIDXSampler
from recsys_midx.samplers import midx as midx_module
from recsys_midx.samplers.query_chunks import CPU_QUERY_CHUNK, query_chunk_rows

NUM_ITEMS, DIM = 2_000, 8


def test_a_cpu_takes_a_fixed_chunk():
    assert query_chunk_rows(1, torch.device("cpu")) == CPU_QUERY_CHUNK == 1024
    assert query_chunk_rows(10**9, torch.device("cpu")) == CPU_QUERY_CHUNK


def test_cuda_chunks_take_a_sixteenth_of_the_device_memory(monkeypatch):
    memory = 80 * 2**30
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: types.SimpleNamespace(total_memory=memory),
    )
    cuda = torch.device("cuda", 0)

    # ML-1M's shape: ~30,000 elements a query, so a batch of 25,600 queries is one chunk.
    assert query_chunk_rows(30_000, cuda) == memory // 16 // (4 * 30_000) == 44_739
    # Tables too large for one query still get one.
    assert query_chunk_rows(memory, cuda) == 1


def test_empty_tables_are_refused():
    with pytest.raises(ValueError, match="elements_per_query must be >= 1"):
        query_chunk_rows(0, torch.device("cpu"))


def _sampler(query_chunk_size: int | None = None) -> MIDXSampler:
    # 2,000 items and a budget of 200 items per query: exact top cells with t = 5 of K = 16.
    sampler = MIDXSampler(
        NUM_ITEMS,
        20,
        num_codewords=16,
        exact_top_items=200,
        query_chunk_size=query_chunk_size,
    )
    sampler.update(torch.randn(NUM_ITEMS + 1, DIM, generator=torch.Generator().manual_seed(0)))
    return sampler


def _queries(n: int) -> torch.Tensor:
    return torch.randn(n, DIM, generator=torch.Generator().manual_seed(1))


def test_the_cpu_default_draws_what_1024_draws():
    query = _queries(2_500)  # three chunks
    drawn = [
        _sampler(size).sample(query, generator=torch.Generator().manual_seed(2))
        for size in (None, 1024)
    ]

    assert _sampler().exact_top_codewords > 0
    assert torch.equal(drawn[0][0], drawn[1][0])
    assert torch.equal(drawn[0][1], drawn[1][1])


def test_the_estimate_covers_the_top_cells_held(monkeypatch):
    sampler = _sampler()
    held = []
    prepare = type(sampler.exact_top).prepare

    def counting(self, z, *args):
        state = prepare(self, z, *args)
        held.append(state.ids.numel() / z.shape[0])
        return state

    monkeypatch.setattr(type(sampler.exact_top), "prepare", counting)
    sampler.sample(_queries(2_000))
    top_cells = sampler.exact_top_codewords**2
    average = top_cells * NUM_ITEMS / 16**2

    # The estimate allows 32 elements per average top-cell item, room for twice as many items.
    assert max(held) <= 2 * average
    assert sampler._chunk_elements(20, True) >= 20 * (16 + 16) + 32 * int(average)


def test_one_chunk_of_many_queries_draws_by_its_log_q(monkeypatch):
    # A GPU's chunk: every query at once. Four queries, each repeated 3,000 times.
    monkeypatch.setattr(midx_module, "query_chunk_rows", lambda elements, device: 10**6)
    sampler = _sampler()
    distinct = _queries(4)
    query = distinct.repeat_interleave(3_000, dim=0)
    ids, log_q = sampler.sample(query, generator=torch.Generator().manual_seed(3))

    torch.testing.assert_close(log_q, sampler.log_prob(query, ids))
    probs = sampler.catalog_log_prob(distinct).double().exp()
    pvalue = chi_square_pvalue(ids.view(4, -1), probs)
    assert pvalue > 1e-3
