"""End to end: ``task=lm`` composed through Hydra trains, carries its state, reports exact
perplexity and refuses what a token stream cannot take, on generated corpora."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch
from conftest import run_train

from recsys_midx.app.experiment import build, train
from recsys_midx.app.preflight import check
from recsys_midx.errors import ConfigError
from recsys_midx.heads import DotHead
from recsys_midx.lit import LMModule
from recsys_midx.losses import SoftmaxLoss
from recsys_midx.models import LSTMLanguageModel

#: A corpus and model that train in seconds.
TINY_LM_RUN = (
    "task=lm",
    "dataset.vocabulary=200",
    "dataset.num_phrases=60",
    "dataset.train_tokens=12000",
    "dataset.valid_tokens=2000",
    "dataset.test_tokens=2000",
    "model.dim=32",
    "trainer.max_epochs=3",
    "trainer.accelerator=cpu",
    "task.datamodule.batch_size=10",
    "task.datamodule.eval_batch_size=5",
    "task.datamodule.bptt=20",
    "callbacks.progress_bar.refresh_rate=0",
)


def test_task_lm_selects_its_corpus_model_and_perplexity(compose_config) -> None:
    cfg = compose_config(["task=lm"])
    assert cfg.dataset.name == "lm-synthetic" and cfg.model._target_.endswith("LSTMLanguageModel")
    assert (cfg.task.monitor, cfg.task.monitor_mode) == ("val/ppl", "min")
    assert cfg.callbacks.early_stopping.mode == "min" and cfg.trainer.gradient_clip_val == 0.25
    ptb = compose_config(["task=lm", "dataset=ptb", "dataset.path=/data/ptb"])
    assert ptb.dataset.files.train == "ptb.train.txt" and len(ptb.dataset.md5.test) == 32
    with pytest.raises(ConfigError, match=r"^dataset\.path must be set"):
        check(compose_config(["task=lm", "dataset=wikitext-2"]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["negatives=per_sequence"], r"^negatives=per_sequence reads each batch's training"),
        (["negatives.exclude_window=true"], r"^negatives\.exclude_window=true reads each batch"),
        (["task.monitor=val/ndcg@10"], r"^task\.monitor=val/ndcg@10 is not a metric the task"),
        (["model=sasrec", "task.datamodule.bptt=60"], r"^task\.datamodule\.bptt=60 is longer than"),
        (["trainer=ddp", "trainer.devices=2"], r"^task=lm with trainer\.strategy=ddp"),
    ],
)
def test_settings_a_stream_cannot_take_are_refused_in_one_line(compose_config, overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        check(compose_config(["task=lm", *overrides]))
    assert "\n" not in str(error.value)


def test_perplexity_over_stretches_equals_one_pass_over_the_whole_stream(compose_config) -> None:
    # The state carried across stretches makes the evaluation the same as one unbroken pass.
    experiment = build(compose_config([*TINY_LM_RUN, "sampler=full"]))
    module, data = experiment.module.eval(), experiment.datamodule
    for batch in data.val_dataloader():
        module.update_metrics(module.val_metrics, batch)
    result = module.val_metrics.compute()
    columns = data.streams["valid"]
    with torch.no_grad():
        queries, _ = module.encoder(columns[:, :-1])
        logits = queries @ module.encoder.item_table.T
        logits[..., 0] = -math.inf  # id 0 is no token
        nll = -logits.log_softmax(-1).gather(-1, columns[:, 1:, None]).mean()
    assert float(result["nll"]) == pytest.approx(float(nll), rel=1e-5)
    assert float(result["ppl"]) == pytest.approx(math.exp(float(nll)), rel=1e-5)


@pytest.mark.filterwarnings("ignore:You are trying to")
def test_the_training_state_is_carried_detached_and_reset_each_epoch() -> None:
    module = LMModule(
        LSTMLanguageModel(30, dim=8),
        DotHead(),
        None,
        SoftmaxLoss(),
        functools.partial(torch.optim.SGD, lr=1.0),
    )
    batch = {"inputs": torch.randint(1, 31, (3, 5)), "targets": torch.randint(1, 31, (3, 5))}
    module.training_step(batch, 0)
    (h, c), _ = module._states["train"]
    assert h.shape == (1, 3, 8) and not h.requires_grad
    loss = module.training_step(batch, 1)
    loss.backward()  # only through this stretch: the carried state has no graph
    module.on_train_epoch_start()
    assert "train" not in module._states


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["sampler=full"],
        ["sampler=midx", "sampler.num_codewords=8"],
        ["sampler=uniform"],
        ["sampler=full", "head=mos", "head.num_components=2"],
        ["sampler=full", "head=plif"],
        ["sampler=full", "head=mos_plif", "head.num_components=2", "head.num_knots=200"],
        ["sampler=full", "model=sasrec", "model.max_len=20", "task.module.optimizer.lr=0.5"],
    ],
    ids=["exact", "midx", "uniform", "mos", "plif", "mos_plif", "transformer"],
)
def test_a_language_model_learns_the_corpus(compose_config, tmp_path, overrides) -> None:
    results = train(compose_config([*TINY_LM_RUN, *overrides]))
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["metrics"] == pytest.approx(results["metrics"])
    # Far below a uniform guess over the 200 tokens, and the same exponential of the NLL.
    ppl = saved["metrics"]["test/ppl"]
    assert ppl < 60, ppl
    assert ppl == pytest.approx(math.exp(saved["metrics"]["test/nll"]), rel=1e-4)
    assert saved["dataset"]["items"] == 200 and saved["epochs_run"] == 3


@pytest.mark.slow
def test_the_command_trains_a_language_model(tmp_path) -> None:
    done = run_train(
        *TINY_LM_RUN,
        "trainer.max_epochs=1",
        f"hydra.run.dir={tmp_path}",
        f"paths.data_dir={tmp_path / 'data'}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ppl" in done.stdout
    bad = run_train(
        "task=lm",
        "task.datamodule.bptt=0",
        f"hydra.run.dir={tmp_path / 'b'}",
        f"paths.data_dir={tmp_path / 'data'}",
    )
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1].startswith("error: task.datamodule.bptt=0")
