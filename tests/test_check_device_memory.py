"""tpurun.check.report.device_memory: a TPU out of memory says what `check --target` would; the run
record keeps the estimate beside the devices' measured peak.

No TPU here: the out-of-memory errors are raised with the texts the TPU gives
(OpenXLA's error pages and reports in public issues) from inside a real
`tpurun train`, and the peak a TPU would report is given to get_memory_info.
On this CPU get_memory_info reports nothing (0), which the record says.
"""

from __future__ import annotations

import json

import pytest
import tensorflow as tf
from conftest import RUN_FAILURE, assert_fails, assert_ok

from tpurun.check.report import device_memory
from tpurun.cluster import Cluster
from tpurun.runners.train import Trainer

GIB = 1 << 30
# The compiler's message as TensorFlow raises it, the page of allocations included
# (shortened; from tensorflow/tensor2tensor#1382 and DifferentiableUniverseInitiative/flowpm#27).
COMPILE_OOM = """Compilation failure: Ran out of memory in memory space hbm. Used 20.50G of 15.48G hbm. Exceeded hbm capacity by 5.02G.

Total hbm usage >= 21.02G:
    reserved        528.00M
    program          20.50G
    arguments       unknown size

Program hbm requirement 20.50G:
    reserved           4.0K
    global           29.82M
    HLO temp         20.47G (24.2% utilization, 0.7% fragmentation (293.84M))

  Largest program allocations in hbm:

  1. Size: 12.00G
     Operator: op_type="MatMul" op_name="dense_1/MatMul"
     Shape: f32[65536,49152]{1,0:T(8,128)}
"""


@pytest.mark.parametrize(
    "message, space, needs, capacity",
    [
        (COMPILE_OOM, "HBM", int(20.50 * GIB), int(15.48 * GIB)),
        (
            "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
            "space hbm. Used 49.34G of 32.00G hbm. Exceeded hbm capacity by 17.34G.",
            "HBM",
            int(49.34 * GIB),
            32 * GIB,
        ),
        (
            "RESOURCE_EXHAUSTED: TPU TensorCore Hbm usage: 34.82G, SparseCore Hbm usage "
            "174.10G, exceeding available bytes: 95.74G",
            "HBM",
            int(34.82 * GIB) + int(174.10 * GIB),
            int(95.74 * GIB),
        ),
        (
            "Ran out of memory in memory space vmem. Used 17.50M of 16.00M vmem.",
            "vmem",
            int(17.5 * (1 << 20)),
            16 << 20,
        ),
        (
            "Resource exhausted: Attempting to reserve 5.88G at the bottom of memory. That was "
            "not possible. There are 14.74G free, 0B reserved, and 4.62G reservable.",
            "HBM",
            None,
            None,
        ),
        (
            "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 8.00M. "
            "That was not possible. There are 6.43M free.; (0x0x1_HBM0)",
            "HBM",
            None,
            None,
        ),
        (
            "OOM when allocating tensor with shape[65536,4096] and type float on "
            "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
            "device memory",
            None,
            None,
        ),
    ],
    ids=["tf-compile", "xla-e1000", "sparsecore", "vmem", "load", "buffer", "gpu"],
)
def test_out_of_memory_messages_are_recognised(message, space, needs, capacity):
    found = device_memory.parse(message)
    assert found is not None
    assert (found.space, found.needs, found.capacity) == (space, needs, capacity)


def test_other_resource_exhaustion_is_not_taken_for_memory():
    assert device_memory.parse("Resource exhausted: too many open files") is None


@pytest.fixture
def oom_in_training(monkeypatch):
    """`tpurun train` whose first host loop fails as a TPU out of memory would: `message`."""

    def fail_with(message: str) -> None:
        def train(self, num_steps):
            raise tf.errors.ResourceExhaustedError(None, None, message)

        monkeypatch.setattr(Trainer, "train", train)

    return fail_with


# The plain loop, not "auto": no run here is about the loop, and auto times both loops on the
# model's step before training (at --batch_size=65536, seconds of real steps).
IRIS = ("train", "--config=iris", "--use_tpu=false", "--config.train.xla=false")


@pytest.mark.slow
def test_a_tpu_out_of_memory_is_one_line_with_the_batch_that_fits(
    tpurun_cli, oom_in_training, tmp_path
):
    oom_in_training(COMPILE_OOM)
    # 65536 rows per replica: the activations, not the weights, fill the memory.
    result = tpurun_cli(*IRIS, f"--model_dir={tmp_path / 'model'}", "--batch_size=65536")
    line = assert_fails(
        result,
        RUN_FAILURE,
        "the train step ran out of HBM (XLA's TPU compile needs 20.50G per replica, which "
        "has 15.48G): the largest per-replica batch that fits is about ",
        "or more replicas",
    )
    # The estimate is scaled to what the TPU measured: 15.48 / 20.50 of the memory.
    largest = int(line.split("fits is about ")[1].split(":")[0])
    assert 0.6 * 65536 < largest < 0.8 * 65536, line
    assert f"--batch_size={largest} (1 replica)" in line
    assert not (tmp_path / "model").exists()  # nothing was saved: the run leaves nothing


@pytest.mark.slow
def test_an_allocation_failure_points_to_check_for_the_batch(tpurun_cli, oom_in_training, tmp_path):
    oom_in_training(
        "Attempting to reserve 5.88G at the bottom of memory. That was not possible. There "
        "are 14.74G free, 0B reserved, and 4.62G reservable."
    )
    result = tpurun_cli(*IRIS, f"--model_dir={tmp_path / 'model'}")
    assert_fails(
        result,
        RUN_FAILURE,
        "the train step ran out of HBM (the TPU needed 5.88G more and had 14.74G free): a "
        "smaller per-replica batch than 32 (--batch_size); `tpurun check --config=iris "
        "--target=<TPU type>` finds the largest that fits",
    )


@pytest.mark.slow
def test_other_resource_exhaustion_keeps_tensorflows_line(tpurun_cli, oom_in_training, tmp_path):
    oom_in_training("too many open files")
    result = tpurun_cli(*IRIS, f"--model_dir={tmp_path / 'model'}")
    assert_fails(result, RUN_FAILURE, "ResourceExhaustedError: too many open files")


def run_record(model_dir) -> dict:
    (record,) = (model_dir / "runs").glob("*-train.json")
    return json.loads(record.read_text())


@pytest.mark.slow
def test_on_a_cpu_the_record_says_no_peak_is_reported(tpurun_cli, tmp_path):
    model_dir = tmp_path / "model"
    assert_ok(tpurun_cli(*IRIS, f"--model_dir={model_dir}", "--train_steps=10", "--iterations=10"))
    memory = run_record(model_dir)["memory"]
    assert memory["peak_bytes_per_replica"] is None
    assert "no TPU or GPU reported its peak memory" in memory["why"]
    assert "estimate" not in memory  # no compile spent on a run with nothing to compare


@pytest.mark.slow
def test_where_a_device_reports_its_peak_the_estimate_is_beside_it(
    tpurun_cli, tmp_path, monkeypatch
):
    monkeypatch.setattr(device_memory, "peak_bytes", lambda where: 123_456_789)
    model_dir = tmp_path / "model"
    assert_ok(tpurun_cli(*IRIS, f"--model_dir={model_dir}", "--train_steps=10", "--iterations=10"))
    memory = run_record(model_dir)["memory"]
    assert memory["peak_bytes_per_replica"] == 123_456_789
    estimate = memory["estimate"]
    assert (estimate["step"], estimate["batch_per_replica"]) == ("train", 32)
    parts = ("weights_bytes", "optimizer_bytes", "input_bytes", "other_bytes")
    assert estimate["total_bytes"] == sum(estimate[k] for k in parts)
    # Iris trains with Adagrad: one accumulator per weight, padded alike, plus the
    # iteration counter (int64) and the learning rate (float32).
    assert estimate["optimizer_bytes"] == estimate["weights_bytes"] + 12


class _Devices:
    def __init__(self, *devices: str):
        self.worker_devices = devices


class _Strategy:
    def __init__(self, *devices: str):
        self.extended = _Devices(*devices)


@pytest.mark.parametrize(
    "devices, peaks, expected",
    [
        (
            (
                "/job:worker/replica:0/task:0/device:TPU:0",
                "/job:worker/replica:0/task:0/device:TPU:1",
            ),
            {"TPU:0": 5, "TPU:1": 9},
            9,
        ),
        (("/device:GPU:0",), {"GPU:0": 7}, 7),
        (("/device:CPU:0", "/device:CPU:1"), {"CPU:0": 32 << 20, "CPU:1": 1}, None),
        (("/device:TPU:0",), {"TPU:0": 0}, None),
    ],
    ids=["tpus", "gpu", "cpus-ignored", "zero"],
)
def test_the_peak_is_the_largest_of_the_replicas_accelerators(
    monkeypatch, devices, peaks, expected
):
    def memory_info(device: str) -> dict:
        spec = tf.DeviceSpec.from_string(device)
        return {"current": 0, "peak": peaks[f"{spec.device_type}:{spec.device_index}"]}

    monkeypatch.setattr(tf.config.experimental, "get_memory_info", memory_info)
    where = Cluster(_Strategy(*devices), "fake")
    assert device_memory.peak_bytes(where) == expected
