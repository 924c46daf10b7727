"""MIDX on extreme inputs (factorised masses far below the codebooks' peaks, non-finite queries)
and the rule that picks how cells are drawn."""

from __future__ import annotations

import pytest
import torch
from goodness_of_fit import chi_square_pvalue

from recsys_midx.samplers import MIDXSampler
from recsys_midx.samplers.cell_draws import two_stages_are_cheaper


def _far_below_peaks(cell_draw: str) -> tuple[MIDXSampler, torch.Tensor]:
    """Two 1-d subspaces, codewords about -1 and +1, items only in the cells (+1, -1) and
    (-1, +1): for ``z = (51, 51)`` each codebook's best codeword is +1, and both non-empty
    cells lie about 102 nats below the sum of the peaks, where float32 products are subnormal."""
    g = torch.Generator().manual_seed(0)
    first = torch.tensor([1.0, -1.0]) + 1e-3 * torch.randn(100, 2, generator=g)
    second = torch.tensor([-1.0, 1.0]) + 1e-3 * torch.randn(100, 2, generator=g)
    sampler = MIDXSampler(200, 100, num_codewords=2, cell_draw=cell_draw)
    sampler.update(torch.cat([torch.zeros(1, 2), first, second]))
    return sampler, torch.tensor([[51.0, 51.0]])


@pytest.mark.parametrize("cell_draw", ["table", "two_stage", "auto"])
def test_masses_far_below_the_peaks_stay_normalised(cell_draw: str) -> None:
    sampler, query = _far_below_peaks(cell_draw)
    ids, log_q = sampler.sample(query, 100, generator=torch.Generator().manual_seed(1))
    total = sampler.catalog_log_prob(query).double().exp().sum()
    assert abs(float(total) - 1.0) < 1e-5
    torch.testing.assert_close(sampler.log_prob(query, ids), log_q, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cell_draw", ["table", "two_stage", "auto"])
def test_draws_far_below_the_peaks_fit_the_reported_probabilities(cell_draw: str) -> None:
    sampler, query = _far_below_peaks(cell_draw)
    ids, _ = sampler.sample(query, 40_000, generator=torch.Generator().manual_seed(2))
    probs = sampler.catalog_log_prob(query).exp()
    assert chi_square_pvalue(ids, probs) > 1e-3


@pytest.mark.parametrize("method", ["sample", "log_prob", "catalog_log_prob"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_query_rows_are_named(method: str, bad: float) -> None:
    sampler = MIDXSampler(300, 5, num_codewords=8)
    sampler.update(torch.randn(301, 16, generator=torch.Generator().manual_seed(0)))
    query = torch.randn(9, 16)
    query[3, 5] = bad
    query[7] = bad
    calls = {
        "sample": lambda: sampler.sample(query, 5),
        "log_prob": lambda: sampler.log_prob(query, torch.ones(9, 2, dtype=torch.long)),
        "catalog_log_prob": lambda: sampler.catalog_log_prob(query),
    }
    with pytest.raises(ValueError, match=r"^query rows \[3, 7\] are not finite"):
        calls[method]()


# (K, M, cells, ms with the table / ms in two stages), from the table of scripts/bench_cell_draws.py
# in docs/benchmarks.md (N=1e5, D=64, Q=1024, one thread): dense grids of the diffuse catalog
# (spread 4.0) and of the clustered one at K=64 (spread 0.5, the last of the first four rows),
# sparse tables of the clustered one. A rule that draws 2*M <= K in two stages picks the table
# in the first four rows.
MEASURED_CELL_DRAWS = [
    (64, 64, 4096, 25.7 / 20.6),
    (128, 100, 16384, 140.2 / 107.5),
    (256, 256, 65536, 533.0 / 373.3),
    (64, 100, 4096, 37.8 / 31.3),
    (32, 64, 1024, 12.9 / 14.7),
    (64, 160, 4096, 40.2 / 77.5),
    (128, 256, 16384, 146.9 / 219.2),
    (128, 100, 966, 16.6 / 47.1),
    (256, 16, 443, 6.3 / 19.3),
]


@pytest.mark.parametrize(("codewords", "samples", "cells", "ratio"), MEASURED_CELL_DRAWS)
def test_auto_cell_draw_picks_the_way_measured_faster(
    codewords: int, samples: int, cells: int, ratio: float
) -> None:
    assert two_stages_are_cheaper(codewords, samples, cells) == (ratio > 1.0)
