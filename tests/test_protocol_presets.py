"""Peer-library protocols (``recsys_midx/conf/protocol``): what each preset changes."""

from __future__ import annotations


def test_recbole_protocol_keeps_every_interaction_and_the_history_in_the_ranking(
    compose_config,
) -> None:
    ours = compose_config(["dataset=ml-100k"])
    recbole = compose_config(["dataset=ml-100k", "protocol=recbole"])
    assert ours.dataset.preprocess.user_core == 5 and ours.eval.exclude_seen is True
    assert recbole.dataset.preprocess.min_rating is None
    assert recbole.dataset.preprocess.user_core == recbole.dataset.preprocess.item_core == 0
    assert recbole.eval.exclude_seen is False
    assert recbole.split._target_.endswith("LeaveOneOut")
    assert recbole.task.module.exclude_seen is False
    # Everything else is ours: the training samples and the model are separate choices.
    assert recbole.task.datamodule.train_samples == ours.task.datamodule.train_samples
    assert recbole.model == ours.model


def test_command_line_settings_win_over_the_protocol(compose_config) -> None:
    cfg = compose_config(
        ["dataset=ml-100k", "protocol=recbole", "eval.exclude_seen=true", "preprocess=sasrec"]
    )
    assert cfg.eval.exclude_seen is True and cfg.dataset.preprocess.user_core == 5
