"""Softmax-bottleneck diagnostics: ranks of log-probability matrices, Jacobian spectra, report."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from conftest import load_script
from trained_runs import train_synthetic_run

from recsys_midx.analysis import (
    jacobian_spectrum,
    log_prob_matrix,
    numerical_rank,
    singular_values,
)
from recsys_midx.heads import DotHead, Head, MoEHead, MoSHead, PLIFHead, SigSoftmaxHead
from recsys_midx.scoring import log_probs

DIM, NUM_ITEMS, NUM_CONTEXTS = 3, 60, 40


def _instance(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random low-dimensional contexts [C, D], item table [N+1, D] and every item id."""
    generator = torch.Generator().manual_seed(seed)
    contexts = torch.randn(NUM_CONTEXTS, DIM, generator=generator) * 1.5
    item_emb = torch.randn(NUM_ITEMS + 1, DIM, generator=generator) * 1.5
    return contexts, item_emb, torch.arange(1, NUM_ITEMS + 1)


def _plif(seed: int) -> PLIFHead:
    head = PLIFHead(num_knots=40, bound=8.0)
    with torch.no_grad():
        head.raw_slopes.copy_(torch.randn(40, generator=torch.Generator().manual_seed(seed)))
    return head


def _ranks(head: Head, seed: int) -> tuple[int, int]:
    """Numerical ranks of the raw and the centred log-probability matrix."""
    contexts, item_emb, ids = _instance(seed)
    matrix = log_prob_matrix(head, contexts, item_emb, ids)
    return (
        numerical_rank(singular_values(matrix, center=False)),
        numerical_rank(singular_values(matrix)),
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_plain_softmax_is_bound_to_rank_d_plus_one(seed: int) -> None:
    raw, centred = _ranks(DotHead(), seed)
    assert raw <= DIM + 1 and centred <= DIM
    # A projection of the query is still a dot-product softmax: still bound.
    torch.manual_seed(seed)
    raw, centred = _ranks(MoEHead(DIM, num_experts=3, activation="tanh"), seed)
    assert raw <= DIM + 1 and centred <= DIM


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", ["sigsoftmax", "plif", "mos"])
def test_nonlinear_heads_break_the_bottleneck(name: str, seed: int) -> None:
    torch.manual_seed(seed)
    head = {
        "sigsoftmax": SigSoftmaxHead(),
        "plif": _plif(seed),
        "mos": MoSHead(DIM, num_components=3),
    }[name]
    raw, centred = _ranks(head, seed)
    assert raw > DIM + 1 and centred > DIM + 1


def test_singular_values_and_numerical_rank() -> None:
    rank_two = torch.randn(6, 2, dtype=torch.float64) @ torch.randn(2, 9, dtype=torch.float64)
    values = singular_values(rank_two, center=False)
    assert values.shape == (6,) and bool((values[:-1] >= values[1:]).all())
    assert numerical_rank(values) == 2
    # Adding a constant per row is removed by centring.
    shifted = rank_two + torch.randn(6, 1, dtype=torch.float64)
    assert numerical_rank(singular_values(shifted, center=False)) == 3
    assert numerical_rank(singular_values(shifted)) == 2
    assert numerical_rank(torch.zeros(3)) == 0
    with pytest.raises(ValueError, match="non-finite"):
        singular_values(torch.tensor([[0.0, float("-inf")]]))
    with pytest.raises(ValueError, match="2-D"):
        singular_values(torch.ones(3))


@pytest.mark.parametrize("name", ["dot", "mos"])
def test_jacobian_spectrum_matches_autograd_jacobians(name: str) -> None:
    torch.manual_seed(0)
    head = DotHead() if name == "dot" else MoSHead(DIM, num_components=2)
    contexts, item_emb, ids = _instance(2)
    contexts, ids = contexts[:4], ids[:10]
    values = jacobian_spectrum(head, contexts, item_emb, ids)
    expected = torch.stack(
        [
            torch.linalg.svdvals(
                torch.autograd.functional.jacobian(
                    lambda h: log_probs(head, h[None], item_emb, ids, chunk_size=7)[0], context
                ).double()
            )
            for context in contexts
        ]
    ).mean(0)
    torch.testing.assert_close(values, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_report_compares_heads_of_trained_runs(tmp_path: Path) -> None:
    runs = [
        train_synthetic_run(
            tmp_path / head, tmp_path / "data", overrides=["trainer.max_epochs=1", f"head={head}"]
        )
        for head in ("dot", "mos")
    ]
    paths = load_script("bottleneck_report").main(
        [
            *map(str, runs),
            "--out",
            str(tmp_path / "report"),
            "--contexts",
            "30",
            "--items",
            "40",
            "--jacobian-contexts",
            "4",
            "--jacobian-items",
            "8",
        ]
    )
    assert paths["plot"].stat().st_size > 0
    with paths["csv"].open() as handle:
        rows = list(csv.DictReader(handle))
    ranks = {row["head"]: int(row["log_prob_rank"]) for row in rows}
    assert ranks["DotHead"] <= 16 < ranks["MoSHead"]  # model.dim=16 in TINY_RUN
    jacobian = [row for row in rows if row["spectrum"] == "jacobian" and row["head"] == "MoSHead"]
    assert len(jacobian) == 8 and float(jacobian[0]["relative"]) == 1.0
