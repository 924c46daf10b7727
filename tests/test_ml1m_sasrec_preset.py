"""``dataset=ml-1m-sasrec`` and ``protocol=sasrec-plus`` on a tiny file in the published format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import FEW_STEPS, check_leave_one_out
from hydra.utils import instantiate

from recsys_midx.app.experiment import train
from recsys_midx.app.preflight import check_required
from recsys_midx.errors import ConfigError
from recsys_midx.metrics.ranking import target_ranks

#: Users 1..3 in order, each user's lines in time order; items 1..6 all present.
SEQUENCES = {1: [3, 1, 4, 5, 2], 2: [6, 2, 3, 1], 3: [5, 6, 4, 2, 3, 1]}


@pytest.fixture
def published_file(tmp_path: Path) -> Path:
    path = tmp_path / "ml-1m.txt"
    path.write_text(
        "".join(f"{user} {item}\n" for user, items in SEQUENCES.items() for item in items)
    )
    return path


@pytest.fixture
def datamodule(compose_config, published_file: Path):
    cfg = compose_config(
        [
            "dataset=ml-1m-sasrec",
            f"dataset.path={published_file}",
            "protocol=sasrec-plus",
            "sampler=full",
        ]
    )
    module = instantiate(cfg.task.datamodule)
    module.prepare_data()
    module.setup("fit")
    return cfg, module


def test_the_preset_names_dataset_path_when_it_is_missing(compose_config) -> None:
    with pytest.raises(ConfigError, match=r"^dataset\.path must be set"):
        check_required(compose_config(["dataset=ml-1m-sasrec"]))


def test_the_file_is_read_as_published_without_filtering(datamodule) -> None:
    _, module = datamodule
    assert module.num_items == 6
    assert module.stats["users"] == 3
    assert module.stats["interactions"] == sum(map(len, SEQUENCES.values()))


def test_leave_one_out_the_test_input_holds_the_validation_item(datamodule) -> None:
    _, module = datamodule
    # Ids come out as in the file: the targets are each user's second-to-last and last items.
    batches = check_leave_one_out(module, SEQUENCES)
    val, test = batches["val"], batches["test"]
    for row, items in enumerate(SEQUENCES.values()):
        history = test["history"][row]
        assert history[history > 0].tolist() == items[:-1]
        val_history = val["history"][row]
        assert val_history[val_history > 0].tolist() == items[:-2]


def test_each_user_trains_on_its_last_window_with_every_position_a_target(datamodule) -> None:
    cfg, module = datamodule
    assert cfg.task.datamodule.train_samples == "last_window" and cfg.model.max_len == 200
    assert len(module.sample_index) == len(SEQUENCES)


def test_the_ranking_excludes_the_history_with_the_validation_item(datamodule) -> None:
    cfg, module = datamodule
    assert cfg.task.module.exclude_seen is True and list(cfg.eval.ks) == [10, 100]
    test = next(iter(module.test_dataloader()))
    # One dimension per item: each user's query scores its own validation item above its target
    # and every other item below; excluded as history, the validation item leaves the target first.
    item_table = torch.eye(7)
    queries = torch.zeros(3, 7)
    for row, items in enumerate(SEQUENCES.values()):
        queries[row, items[-2]], queries[row, items[-1]] = 5.0, 1.0
    ranks = target_ranks(queries, item_table, test["targets"], test["history"])
    assert ranks.tolist() == [0, 0, 0]  # 0-based
    assert (target_ranks(queries, item_table, test["targets"], None) > 0).all()


def test_the_protocol_sets_the_published_training_and_block(datamodule) -> None:
    cfg, _ = datamodule
    assert cfg.task.datamodule.batch_size == 128 and cfg.trainer.max_epochs == 100
    assert cfg.callbacks.early_stopping.patience == 10 and cfg.task.monitor == "val/ndcg@10"
    assert cfg.task.module.optimizer.lr == 0.001
    assert cfg.task.module.table_optimizer is None  # Adam over the item table too
    model = cfg.model
    assert (model.dim, model.num_layers, model.num_heads, model.dropout) == (64, 2, 1, 0.1)
    assert (model.residual, model.ffn_dim, model.ffn_activation) == ("normed", 64, "relu")
    assert model.position_origin == "first" and model.attention_init == "xavier"
    assert model.attention_output_dropout is False and model.norm_eps == 1e-8


def test_bert4rec_takes_the_protocol_sizes_with_its_own_block(compose_config, published_file):
    cfg = compose_config(
        ["dataset=ml-1m-sasrec", f"dataset.path={published_file}", "protocol=sasrec-plus"]
        + ["model=bert4rec", "sampler=full"]
    )
    model = cfg.model
    assert model._target_.endswith("BERT4Rec")
    assert (model.dim, model.num_layers, model.num_heads, model.dropout) == (64, 2, 2, 0.1)
    assert model.max_len == 200 and model.mask_prob == 0.2 and model.ffn_dim is None
    assert instantiate(model, num_items=6).max_len == 200


def test_gsasrec_setting_widens_the_block_and_trains_a_separate_output_table(
    compose_config, published_file
):
    cfg = compose_config(
        ["dataset=ml-1m-sasrec", f"dataset.path={published_file}", "protocol=sasrec-plus"]
        + ["model.dim=128", "model.dropout=0.5", "model.separate_output_table=true"]
        + ["loss=gbce", "sampler=uniform", "sampler.num_negatives=4", *FEW_STEPS]
    )
    assert cfg.model.ffn_dim == 128  # the feed-forward follows the embedding size
    results = train(cfg)
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())


def test_gsasrec_model_is_gsasrecs_block_and_start(compose_config, published_file) -> None:
    cfg = compose_config(
        ["dataset=ml-1m-sasrec", f"dataset.path={published_file}", "protocol=sasrec-plus"]
        + ["model=gsasrec", "model.dim=128", "model.dropout=0.5"]
        + ["loss=gbce", "loss.calibration=0.75", "sampler=uniform", "sampler.num_negatives=4"]
        + list(FEW_STEPS)
    )
    torch.manual_seed(0)
    model = instantiate(cfg.model, num_items=6)
    assert (model.dim, len(model.blocks), model.blocks[0].num_heads) == (128, 2, 1)
    assert model.output_emb is not None and model.embedding_scale == 1.0
    assert model.position_origin == "last" and model.blocks[0].attn_norm.eps == 1e-5
    assert not [name for name, _ in model.named_parameters() if ".out." in name]
    assert float(model.pos_emb.weight.std()) > 0.5  # PyTorch's N(0, 1), not N(0, 0.02)
    results = train(cfg)
    assert all(0.0 <= value <= 1.0 for value in results["metrics"].values())
