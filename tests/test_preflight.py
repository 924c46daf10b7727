"""Pre-flight checks, the threads setting and the training command's helpers, without a run."""

from __future__ import annotations

import sys
from pathlib import Path

import faiss
import pytest
import torch
from hydra.errors import InstantiationException

from recsys_midx.app import preflight, threads
from recsys_midx.app import train as cli
from recsys_midx.data.errors import EmptyFileError
from recsys_midx.errors import ConfigError
from recsys_midx.lit.table_optimizers import resolve_table_optimizer

#: A run of two processes on two GPUs: Lightning reduces its gradients over NCCL.
NCCL = ["trainer=ddp", "trainer.accelerator=gpu", "trainer.devices=2"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["eval.ks=[5,50]"],
            r"eval\.ks=\[5, 50\] does not produce task\.monitor=val/ndcg@10; "
            r"the task logs val/hr@5, val/ndcg@5, val/mrr@5, val/hr@50, ",
        ),
        (
            ["task=xc", "task.module.ks=[3]"],
            r"task\.module\.ks=\[3\] does not produce task\.monitor=val/p@1; the task logs val/p@3",
        ),
        (
            ["task.monitor=val/recall@10"],
            r"eval\.ks=\[10, 20\] does not produce "
            r"task\.monitor=val/recall@10",
        ),
        (["eval.ks=[]"], r"eval\.ks=\[\]: give a non-empty list of positive cut-offs"),
        (["trainer.max_epochs=0"], r"trainer\.max_epochs=0: a run trains at least one epoch"),
        (
            ["trainer.max_epochs=-1"],
            r"trainer\.max_epochs=-1 without trainer\.max_steps or trainer\.max_time never stops",
        ),
        (["+trainer.max_steps=0"], r"trainer\.max_steps=0: set it >= 1"),
        (
            ["model.dim=30", "sampler.num_codebooks=4"],
            r"model\.dim=30 is not divisible by sampler\.num_codebooks=4",
        ),
        (["sampler.num_negatives=0"], r"sampler\.num_negatives=0: draw at least 1 negative"),
        (["sampler.num_codewords=1"], r"sampler\.num_codewords=1: it must be >= 2"),
        (["sampler.quantizer=opq"], r"sampler\.quantizer=opq: choose one of pq, rq"),
        (
            ["sampler.cell_draw=gumbel"],
            r"sampler\.cell_draw=gumbel: choose one of auto, table, two_stage$",
        ),
        (["sampler=lsh", "sampler.num_tables=0"], r"sampler\.num_tables=0: it must be >= 1$"),
        (["dataset=custom"], r"dataset\.path must be set"),
        (
            ["optimized_metric=val/p@1"],
            r"optimized_metric=val/p@1 is not a metric the task logs: choose one of val/hr@10, ",
        ),
        (["resume=nowhere/last.ckpt"], r"resume=nowhere/last\.ckpt: no such checkpoint file"),
        (
            ["task.module.table_optimizer=sgd"],
            r"task\.module\.table_optimizer=sgd: choose auto, null, sparse_adam or "
            r"rowwise_adagrad$",
        ),
        (
            ["sampler=full", "task.module.table_optimizer=sparse_adam"],
            r"task\.module\.table_optimizer=sparse_adam needs a sampled objective: the exact "
            r"softmax \(negatives=none, sampler=full\) reads every row",
        ),
        (
            [*NCCL, "task.module.table_optimizer=rowwise_adagrad"],
            r"task\.module\.table_optimizer=rowwise_adagrad gives the item table sparse "
            r"gradients, which NCCL does not all-reduce across processes",
        ),
        (
            ["task.module.table_optimizer=rowwise_adagrad", "trainer.gradient_clip_val=1.0"],
            r"trainer\.gradient_clip_val=1\.0 cannot clip the sparse gradients",
        ),
        (
            ["task.module.table_optimizer=sparse_adam", "task.module.optimizer.weight_decay=0.01"],
            r"task\.module\.optimizer\.weight_decay=0\.01 would not reach the item table",
        ),
        (
            [
                "loss=edrep",
                "loss.grad_through_stats=true",
                "task.module.table_optimizer=sparse_adam",
            ],
            r"loss\.grad_through_stats=true reads the whole item table with a gradient",
        ),
        (
            ["sampler=full", "negatives=shared"],
            r"negatives=shared draws from a sampler and sampler=full has none",
        ),
        (
            ["loss=sce", "negatives=per_query"],
            r"loss=sce estimates the softmax over the catalog itself and takes no drawn negatives: "
            r"set negatives=none \(not negatives=per_query\)$",
        ),
        (["loss=bce", "sampler=full"], r"loss=bce trains on drawn negatives"),
        (["task=xc", "negatives=per_sequence"], r"negatives=per_sequence reads each batch's"),
        (
            ["loss=edrep", "negatives.exclude_window=true"],
            r"negatives\.exclude_window=true with negatives=none needs loss=softmax: loss=edrep",
        ),
    ],
    ids=[
        "ks-without-monitor",
        "xc-ks-without-monitor",
        "unknown-monitor",
        "no-ks",
        "no-epochs",
        "never-stops",
        "no-steps",
        "pq-dim",
        "no-negatives",
        "one-codeword",
        "quantizer",
        "cell-draw",
        "lsh-tables",
        "required-path",
        "optimized-metric",
        "resume-path",
        "table-optimizer",
        "table-optimizer-exact",
        "table-optimizer-nccl",
        "table-optimizer-clipping",
        "table-optimizer-weight-decay",
        "table-optimizer-edrep-stats",
        "sampler-full-shared",
        "sce-drawn-negatives",
        "bce-exact",
        "xc-per-sequence",
        "edrep-window",
    ],
)
def test_preflight_names_the_setting_as_the_user_writes_it(compose_config, overrides, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        preflight.check(compose_config(overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["task=xc"],
        ["debug=default"],
        ["debug=fdr"],
        ["debug=overfit"],
        ["sampler=full"],
        ["sampler=inbatch"],
        ["sampler=midx_rq", "model.dim=30", "sampler.num_codebooks=4"],
        ["trainer.max_epochs=-1", "+trainer.max_steps=10"],
        ["eval.ks=[5, 10]"],
        ["experiment=synthetic-100k"],
        ["optimized_metric=test/ndcg@20"],
        ["optimized_metric=null"],
        ["resume=auto"],
        ["task.module.table_optimizer=null", "sampler=full"],
        ["task.module.table_optimizer=sparse_adam"],
        ["task=xc", "task.module.table_optimizer=rowwise_adagrad"],
        ["loss=sce"],
        ["loss=edrep", "task=xc"],
        ["negatives=per_sequence", "task.datamodule.train_samples=last_window"],
        ["negatives=outside_window", "sampler=uniform"],
        ["negatives=shared", "head=mos"],
        [*NCCL],
    ],
)
def test_preflight_accepts_working_setups(compose_config, overrides):
    preflight.check(compose_config(overrides))


@pytest.fixture
def restore_threads():
    """Give torch and faiss back the thread counts they had before the test."""
    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    yield
    torch.set_num_threads(before[0])
    faiss.omp_set_num_threads(before[1])


def test_threads_setting_reaches_torch_and_faiss(compose_config, restore_threads):
    assert threads.apply_threads(compose_config(["threads=3"])) == 3
    assert torch.get_num_threads() == 3
    assert faiss.omp_get_max_threads() == 3
    assert threads.apply_threads(compose_config(["threads=1"])) == 1
    assert torch.get_num_threads() == faiss.omp_get_max_threads() == 1


def test_automatic_threads_share_the_cores_among_the_processes(compose_config, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 16)
    assert threads.resolve_threads(compose_config()) == threads.DEFAULT_CAP == 4
    ddp = ["trainer=ddp", "trainer.devices=4"]
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    assert threads.resolve_threads(compose_config(ddp)) == 2
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    assert threads.resolve_threads(compose_config(ddp)) == 1
    assert threads.resolve_threads(compose_config()) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.resolve_threads(compose_config()) == 3
    assert threads.resolve_threads(compose_config(["threads=5"])) == 5
    with pytest.raises(ConfigError, match="^threads=0: give a positive integer"):
        threads.resolve_threads(compose_config(["threads=0"]))


def test_user_errors_are_unwrapped_from_hydra_and_others_are_not():
    empty = EmptyFileError(Path("ratings.csv"))
    wrapped = InstantiationException("Error in call to target ...\nfull_key: task.datamodule")
    wrapped.__cause__ = empty
    assert cli.user_error(wrapped) is empty
    assert cli.user_error(ConfigError("threads=0")) is not None
    assert cli.user_error(ValueError("a bug")) is None
    assert cli.user_error(RuntimeError("a bug")) is None


def test_only_a_run_folder_without_results_is_removed(tmp_path):
    unused = tmp_path / "unused"
    (unused / ".hydra").mkdir(parents=True)
    (unused / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (unused / "train.log").write_text("")
    (unused / "checkpoints").mkdir()
    assert cli.remove_if_unused(unused) and not unused.exists()

    resumed = tmp_path / "resumed"
    (resumed / ".hydra").mkdir(parents=True)
    (resumed / "checkpoints").mkdir()
    (resumed / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert not cli.remove_if_unused(resumed) and (resumed / "checkpoints" / "last.ckpt").exists()


def test_resume_command_repeats_the_command_line_with_resume_and_the_run_folder(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "train.py",
            "sampler=uniform",
            "resume=old.ckpt",
            "hydra.run.dir=elsewhere",
            "dataset.path=my file.csv",
        ],
    )
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-u", *sys.argv])
    assert cli.resume_command(tmp_path) == (
        f"python3 -u train.py sampler=uniform 'dataset.path=my file.csv' resume=auto "
        f"hydra.run.dir={tmp_path}"
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "rowwise_adagrad"),
        (["sampler=uniform"], "rowwise_adagrad"),
        (["sampler=full"], None),
        (["trainer.gradient_clip_val=1.0"], None),
        (["task.module.optimizer.weight_decay=0.01"], None),
        (["loss=edrep", "loss.grad_through_stats=true"], None),
        (["task.module.table_optimizer=null"], None),
        (["task.module.table_optimizer=sparse_adam"], "sparse_adam"),
        (NCCL, None),
        (["loss=sce"], "rowwise_adagrad"),
        (["task=xc"], None),
        (["task=xc", "task.module.table_optimizer=auto"], "rowwise_adagrad"),
    ],
    ids=[
        "default",
        "uniform",
        "exact-softmax",
        "clipping",
        "weight-decay",
        "edrep-stats",
        "null",
        "named",
        "nccl",
        "sce-own-candidates",
        "xc-default",
        "xc-auto",
    ],
)
def test_auto_table_optimizer_is_sparse_wherever_a_sparse_update_can_go(
    compose_config, overrides, expected
):
    cfg = compose_config(overrides)
    needs = preflight.table_needs(cfg)
    assert resolve_table_optimizer(cfg.task.module.table_optimizer, needs) == expected
    preflight.check(cfg)  # auto never makes a run the pre-flight refuses


@pytest.mark.parametrize(
    ("overrides", "nccl"),
    [
        (NCCL, True),
        ([*NCCL, "trainer.devices=1"], False),
        ([*NCCL, "trainer.devices=[0,1]"], True),
        ([*NCCL, "trainer.devices='0,1'"], True),
        ([*NCCL, "trainer.devices=1", "+trainer.num_nodes=2"], True),
        ([*NCCL, "trainer.accelerator=cpu"], False),
        (["trainer=gpu", "trainer.devices=2"], False),  # no DDP strategy: one process
        (
            [
                *NCCL,
                "trainer.strategy={_target_:lightning.pytorch.strategies.DDPStrategy,"
                "process_group_backend:gloo}",
            ],
            False,
        ),
    ],
    ids=["ddp-2-gpus", "one-gpu", "list", "string", "two-nodes", "cpu", "no-ddp", "gloo-on-gpus"],
)
def test_a_run_over_nccl_is_told_from_its_config(compose_config, overrides, nccl):
    assert preflight.reduces_over_nccl(compose_config(overrides)) is nccl
