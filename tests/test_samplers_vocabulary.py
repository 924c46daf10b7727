"""Every sampler's draws follow the ``log q`` it reports on a language model's table: a vocabulary
whose token frequencies follow a Zipf law, with the longer rows of frequent tokens that a
trained model's table has."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from goodness_of_fit import chi_square_pvalue

from recsys_midx.samplers import (
    InBatchSampler,
    MIDXSampler,
    PopularitySampler,
    Sampler,
    UniformSampler,
)

VOCABULARY, DIM, QUERIES, DRAWS = 3000, 32, 4, 50_000


@pytest.fixture(scope="module")
def vocabulary() -> dict[str, torch.Tensor]:
    """Zipf counts (every token occurs: a vocabulary is built from the training text), rows
    whose length grows with the log count, and queries of hidden-state size."""
    g = torch.Generator().manual_seed(0)
    ranks = torch.arange(1, VOCABULARY + 1, dtype=torch.float64)
    counts = torch.cat([torch.zeros(1), (1e6 / ranks).floor()]).long()
    directions = torch.nn.functional.normalize(torch.randn(VOCABULARY + 1, DIM, generator=g), dim=1)
    rows = directions * (0.5 + 0.25 * counts.clamp(min=1).double().log()).float()[:, None]
    rows[0] = 0
    queries = torch.nn.functional.normalize(torch.randn(QUERIES, DIM, generator=g), dim=1) * 1.5
    targets = torch.multinomial(counts[1:].double(), 2000, replacement=True, generator=g) + 1
    return {"rows": rows, "counts": counts, "queries": queries, "targets": targets}


def _midx(**settings) -> Callable[[], Sampler]:
    return lambda: MIDXSampler(VOCABULARY, num_negatives=20, num_codewords=16, **settings)


SAMPLERS: dict[str, Callable[[], Sampler]] = {
    "uniform": lambda: UniformSampler(VOCABULARY, 20),
    "popularity": lambda: PopularitySampler(VOCABULARY, 20, alpha=0.75),
    "inbatch": lambda: InBatchSampler(VOCABULARY, 20),
    "midx": _midx(),
    "midx_pop": _midx(last_stage="popularity"),
    "midx_rq": _midx(quantizer="rq"),
    "midx_exact": _midx(last_stage="residual"),
    "midx_top": _midx(exact_top_codewords=3),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_draws_follow_the_reported_log_q_on_a_zipf_vocabulary(vocabulary, name) -> None:
    sampler = SAMPLERS[name]()
    sampler.update(vocabulary["rows"], vocabulary["counts"])
    sampler.observe_targets(vocabulary["targets"])
    queries = vocabulary["queries"]
    ids, log_q = sampler.sample(queries, DRAWS, generator=torch.Generator().manual_seed(1))
    every = torch.arange(1, VOCABULARY + 1).expand(QUERIES, -1)
    torch.testing.assert_close(sampler.log_prob(queries, ids), log_q, atol=1e-5, rtol=0)
    probs = sampler.log_prob(queries, every).double().exp()
    assert (probs.sum(1) - 1).abs().max() < 1e-4
    torch.testing.assert_close(sampler.catalog_log_prob(queries).double().exp(), probs)
    assert chi_square_pvalue(ids, probs) > 1e-3
    # The same test notices a 10% tilt between odd and even ids.
    tilt = 1.0 + 0.1 * torch.where(torch.arange(VOCABULARY) % 2 == 0, 1.0, -1.0)
    assert chi_square_pvalue(ids, probs * tilt) < 1e-6
