"""Recommendations in raw ids from a trained run: brute-force equality, history exclusion, new
users' histories, the command line, clear errors, and a load that leaves no files behind."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from allocations import LargestAllocation
from trained_runs import brute_force, csv_histories, train_custom_run

from recsys_midx import load_run, recommend
from recsys_midx.app.recommend import COLUMNS, main, recommendation_batches
from recsys_midx.app.trained import IdMap, LoadedRun, UnknownIdsError
from recsys_midx.heads import MoSHead
from recsys_midx.scoring import log_probs

USERS = ["user-003", "user-017", "user-042"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_custom_run(tmp_path_factory.mktemp("recommend"))


@pytest.fixture(scope="module")
def run(run_dir: Path) -> LoadedRun:
    return load_run(run_dir)


def test_id_map_names_unknown_ids_in_one_line() -> None:
    items = IdMap("item", np.array([None, "a", "b", "7"], dtype=object))
    assert items.internal(["b", 7, "a"]).tolist() == [2, 3, 1]
    assert len(items) == 3
    with pytest.raises(UnknownIdsError) as error:
        items.internal(["a", "zz", "yy", "zz"])
    assert str(error.value) == "2 unknown item id(s), not in the run's dataset: 'zz', 'yy'"


@pytest.mark.slow
def test_known_users_get_unseen_items_equal_to_brute_force(run_dir: Path, run: LoadedRun) -> None:
    recs = recommend(run_dir, users=USERS, k=7)
    assert list(recs.columns) == list(COLUMNS)
    assert recs["user"].tolist() == [user for user in USERS for _ in range(7)]
    assert recs["rank"].tolist() == list(range(1, 8)) * 3
    full = csv_histories(run_dir)
    for user in USERS:
        # The run's history of a user is its whole sequence: training, validation and test items.
        split_history = run.items.raw[run.histories(run.users.internal([user]))[0]]
        assert list(split_history) == full[user]
        mine = recs[recs["user"] == user]
        assert not set(mine["item"]) & set(full[user])
        items, scores = brute_force(run, full[user], k=7, exclude_seen=True)
        assert mine["item"].tolist() == items
        np.testing.assert_allclose(mine["score"].to_numpy(), scores, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_include_seen_and_histories_of_new_users(run_dir: Path, run: LoadedRun) -> None:
    full = csv_histories(run_dir)
    with_seen = recommend(run, users=USERS[:1], k=10, exclude_seen=False)
    items, scores = brute_force(run, full[USERS[0]], k=10, exclude_seen=False)
    assert with_seen["item"].tolist() == items
    np.testing.assert_allclose(with_seen["score"].to_numpy(), scores, rtol=1e-5, atol=1e-6)

    # A new user with a known user's history gets that user's recommendations.
    by_label = recommend(run, histories={"anonymous": full[USERS[1]]}, k=5)
    known = recommend(run, users=USERS[1:2], k=5)
    assert by_label["user"].tolist() == ["anonymous"] * 5
    assert by_label["item"].tolist() == known["item"].tolist()
    np.testing.assert_allclose(by_label["score"], known["score"], rtol=1e-6)
    by_position = recommend(
        run, histories=[["sku-0001", "sku-0002"], full[USERS[1]]], k=5, batch_size=1, chunk_size=7
    )
    assert by_position["user"].tolist() == [0] * 5 + [1] * 5
    assert by_position["item"].tolist()[5:] == known["item"].tolist()
    assert not {"sku-0001", "sku-0002"} & set(by_position["item"][:5])


@pytest.mark.slow
def test_every_user_in_batches_and_fewer_items_than_k_when_history_covers_the_catalog(
    run: LoadedRun,
) -> None:
    everyone = recommend(run, users="all", k=3, batch_size=7, chunk_size=9)
    assert len(everyone) == 3 * len(run.all_user_ids())
    assert everyone["user"].nunique() == len(run.all_user_ids())
    catalog = list(run.items.raw[1:])
    nearly_all = recommend(run, histories={"x": catalog[:-2]}, k=5)
    assert nearly_all["item"].tolist() in (catalog[-2:], catalog[:-3:-1])
    assert nearly_all["rank"].tolist() == [1, 2]


@pytest.mark.slow
def test_a_mixture_head_ranks_by_its_log_probabilities(run_dir: Path) -> None:
    mixture = load_run(run_dir)
    torch.manual_seed(0)
    mixture.module.head = MoSHead(dim=16, num_components=3)
    user = USERS[2]
    recs = recommend(mixture, users=[user], k=6, chunk_size=11)
    history = mixture.histories(mixture.users.internal([user]))[0]
    max_len = mixture.datamodule.max_len
    inputs = torch.zeros(1, max_len, dtype=torch.long)
    inputs[0, max_len - min(max_len, len(history)) :] = torch.from_numpy(history[-max_len:])
    with torch.no_grad():
        query = mixture.module.encoder(inputs)[:, -1]
        item_table = mixture.module.encoder.item_table
        scores = log_probs(
            mixture.module.head, query, item_table, torch.arange(1, len(item_table))
        )[0]
    scores[torch.from_numpy(history - 1)] = float("-inf")
    top = scores.topk(6)
    assert recs["item"].tolist() == list(mixture.items.raw[top.indices.numpy() + 1])
    np.testing.assert_allclose(recs["score"].to_numpy(), top.values.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_unknown_ids_and_bad_arguments_are_one_clear_error(run: LoadedRun) -> None:
    with pytest.raises(UnknownIdsError, match=r"2 unknown user id\(s\).*'nobody', 'ghost'"):
        recommend(run, users=["nobody", USERS[0], "ghost"])
    with pytest.raises(UnknownIdsError, match="unknown item id.*'sku-9999'"):
        recommend(run, histories=[["sku-0001", "sku-9999"]])
    with pytest.raises(ValueError, match="exactly one of users"):
        recommend(run, users=USERS, histories=[["sku-0001"]])
    with pytest.raises(ValueError, match="k must be an integer in 1..40"):
        recommend(run, users=USERS, k=41)


@pytest.mark.slow
def test_command_line_writes_parquet_and_csv(
    run_dir: Path, run: LoadedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "recs.parquet"
    # Two users per batch: the file is written a batch at a time.
    argv = [str(run_dir), "--users", *USERS, "--k", "4", "--batch-size", "2", "--out", str(out)]
    assert main(argv) == 0
    expected = recommend(run, users=USERS, k=4)
    pd.testing.assert_frame_equal(pd.read_parquet(out), expected, check_dtype=False)

    histories = tmp_path / "histories.json"
    histories.write_text('{"new": ["sku-0003", "sku-0004"]}')
    csv_out = tmp_path / "new.csv"
    assert (
        main(
            [
                str(run_dir),
                "--histories-file",
                str(histories),
                "--include-seen",
                "--out",
                str(csv_out),
            ]
        )
        == 0
    )
    assert len(pd.read_csv(csv_out)) == 10

    with pytest.raises(SystemExit) as exit_info:
        main([str(run_dir), "--users", "nobody", USERS[0]])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "'nobody'" in error


@pytest.mark.slow
def test_loading_a_run_writes_nothing_and_leaves_no_temporary_folder(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def files() -> dict[str, float]:
        return {str(path): path.stat().st_mtime_ns for path in run_dir.rglob("*")}

    before = files()
    loaded = load_run(run_dir)
    assert loaded.config.paths.output_dir == str(run_dir.resolve())
    assert os.listdir(scratch) == []
    assert files() == before


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_scoring_on_a_gpu_gives_the_cpu_recommendations(run_dir: Path) -> None:
    on_cpu = recommend(load_run(run_dir), users=USERS, k=10, device="cpu")
    on_gpu = recommend(load_run(run_dir), users=USERS, k=10, device="cuda", chunk_size=13)
    assert on_gpu["item"].tolist() == on_cpu["item"].tolist()
    np.testing.assert_allclose(on_gpu["score"], on_cpu["score"], rtol=1e-4, atol=1e-5)


def _with_catalog_of(run: LoadedRun, num_items: int) -> LoadedRun:
    """``run`` with ``num_items`` items: its own, then random ones of new raw ids."""
    module = copy.deepcopy(run.module)
    table = module.encoder.item_emb.weight.detach()
    extra = torch.randn(
        num_items + 1 - table.shape[0], table.shape[1], generator=torch.Generator().manual_seed(0)
    )
    module.encoder.item_emb = torch.nn.Embedding.from_pretrained(torch.cat((table, extra)))
    datamodule = SimpleNamespace(num_items=num_items, max_len=run.datamodule.max_len)
    larger = LoadedRun(run.config, module, datamodule, run.checkpoint)
    # The id maps and sequences are set as cached: the larger catalog has no processed dataset.
    raw = np.concatenate((run.items.raw, [f"extra-{i}" for i in range(len(extra))]))
    larger.__dict__.update(
        items=IdMap("item", raw.astype(object)), users=run.users, _sequences=run._sequences
    )
    return larger


def test_every_users_recommendations_allocate_one_chunk_of_scores_whatever_the_catalog(
    run: LoadedRun,
) -> None:
    """Scoring every user against a catalog 20 times larger allocates nothing larger: no
    ``[users, N]`` scores and no copy of the item table; and no raw-id lookup is built."""
    largest = []
    for num_items in (len(run.items) * 50, len(run.items) * 1000):
        larger = _with_catalog_of(run, num_items)
        frames = recommendation_batches(larger, users="all", k=3, batch_size=8, chunk_size=16)
        with LargestAllocation() as allocation:
            recs = pd.concat(list(frames), ignore_index=True)
        assert len(recs) == 3 * len(run.all_user_ids())
        assert "_lookup" not in larger.items.__dict__
        largest.append(allocation.nbytes)
    smaller_table_bytes = 4 * len(run.items) * 50 * run.module.encoder.item_table.shape[1]
    assert largest[0] == largest[1] < smaller_table_bytes
