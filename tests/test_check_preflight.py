"""`tpurun check --target`: each step's memory on a TPU type, through the real CLI (in-process).

The CLI runs are slow (a compile per step, a few more for a batch search) and
shared: `checked` runs each distinct command once per session, and the tests
read its output and `--report`. The unit tests build the Trainer's step directly.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
import tensorflow as tf
from conftest import RUN_FAILURE, USAGE, assert_fails, error_lines, needs_xla_cpu, short_input_check
from test_check import findings, shipped_config_args

from tpurun import model as model_lib
from tpurun.check.rules.steps import StepChecker
from tpurun.check.sizing import memory
from tpurun.check.sizing.tpu_compiler import client
from tpurun.cluster import Cluster
from tpurun.model import Mode
from tpurun.run_config import RunConfig, config_files, merge_flags

SEED_CONFIGS = ("iris", "mnist", "fashion_mnist", "shakespeare", "flops")
# Seed configs checked in bfloat16 activations, not as shipped (float32): test_recipes would
# otherwise run their check again in bfloat16.
BFLOAT16_CHECKED = {
    name: ("--precision=mixed_bfloat16",) for name in ("fashion_mnist", "shakespeare")
}
# Their chips: a check traces the step once per replica, and what is each config's alone (the
# model, its data, bfloat16) is sized the same on one chip: a v5e-1, but flops (a cheap model)
# on a v5e-8 and mnist on a v5e-4, whose runs the tests of the weights, the table and the input
# check share (the batch split over a slice's replicas, its host's vCPUs).
CHIPS = {"shakespeare": 1, "mnist": 4, "flops": 8}
# fashion_mnist is checked (test_fashion_mnist_is_tpu_clean_in_bfloat16), not sized: its
# CNN's XLA:CPU sizing is mnist's here (convolutions, max-pool gradients, bfloat16
# convolutions computed in float32, the same image records), Adam's slots are sized in
# test_adam_keeps_two_slots_per_weight, and its steps' XLA:CPU optimized-HLO compiles cost
# ~15 CPU-s of the suite's for what no assertion here told apart from mnist's.
# iris's is tests/test_device_data.py's
# test_check_target_counts_the_arrays_as_the_train_steps_input (on a v5e-8, in bfloat16:
# clean, and each step fits); as shipped (float32), it is sized by the TPU compiler in
# tests/test_check_tpu_compiler.py and checked in tests/test_check.py.
SIZED_HERE = tuple(CHIPS)
# Only mnist's training input is measured (tpurun.check.bounds.host_input): a few seconds each.
INPUT_CHECK = {"mnist": ()}
_RUNS: dict[tuple[str, ...], tuple[subprocess.CompletedProcess, dict | None, float, list[str]]] = {}


@pytest.fixture(scope="session")
def seed_data(tmp_path_factory) -> dict[str, list[str]]:
    """The flags that give each seed config its data (made once)."""
    root = tmp_path_factory.mktemp("seed-data")
    return {name: shipped_config_args(name, root / name) for name in SEED_CONFIGS}


@pytest.fixture
def checked(tpurun_cli, seed_data, tmp_path_factory):
    """`checked(config, *flags)`: (result, --report JSON or None, seconds, what it wrote in
    its working directory) of `tpurun check --config=<config> <data flags> *flags
    --report=...` (the report elsewhere), run once per session, as without the TPU
    compiler: these tests are the XLA:CPU estimate's (tests/test_check_tpu_compiler.py has
    the compiler's)."""

    def run(config: str, *flags: str):
        key = (config, *flags)
        if key not in _RUNS:
            report = tmp_path_factory.mktemp("report") / "memory.json"
            sized = any(flag.startswith("--target=") for flag in flags)  # --report needs one
            work = tmp_path_factory.mktemp("work")
            start = time.perf_counter()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(client, "missing_extra", lambda: "jax")
                short_input_check(patch)
                result = tpurun_cli(
                    "check",
                    f"--config={config}",
                    *seed_data[config],
                    *flags,
                    *INPUT_CHECK.get(config, ("--input_check=false",)),
                    *([f"--report={report}"] if sized else []),
                    cwd=work,
                )
            seconds = time.perf_counter() - start
            data = json.loads(report.read_text()) if report.exists() else None
            _RUNS[key] = (result, data, seconds, sorted(p.name for p in work.iterdir()))
        return _RUNS[key][:3]

    return run


def written(config: str, *flags: str) -> list[str]:
    """What the `checked` run of `config` with `flags` wrote in its working directory."""
    return _RUNS[(config, *flags)][3]


def describe(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


# --- Every seed config on a v5e slice --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("config", SIZED_HERE)
def test_every_seed_config_is_sized_on_a_v5e_slice(checked, config, record_property):
    """Every shipped config passes check on a v5e slice's replicas (as far as a trace and an
    XLA compile can tell: warnings allowed) and each of its steps fits a replica.

    The LSTM in bfloat16 activations, the precision a TPU run wants (mnist's config is in
    it already): one check covers both its sizing and that bfloat16 keeps its steps
    TPU-clean (test_recipes checks iris and flops in it, fashion_mnist's is below)."""
    chips = CHIPS[config]
    flags = (f"--target=v5e-{chips}", *BFLOAT16_CHECKED.get(config, ()))
    result, data, seconds = checked(config, *flags)
    record_property("seconds", round(seconds, 1))
    assert result.returncode == 0, describe(result)
    assert result.stdout.startswith(
        f"Memory per replica on a v5litepod-{chips}: {chips} replicas with 16 GB of HBM each"
    ), describe(result)
    assert f"tpurun check: clean: the train, eval and predict steps of {config}" in result.stdout
    assert "error" not in "\n".join(findings(result)).lower()
    assert written(config, *flags) == [], "check writes only the report asked for"
    assert "each step fits a replica's 16 GB" in result.stdout
    assert data["target"] == f"v5litepod-{chips}" and data["replicas"] == chips
    assert {"train", "eval"} <= set(data["steps"])
    for step in data["steps"].values():
        assert step["fits"] and 0 < step["total_bytes"] < 16 * 10**9


@pytest.mark.slow
def test_fashion_mnist_is_tpu_clean_in_bfloat16(checked):
    """bfloat16 activations keep fashion_mnist's steps TPU-clean (warnings allowed), on one
    replica (the graph's and the input's rules are found in any replica's step); its sizing
    is mnist's above (see CHIPS)."""
    flags = ("--num_shards=1", *BFLOAT16_CHECKED["fashion_mnist"])
    result, data, _ = checked("fashion_mnist", *flags)
    assert result.returncode == 0, describe(result)
    assert "tpurun check: clean: the train, eval and predict steps of fashion_mnist" in (
        result.stdout
    )
    assert "error" not in "\n".join(findings(result)).lower()
    assert written("fashion_mnist", *flags) == [], "check writes nothing"
    assert data is None


@pytest.mark.slow
def test_mnists_table_names_every_row_and_the_cpus_bias(checked):
    result, data, _ = checked("mnist", "--target=v5e-4")
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["train", "eval", "predict"]
    rows = [line.split("  ")[1].strip() for line in lines[2:11]]
    assert rows == [
        "batch per replica",
        "weights",
        "optimizer state",
        "input (2 batches)",
        "other",
        "(of which TPU tile padding)",
        "total",
        "HBM per replica",
        "headroom",
    ]
    assert lines[2].split()[-3:] == ["256", "256", "64"]  # 1024, 1024 and 256 over 4
    assert "max-pool gradients" in result.stdout  # XLA:CPU's scatter: 'other' errs high
    assert data["steps"]["train"]["optimizer_bytes"] <= 16  # SGD without momentum: no slots


@pytest.mark.slow
def test_mnists_training_input_is_measured_and_a_v5e_host_figured(checked):
    """Its TFRecords (tests/synthetic_images.py) read here for a few seconds; without the TPU
    compiler (these runs), no step time to set the host's examples/s against."""
    result, data, _ = checked("mnist", "--target=v5e-4")
    text = result.stdout
    assert "Will the input keep up? The training input, measured here (" in text
    here = re.search(r"\n  here: ([\d.]+)(k|M)? examples/s on this machine's (\d+) cores", text)
    assert here and float(here.group(1)) > 0, text
    assert (
        "a v5litepod-4 host (112 vCPUs, https://cloud.google.com/tpu/docs/v5e) makes at most ~"
    ) in text
    assert "no train step time to compare with: its XLA:CPU estimate counts no FLOPs" in text
    figures = data["input"]
    assert figures["measured"] and figures["examples_per_cpu_second"] > 0
    assert figures["host_examples_per_second"] == pytest.approx(
        figures["examples_per_cpu_second"] * 112
    )
    assert (figures["hosts"], figures["examples_per_host_step"]) == (1, 1024)
    assert figures["input_bound"] is None and figures["step_examples_per_second_per_host"] is None
    # The others skip it (--input_check=false), and say so.
    _, skipped, _ = checked("flops", "--target=v5e-8")
    assert skipped["input"] == {"measured": False, "why_not": "not measured (--input_check=false)"}


@pytest.mark.slow
def test_flops_one_kernel_with_sgd_is_its_kernel_and_no_optimizer_state(checked):
    n = 1024
    _, data, _ = checked("flops", "--target=v5e-8")
    train = data["steps"]["train"]
    assert train["weights_bytes"] == pytest.approx(4 * n * n, rel=0.01)
    assert train["optimizer_bytes"] <= 16  # the iteration counter and the learning rate
    assert "predict" not in data["steps"]  # tpurun predict runs Flops.generate()
    assert "generate()" in data["not_estimated"]["predict"]


@pytest.mark.slow
def test_adam_keeps_two_slots_per_weight(checked):
    n = 256
    # One replica: its state is the same on each (mnist's v5e-4 and flops' v5e-8 runs have many).
    result, data, _ = checked(
        "flops", "--target=v5e-1", f"--config.flops.n={n}", "--config.optimizer.name=adam"
    )
    assert result.returncode == 0, describe(result)
    train = data["steps"]["train"]
    parameter_bytes = 4 * n * n  # one N x N float32 kernel, in whole TPU tiles
    assert train["weights_bytes"] == parameter_bytes
    # Momentum and velocity, plus the iteration counter (int64) and learning rate (float32).
    assert train["weights_bytes"] + train["optimizer_bytes"] == 3 * parameter_bytes + 12


@pytest.mark.slow
def test_the_estimate_follows_the_training_recipe(checked):
    """Momentum and EMA are optimizer state; accumulation stacks its micro-batches as input
    (through tf.data: on device data the input is flops' arrays, tests/test_device_data.py)."""
    n = 256
    result, data, _ = checked(
        "flops",
        "--target=v5e-1",  # one replica, as test_adam_keeps_two_slots_per_weight
        "--batch_size=128",  # 128 per replica, as 1024 on a v5e-8
        f"--config.flops.n={n}",
        "--config.optimizer.momentum=0.9",
        "--config.train.ema_decay=0.99",
        "--config.train.accumulate_steps=4",
        "--config.train.device_data=false",
    )
    assert result.returncode == 0, describe(result)
    assert "batch per replica                     128 x 4" in result.stdout
    train = data["steps"]["train"]
    parameter_bytes = 4 * n * n
    # A momentum and an average per weight, the iteration counter and the learning rate.
    assert train["optimizer_bytes"] == 2 * parameter_bytes + 12
    # 4 micro-batches of 128 rows (x and the target, float32), and the next step's 4.
    assert (train["accumulate_steps"], train["input_bytes"]) == (4, 2 * 4 * 2 * 128 * n * 4)


# --- A batch that does not fit ------------------------------------------------------------

# flops' train step (N = 1024, 10 products) at 2^19 rows per replica: some 28 GB. The XLA:CPU
# estimate's own path and words, on a cheap step (each of the search's compiles of mnist's
# cost ~5 CPU-s); mnist at 32768 per replica is sized by the TPU compiler in
# tests/test_check_tpu_compiler.py, the search itself on stand-in sizes in
# tests/test_check_batch_search.py.
TOO_BIG = 524288


@pytest.mark.slow
def test_a_batch_too_large_for_a_v5e_1_fails_with_the_largest_that_fits(checked):
    """On one chip: the search compiles one replica's step whatever the slice, and a check
    traces the step once per replica (the runs above size 4 and 8). Its training arrays are
    declared by their shape, never made (flops' train_arrays)."""
    result, data, _ = checked("flops", "--target=v5e-1", f"--batch_size={TOO_BIG}")
    assert result.returncode == RUN_FAILURE, describe(result)
    assert "Traceback" not in result.stderr
    (error,) = error_lines(result)
    assert "1 error(s) and 0 warning(s) above: flops would fail on a TPU with 1 replica" in error
    (finding,) = [line for line in result.stdout.splitlines() if line.startswith("[memory]")]
    assert finding.startswith("[memory] error: the train step needs 28 GB per replica"), finding
    assert f"at a per-replica batch of {TOO_BIG}, and a v5litepod-1 replica has 16 GB" in finding
    train = data["steps"]["train"]
    largest = train["max_batch_per_replica"]
    assert not train["fits"] and largest % 8 == 0 and 0 < largest < TOO_BIG
    above = train["batch_search"]["refused_above"]
    assert (
        f"the largest per-replica batch found to fit is {largest} (the search's answer, not a "
        f"proof: {above} does not fit, a larger batch might) by that estimate: "
        f"--batch_size={largest}"
    ) in finding
    assert "(XLA:CPU's estimate, not the TPU compiler's; pip install '.[tpu-compile]'" in finding
    search = train["batch_search"]
    assert search["compiles"] <= search["compile_bound"] == 18  # ceil(log2(2^19 / 8)) + 2
    assert f"or more replicas: a v5litepod-4 splits --batch_size={TOO_BIG} into 131072" in finding
    assert data["steps"]["eval"]["fits"]  # only the step that does not fit is an error


# That the largest batch reported fits and twice it does not is the search's property,
# whichever sizes the steps (`Preflight.largest_batch`): tested with the TPU compiler
# (tests/test_check_tpu_compiler.py) and on stand-in sizes (tests/test_check_batch_search.py),
# not again with this estimate (26 s of the suite).


# --- Usage errors ---------------------------------------------------------------------------


def test_an_unknown_type_is_refused_with_the_known_ones(tpurun_cli, tmp_path):
    result = tpurun_cli("check", "--config=iris", "--target=v7-8", cwd=tmp_path)
    line = assert_fails(result, USAGE, "unknown TPU type 'v7-8'; known: v2-N for N in {8, 32,")
    for prefix in ("v3-N", "v4-N", "v5litepod-N", "(or v5e-N)", "v5p-N", "v6e-N"):
        assert prefix in line
    assert list(tmp_path.iterdir()) == []


def test_num_shards_must_agree_with_the_target(tpurun_cli, tmp_path):
    result = tpurun_cli("check", "--config=iris", "--target=v4-8", "--num_shards=8", cwd=tmp_path)
    assert_fails(result, USAGE, "--num_shards=8 contradicts --target=v4-8, which has 4 replicas")


def test_report_needs_a_target(tpurun_cli, tmp_path):
    result = tpurun_cli("check", "--config=iris", f"--report={tmp_path / 'r.json'}")
    assert_fails(result, USAGE, "--report=", "add --target=<TPU type>")


@pytest.mark.slow
def test_an_unwritable_report_is_one_line(tpurun_cli, tmp_path, monkeypatch):
    report = tmp_path / "no" / "such" / "dir" / "r.json"
    # One replica, no input measured, and sized by the XLA:CPU estimate (not the TPU
    # compiler's process, started for this test alone) of the smallest flops model (one 8 x 8
    # kernel, no predict step: 2 compiles, not iris's 3): only the report's writing is this
    # test's, and it is written alike whatever sized the steps (fit_report.write_report).
    monkeypatch.setattr(client, "missing_extra", lambda: "jax")
    result = tpurun_cli(
        "check",
        "--config=flops",
        "--target=v5e-1",
        "--config.flops.n=8",
        "--config.flops.matmuls=1",
        "--batch_size=8",
        "--input_check=false",
        f"--report={report}",
    )
    assert result.returncode == RUN_FAILURE, describe(result)
    assert "Traceback" not in result.stderr
    (error,) = error_lines(result)
    assert error.startswith(f"tpurun check: error: cannot write --report={report} ("), error
    assert error.endswith("choose a file in a directory you can write")


# --- The step that is estimated -----------------------------------------------------------


def iris_checker() -> StepChecker:
    config = merge_flags(config_files.load(config_files.resolve("iris")), {})
    run = RunConfig(command="check", config_name="iris", config=config, model_dir="unused")
    single = Cluster(tf.distribute.get_strategy(), "1 CPU")
    return StepChecker(run, single, model_lib.create(config))


@needs_xla_cpu
def test_a_host_loop_of_steps_needs_what_one_step_needs():
    """Even compiled into one XLA loop, 50 of the Trainer's steps re-use one step's buffers."""
    checker = iris_checker()
    runner, spec = checker.single_device_step(Mode.TRAIN)
    args = tuple(checker.step_args(Mode.TRAIN, spec, checker.per_replica_batch(Mode.TRAIN)))
    variables = dict(weights=runner.keras_model.variables)
    variables["optimizer_variables"] = runner.optimizer.variables

    def host_loop(*batch):
        def body(i, total):
            return i + 1, total + runner.replica_step(*batch)["loss"]

        return tf.while_loop(lambda i, _: i < 50, body, [tf.constant(0), tf.constant(0.0)])[1]

    one = memory.estimate(runner.replica_step, args, **variables)
    loop = memory.estimate(host_loop, args, **variables)
    assert loop.padded_bytes(memory.WEIGHTS) == one.padded_bytes(memory.WEIGHTS)
    assert loop.padded_bytes(memory.OPTIMIZER) == one.padded_bytes(memory.OPTIMIZER)
    assert loop.padded_total_bytes == pytest.approx(one.padded_total_bytes, rel=0.05)


def test_the_estimated_step_is_the_trainers_with_its_optimizer():
    checker = iris_checker()
    runner, spec = checker.single_device_step(Mode.TRAIN)
    assert type(runner).__name__ == "Trainer"
    assert [s.shape[0] for s in tf.nest.flatten(spec)] == [
        checker.per_replica_batch(Mode.TRAIN)
    ] * 5
    assert runner.optimizer.variables  # built: the step creates no variable while compiled


def test_seed_configs_are_the_shipped_ones():
    # wgan_gp is no seed config: a model with its own step is sized on a v5e-8 in
    # tests/test_user_gan.py (an 8-replica trace of the WGAN-GP's step takes minutes);
    # resnet50 at full size in tests/test_check_resnet50.py, with the TPU compiler; bert
    # on 8 replicas with google-research/bert's checkpoint and records in
    # tests/test_models_bert.py (its records are not the seeds' synthetic data).
    shipped = set(config_files.builtin_names())
    assert set(SEED_CONFIGS) == shipped - {"wgan_gp", "resnet50", "bert", "bert_classifier"}
    # iris: see SIZED_HERE; fashion_mnist: see CHIPS.
    assert set(SIZED_HERE) == set(SEED_CONFIGS) - {"iris", "fashion_mnist"}
