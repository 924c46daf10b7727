"""The memory pre-flight: a training step's largest temporaries, estimated from the settings,
against the memory of the device the run trains on (recsys_midx.app.step_memory, preflight)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_train

from recsys_midx.app import preflight, step_memory
from recsys_midx.errors import ConfigError

GIB = 2**30
#: Windows of 200 items with 3,000 negatives per query on MovieLens 1M: every position of the
#: 512 windows of a batch gathers its own 3,001 item rows.
WINDOWS_3000 = [
    "dataset=ml-1m",
    "sampler=uniform",
    "sampler.num_negatives=3000",
    "task.datamodule.train_samples=windows",
    "task.datamodule.batch_size=512",
    "model.max_len=200",
    "trainer.accelerator=cpu",
]
#: One query per sample: a step's queries are the batch's samples.
PREFIXES = ["task.datamodule.train_samples=prefixes", "task.datamodule.batch_size=512"]


@pytest.fixture
def machine(monkeypatch):
    """Set the memory the check reads: ``machine(bytes)``; one process on the host."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)

    def _set(available: int | None) -> None:
        monkeypatch.setattr(step_memory, "available_memory", lambda device: available)

    return _set


def test_per_query_negatives_over_windows_are_refused_with_the_cures(compose_config, machine):
    machine(64 * GIB)
    with pytest.raises(ConfigError) as raised:
        preflight.check(compose_config(WINDOWS_3000))
    message = str(raised.value)
    assert message == (
        "sampler.num_negatives=3000 with task.datamodule.batch_size=512 x model.max_len=200 "
        "queries (task.datamodule.train_samples=windows) gathers about 151.1 GiB of item rows, "
        "logits and gradients per training step, more than the 64.0 GiB of host memory "
        "available: set negatives=shared, or lower sampler.num_negatives or "
        "task.datamodule.batch_size (preflight.memory=false skips this check)"
    )
    assert "\n" not in message


def test_shared_negatives_make_the_same_run_fit(compose_config, machine):
    machine(64 * GIB)
    preflight.check(compose_config([*WINDOWS_3000, "negatives=shared"]))


def test_the_check_can_be_turned_off(compose_config, machine):
    machine(64 * GIB)
    preflight.check(compose_config([*WINDOWS_3000, "preflight.memory=false"]))


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["task=xc"],
        ["head=mos"],
        ["sampler=full"],
        ["experiment=synthetic-100k"],
        ["debug=default"],
    ],
)
def test_default_setups_pass_on_this_machine(compose_config, overrides):
    preflight.check(compose_config(overrides))


def test_a_small_machine_refuses_what_a_big_one_runs(compose_config, machine):
    cfg = compose_config(
        ["sampler=uniform", "sampler.num_negatives=1000", "trainer.accelerator=cpu", *PREFIXES]
    )
    machine(4 * GIB)
    preflight.check(cfg)
    machine(100 * 2**20)
    with pytest.raises(
        ConfigError,
        match=r"^sampler\.num_negatives=1000 with "
        r"task\.datamodule\.batch_size=512 queries gathers "
        r"about 0\.3 GiB .* than the 0\.1 GiB of host memory",
    ):
        preflight.check(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["sampler=full", *PREFIXES],
            (
                r"loss\.chunk_size=8192 with task\.datamodule\.batch_size=512 "
                r"queries scores about .* exact softmax \(sampler=full\).*: lower "
                r"loss\.chunk_size or task\.datamodule\.batch_size"
            ),
        ),
        (
            ["negatives=shared", "sampler.num_negatives=100000", *PREFIXES],
            (
                r"sampler\.num_negatives=100000 shared \(negatives=shared\) with "
                r"task\.datamodule\.batch_size=512 queries scores .*: "
                r"lower sampler\.num_negatives or task\.datamodule\.batch_size"
            ),
        ),
        (
            ["task=xc", "sampler.num_negatives=1000"],
            r"sampler\.num_negatives=1000 with task\.datamodule\.batch_size=256 queries gathers",
        ),
    ],
    ids=["exact", "shared", "xc"],
)
def test_each_objective_names_its_own_settings(compose_config, machine, overrides, message):
    machine(1 * 2**20)
    with pytest.raises(ConfigError, match=f"^{message}"):
        preflight.check(compose_config([*overrides, "trainer.accelerator=cpu"]))


def test_estimate_counts_rows_and_logits_with_their_gradients(compose_config):
    estimate = step_memory.estimate_step_memory(compose_config(WINDOWS_3000))
    queries = 512 * 200
    assert (estimate.queries, estimate.rows, estimate.scores) == (
        queries,
        queries * 3001,
        queries * 3001,
    )
    assert estimate.bytes == 8 * (64 + 1) * estimate.rows + 8 * estimate.scores

    shared = step_memory.estimate_step_memory(compose_config([*WINDOWS_3000, "negatives=shared"]))
    assert shared.rows == queries + 3000 and shared.scores == queries * 3001

    # MoS: each of the K=4 components draws ceil(M/K) negatives and scores all of them.
    mos = step_memory.estimate_step_memory(
        compose_config(["head=mos", "sampler.num_negatives=10", *PREFIXES])
    )
    assert (mos.components, mos.rows, mos.scores) == (4, 512 * 13, 512 * 4 * 13)

    # The exact softmax scores at most the synthetic catalog (1,000 items) at a time.
    exact = step_memory.estimate_step_memory(compose_config(["sampler=full", *PREFIXES]))
    assert exact.exact and exact.rows == 0 and exact.scores == 512 * 1000

    assert step_memory.estimate_step_memory(compose_config(["loss=edrep"])) is None


def test_cpu_processes_of_one_run_share_the_host(compose_config, machine):
    overrides = [
        "sampler=uniform",
        "sampler.num_negatives=1000",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        *PREFIXES,
    ]
    single = step_memory.estimate_step_memory(compose_config(overrides)).bytes
    machine(int(1.5 * single))
    with pytest.raises(ConfigError, match=r"queries in each of 2 processes gathers"):
        preflight.check(compose_config(overrides))


def test_the_jobs_of_a_parallel_sweep_share_the_gpu(compose_config, machine, monkeypatch):
    overrides = ["sampler=uniform", "sampler.num_negatives=1000", "trainer=gpu", *PREFIXES]
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(step_memory, "training_device", lambda cfg: cuda)
    single = step_memory.estimate_step_memory(compose_config(overrides), cuda).bytes
    machine(int(1.5 * single))
    preflight.check(compose_config(overrides))  # one job alone fits
    monkeypatch.setattr(preflight, "sweep_jobs", lambda: 2)
    with pytest.raises(
        ConfigError, match=r"queries in each of 2 processes .* free memory of cuda:0"
    ):
        preflight.check(compose_config(overrides))


def test_extra_ranks_and_other_accelerators_are_not_checked(compose_config, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert step_memory.training_device(compose_config()) is None
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert step_memory.training_device(compose_config(["trainer=cpu"])) == torch.device("cpu")
    assert step_memory.training_device(compose_config(["trainer.accelerator=tpu"])) is None


def test_host_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:    2000000 kB\n")
    assert step_memory.host_available_memory(meminfo) == 2000000 * 1024
    # Without MemAvailable: the physical memory, an upper bound.
    assert step_memory.host_available_memory(tmp_path / "missing") > 0


@pytest.mark.slow
def test_train_refuses_the_run_in_one_line_before_reading_data(tmp_path):
    estimate = 8 * 65 * 512 * 200 * 3001 + 8 * 512 * 200 * 3001
    available = step_memory.host_available_memory()
    if available is None or available >= estimate:
        pytest.skip("this machine has the memory for the run")

    done = run_train(
        *WINDOWS_3000,
        f"hydra.run.dir={tmp_path / 'run'}",
        f"paths.data_dir={tmp_path / 'data'}",
        env={"HYDRA_FULL_ERROR": "0"},
    )

    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: sampler.num_negatives=3000 with task.datamodule.batch_size=512 x "
        "model.max_len=200 queries"
    )
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()
