"""BERT4Rec: the bidirectional encoder, its cloze masking, the cloze training step, the
pre-flight check of its training samples and whole runs with every kind of sampler and head."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import FEW_STEPS, TINY_RUN, exact_softmax_module, sampler_overrides
from trained_runs import csv_histories, train_custom_run

from recsys_midx import load_run, recommend
from recsys_midx.app import preflight
from recsys_midx.app.experiment import build, train
from recsys_midx.app.export import export_items
from recsys_midx.app.recommend import history_queries
from recsys_midx.errors import ConfigError
from recsys_midx.heads import DotHead
from recsys_midx.inference.query_encoder import trace_query_encoder
from recsys_midx.lit.reliability import capture_random_state, restore_random_state
from recsys_midx.models import BERT4Rec, SASRec

MASK = BERT4Rec.MASK


def _encoder(**options) -> BERT4Rec:
    torch.manual_seed(0)
    settings = {"num_items": 50, "dim": 16, "num_heads": 2, "dropout": 0.0, "max_len": 8}
    return BERT4Rec(**{**settings, **options}).eval()


def _histories(rows: int, length: int, num_items: int, seed: int) -> torch.Tensor:
    """Left-padded histories of random lengths ``0..length`` (some rows empty)."""
    generator = torch.Generator().manual_seed(seed)
    items = torch.randint(1, num_items + 1, (rows, length), generator=generator)
    lengths = torch.randint(0, length + 1, (rows, 1), generator=generator)
    return items.masked_fill(torch.arange(length) < length - lengths, 0)


# -- the encoder ----------------------------------------------------------------------------------


def test_output_shapes_and_an_item_table_without_a_mask_row() -> None:
    encoder = _encoder()
    seq = torch.tensor([[0, 0, 3, 4, MASK, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, MASK]])
    out = encoder(seq)
    assert out.shape == (2, 8, 16) and torch.isfinite(out).all()
    assert encoder.encode_last(seq.clamp(min=0)).shape == (2, 16)
    # The table is what samplers, the index and evaluation score: N + 1 rows, row 0 padding.
    assert encoder.item_table.shape == (51, 16)
    assert torch.count_nonzero(encoder.item_table[0]) == 0
    assert encoder.mask_emb.shape == (16,)


def test_a_later_item_changes_earlier_positions_unlike_sasrec() -> None:
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8]])
    changed = seq.clone()
    changed[0, 6] = 40
    bert = _encoder()
    assert not torch.allclose(bert(seq)[:, 2:6], bert(changed)[:, 2:6])
    torch.manual_seed(0)
    sasrec = SASRec(num_items=50, dim=16, num_heads=2, dropout=0.0, max_len=8).eval()
    torch.testing.assert_close(sasrec(seq)[:, :6], sasrec(changed)[:, :6])


def test_without_the_output_transform_the_query_is_the_last_normalised_block_output() -> None:
    plain = _encoder(output_transform=False, norm_eps=1e-12)
    assert not any(isinstance(m, torch.nn.Linear) for m in plain.project.modules())
    queries = plain(torch.tensor([[0, 0, 3, 4, MASK, 6, 7, MASK]]))
    # The last block ends in a LayerNorm at its start (unit scale, zero shift): every query
    # has zero mean and unit variance over its dimensions.
    torch.testing.assert_close(queries.mean(-1), torch.zeros(1, 8), atol=1e-6, rtol=0)
    torch.testing.assert_close(queries.var(-1, unbiased=False), torch.ones(1, 8))
    epsilons = {m.eps for m in plain.modules() if isinstance(m, torch.nn.LayerNorm)}
    assert epsilons == {1e-12}
    assert {m.eps for m in _encoder().modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-5}


def test_padding_never_reaches_the_real_positions() -> None:
    encoder = _encoder()
    seq = torch.tensor([[0, 0, 0, 0, 5, MASK, 7, 8]])
    reference = encoder(seq)[:, 4:]
    # Padding could only leak through attention: a huge padding row would show if it did.
    with torch.no_grad():
        encoder.item_emb.weight[0].fill_(100.0)
    torch.testing.assert_close(encoder(seq)[:, 4:], reference)
    # Nor does the amount of padding before a history move its positions.
    torch.testing.assert_close(encoder(seq[:, 2:])[:, 2:], reference)


def test_the_mask_id_never_reaches_the_item_table_lookup() -> None:
    encoder = _encoder()
    looked_up: list[torch.Tensor] = []
    encoder.item_emb.register_forward_pre_hook(lambda _, args: looked_up.append(args[0]))
    seq = torch.tensor([[0, MASK, 3, MASK], [MASK, 2, MASK, MASK]])
    encoder(seq)
    encoder.encode_last(seq.clamp(min=0))
    assert looked_up and all(int(ids.min()) >= 0 for ids in looked_up)
    # The masked positions take the mask vector: changing it changes them.
    before = encoder(seq)
    with torch.no_grad():
        encoder.mask_emb.add_(1.0)
    assert not torch.allclose(encoder(seq)[seq == MASK], before[seq == MASK])


def test_encode_last_appends_a_mask_after_the_history() -> None:
    encoder = _encoder()
    seq = _histories(6, 8, 50, seed=1)
    seq[:, -1] = torch.arange(1, 7)  # no empty history
    shifted = torch.cat([seq[:, 1:], torch.full((6, 1), MASK)], dim=1)
    torch.testing.assert_close(encoder.encode_last(seq), encoder(shifted)[:, -1])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mask_prob": 0.0}, "mask_prob"),
        ({"mask_prob": 1.5}, "mask_prob"),
        ({"num_heads": 3}, "num_heads"),
        ({"num_layers": 0}, "num_layers"),
    ],
)
def test_settings_out_of_range_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _encoder(**options)


def test_the_query_encoder_exports_the_appended_mask_query() -> None:
    encoder = _encoder()
    traced = trace_query_encoder(encoder, DotHead())
    seq = _histories(3, 8, 50, seed=2)
    torch.testing.assert_close(traced(seq), encoder.encode_last(seq))


# -- cloze masking --------------------------------------------------------------------------------


def test_cloze_masks_real_items_at_mask_prob() -> None:
    encoder = _encoder(max_len=50, mask_prob=0.2)
    seq = _histories(4000, 50, 50, seed=3)
    masked, _ = encoder.cloze(seq, torch.Generator().manual_seed(0))
    real = int((seq > 0).sum())
    rate = int((masked == MASK).sum()) / real
    # About 100k real items: the rate's standard deviation is 0.0013 (plus the forced masks of
    # the short rows); 0.15 or 0.25 would be far outside.
    assert real > 80_000
    assert rate == pytest.approx(0.2, abs=0.01)


def test_cloze_targets_are_exactly_the_masked_items_and_padding_is_never_masked() -> None:
    encoder = _encoder(max_len=12, mask_prob=0.3)
    seq = _histories(500, 12, 50, seed=4)
    masked, targets = encoder.cloze(seq, torch.Generator().manual_seed(1))
    is_masked = masked == MASK
    assert torch.equal(targets[is_masked], seq[is_masked])
    assert torch.equal(targets[~is_masked], torch.zeros_like(targets[~is_masked]))
    assert torch.equal(masked[~is_masked], seq[~is_masked])
    assert not is_masked[seq == 0].any()


def test_cloze_masks_at_least_one_item_of_every_non_empty_row() -> None:
    # A rate so low that most rows draw no mask: their last item is masked instead.
    encoder = _encoder(max_len=6, mask_prob=0.01)
    seq = _histories(300, 6, 50, seed=5)
    masked, _ = encoder.cloze(seq, torch.Generator().manual_seed(2))
    counts = (masked == MASK).sum(dim=1)
    non_empty = (seq > 0).any(dim=1)
    assert non_empty.any() and not non_empty.all()
    assert (counts[non_empty] >= 1).all() and (counts[~non_empty] == 0).all()
    single = non_empty & (counts == 1)
    assert (masked[single, -1] == MASK).float().mean() > 0.9  # mostly the forced last item


def test_cloze_draws_from_the_global_random_state_that_checkpoints_save() -> None:
    encoder = _encoder(max_len=12)
    seq = _histories(64, 12, 50, seed=6)
    torch.manual_seed(7)
    state = capture_random_state()
    first = encoder.cloze(seq)
    assert not torch.equal(encoder.cloze(seq)[0], first[0])
    restore_random_state(state)  # what RandomStateCheckpoint does when a run resumes
    again = encoder.cloze(seq)
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


# -- the training step ----------------------------------------------------------------------------


def _window_batch(seed: int) -> dict[str, torch.Tensor]:
    """A ``last_window`` batch: windows of 9 items, inputs = window[:-1], targets = window[1:]."""
    window = _histories(16, 9, 50, seed=seed)
    return {"inputs": window[:, :-1], "targets": window[:, 1:]}


def test_the_loss_counts_the_masked_positions_only() -> None:
    encoder = _encoder()
    module = exact_softmax_module(encoder)
    batch = _window_batch(seed=8)
    counted: list[int] = []
    objective = module.objective

    def counting(queries, targets, windows=None, positions=None):
        counted.append(len(targets))
        return objective(queries, targets, windows, positions)

    module.objective = counting
    torch.manual_seed(9)
    loss = module.training_step(batch, 0)
    torch.manual_seed(9)
    masked, targets = encoder.cloze(batch["targets"])
    is_query = targets > 0
    assert counted == [int(is_query.sum())] and 0 < counted[0] < int((batch["targets"] > 0).sum())
    expected = objective(encoder(masked)[is_query], targets[is_query])
    torch.testing.assert_close(loss, expected)


def test_prefix_batches_are_refused_by_a_cloze_encoder() -> None:
    module = exact_softmax_module(_encoder())
    batch = {"inputs": torch.tensor([[0, 0, 0, 0, 0, 0, 3, 4]]), "targets": torch.tensor([[5]])}
    with pytest.raises(ValueError, match="prefixes"):
        module.training_step(batch, 0)


def test_evaluation_queries_append_the_mask_and_sasrecs_stay_its_last_position() -> None:
    batch = _window_batch(seed=10)
    bert = _encoder()
    torch.testing.assert_close(
        exact_softmax_module(bert).encode(batch), bert.encode_last(batch["inputs"])
    )
    torch.manual_seed(0)
    sasrec = SASRec(num_items=50, dim=16, num_heads=2, max_len=8)
    assert torch.equal(
        exact_softmax_module(sasrec).encode(batch), sasrec.eval()(batch["inputs"])[:, -1]
    )


# -- configuration and whole runs -----------------------------------------------------------------


def test_preflight_refuses_prefixes_and_names_the_fix(compose_config) -> None:
    prefixes = ["model=bert4rec", "task.datamodule.train_samples=prefixes"]
    with pytest.raises(ConfigError, match="^model=bert4rec trains by cloze on whole windows: set "):
        preflight.check(compose_config(prefixes))
    preflight.check(compose_config(["model=bert4rec"]))  # the default windows
    preflight.check(compose_config(["model=bert4rec", "task.datamodule.train_samples=last_window"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sampler", "extra"),
    [
        ("full", ()),
        ("midx", ()),
        ("midx", ("head=mos",)),
        ("uniform", ("negatives=outside_window", "sampler.num_negatives=16")),
        # The table's rows under a row-wise optimizer, the mask vector under the dense one.
        ("midx", ("task.module.table_optimizer=sparse_adam",)),
    ],
    ids=["full", "midx", "midx-mos", "outside-window", "sparse-table"],
)
def test_bert4rec_trains_and_tests(compose_config, tmp_path, sampler, extra) -> None:
    cfg = compose_config(
        [*TINY_RUN, *sampler_overrides(sampler), *FEW_STEPS, "model=bert4rec", *extra]
    )
    preflight.check(cfg)
    results = train(cfg)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["model"]["_target_"].endswith("BERT4Rec")
    assert "val/ndcg@10" in results["metrics"] and "test/ndcg@10" in results["metrics"]
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["state_dict"]["encoder.item_emb.weight"].shape[0] == saved["dataset"]["items"] + 1
    assert "encoder.mask_emb" in state["state_dict"]


class _Crash(Exception):
    pass


class _CrashInFirstValidation(L.Callback):
    """Fails at the first epoch's validation: after its last batch, before its save."""

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == 0:
            raise _Crash


@pytest.mark.slow
def test_a_resumed_run_draws_the_masks_of_an_uninterrupted_one(compose_config, tmp_path) -> None:
    # 120 users in batches of 32: 4 steps an epoch, a checkpoint after each but the epoch's last.
    run = [
        *TINY_RUN,
        *sampler_overrides("midx"),
        "model=bert4rec",
        "callbacks.step_checkpoint.every_n_train_steps=1",
    ]
    reference = train(compose_config([*run, f"paths.output_dir={tmp_path / 'reference'}"]))
    experiment = build(compose_config(run))
    experiment.trainer.callbacks.append(_CrashInFirstValidation())
    with pytest.raises(_Crash):
        experiment.trainer.fit(experiment.module, experiment.datamodule)
    # The resumed run replays the first epoch's last step: its masks must be the same draws.
    resumed = train(compose_config([*run, "resume=auto"]))
    assert resumed["metrics"] == pytest.approx(reference["metrics"], abs=1e-6, rel=0)
    assert resumed["epochs_run"] == 2


@pytest.mark.slow
def test_recommend_and_export_ask_at_the_appended_mask(tmp_path: Path) -> None:
    run_dir = train_custom_run(
        tmp_path / "bert4rec", ["model=bert4rec", "task.datamodule.train_samples=last_window"]
    )
    run = load_run(run_dir)
    encoder = run.module.encoder
    assert isinstance(encoder, BERT4Rec)
    users = ["user-003", "user-017"]
    recs = recommend(run_dir, users=users, k=5)
    full = csv_histories(run_dir)
    max_len = run.datamodule.max_len
    for user in users:
        history = torch.from_numpy(run.items.internal(full[user]))
        inputs = torch.zeros(1, max_len, dtype=torch.long)
        inputs[0, max_len - len(history[-max_len:]) :] = history[-max_len:]
        with torch.no_grad():
            scores = (encoder.encode_last(inputs) @ encoder.item_table[1:].T)[0]
        scores[history - 1] = float("-inf")
        expected = list(run.items.raw[scores.topk(5).indices.numpy() + 1])
        assert recs[recs["user"] == user]["item"].tolist() == expected
    meta = json.loads(export_items(run, tmp_path / "export").read_text())
    served = torch.jit.load(str(tmp_path / "export" / meta["encoder"]))
    histories = run.histories(run.users.internal(users))
    queries = history_queries(run, histories).queries
    padded = torch.zeros(len(histories), max_len, dtype=torch.long)
    for row, history in enumerate(histories):
        tail = torch.from_numpy(history[-max_len:])
        padded[row, max_len - len(tail) :] = tail
    with torch.no_grad():
        torch.testing.assert_close(served(padded), queries, rtol=1e-5, atol=1e-6)
