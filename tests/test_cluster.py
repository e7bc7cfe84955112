"""tpurun.cluster: the Cluster a run executes on, and facts about this machine and TF_CONFIG."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from tpurun import cluster, tpu_vm
from tpurun.cluster import Cluster, is_chief_process, is_chief_task, machines, strategy
from tpurun.errors import UsageError
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.tpu_vm import devices


def iris_run(**flags) -> RunConfig:
    config = merge_flags(config_files.load(config_files.resolve("iris")), flags)
    return RunConfig("train", "iris", config, model_dir="/tmp/unused")


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            {"batch_size": 30},
            "--batch_size=30 is not divisible by the 8 replicas; use a multiple of 8 (e.g. 24 or 32)",
        ),
        (
            {"eval_batch_size": 4},
            "--eval_batch_size=4 is not divisible by the 8 replicas; use a multiple of 8 (e.g. 8)",
        ),
        (
            {"predict_batch_size": 12},
            "--predict_batch_size=12 is not divisible by the 8 replicas; use a multiple of 8 "
            "(e.g. 8 or 16)",
        ),
    ],
    ids=["train", "eval", "predict"],
)
def test_check_batch_sizes_names_the_batch_and_the_fix(flags, message):
    sizes = {"batch_size": 32, "eval_batch_size": 32, "predict_batch_size": 8, **flags}
    eight = strategy.local(8)
    with pytest.raises(UsageError) as raised:
        eight.check_batch_sizes(iris_run(**sizes))
    assert str(raised.value) == message


def test_check_batch_sizes_accepts_batches_that_split():
    strategy.local(8).check_batch_sizes(iris_run(predict_batch_size=16))
    Cluster(tf.distribute.get_strategy(), "one").check_batch_sizes(iris_run(batch_size=7))


def test_num_replicas_is_the_strategys():
    assert strategy.local(4).num_replicas == 4
    assert Cluster(tf.distribute.get_strategy(), "one").num_replicas == 1


def test_replica_sum_adds_every_replicas_values():
    four = strategy.local(4).strategy
    total = tf.function(lambda: cluster.replica_sum(four, tf.constant([1, 5])))()
    assert total.numpy().tolist() == [4, 20]


@pytest.mark.parametrize(
    "cluster_spec, task_type, task_index, expected",
    [
        ({"chief": ["a:1"], "worker": ["b:1"]}, "chief", 0, True),
        ({"chief": ["a:1"], "worker": ["b:1"]}, "worker", 0, False),  # a chief is named
        ({"worker": ["a:1", "b:1"]}, "worker", 0, True),  # none named: worker 0
        ({"worker": ["a:1", "b:1"]}, "worker", 1, False),
        ({"worker": ["a:1"], "ps": ["p:1"]}, "ps", 0, False),
        ({"worker": ["a:1"], "evaluator": ["e:1"]}, "evaluator", 0, False),
    ],
    ids=["chief", "worker0_beside_a_chief", "worker0", "worker1", "ps", "evaluator"],
)
def test_is_chief_task(cluster_spec, task_type, task_index, expected):
    assert is_chief_task(cluster_spec, task_type, task_index) is expected


WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


@pytest.mark.parametrize(
    "tf_config, expected",
    [
        (None, True),  # a single process
        ("", True),
        ("   ", True),
        (json.dumps({"cluster": WORKERS, "task": {"type": "worker", "index": 0}}), True),
        (json.dumps({"cluster": WORKERS, "task": {"type": "worker", "index": 1}}), False),
        (json.dumps({"cluster": WORKERS, "task": {"type": "worker", "index": "1"}}), False),
        (
            json.dumps(
                {"cluster": {"chief": ["c:1"], **WORKERS}, "task": {"type": "worker", "index": 0}}
            ),
            False,
        ),
        ("{not json", True),  # the strategy's error, not a reason to keep a failed run's dir
        (json.dumps({"cluster": WORKERS}), True),  # no task
        (json.dumps(["a", "list"]), True),
    ],
    ids=[
        "unset",
        "empty",
        "blank",
        "worker0",
        "worker1",
        "index_as_text",
        "worker0_beside_a_chief",
        "not_json",
        "no_task",
        "not_a_dict",
    ],
)
def test_is_chief_process_from_tf_config(monkeypatch, tf_config, expected):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    assert is_chief_process() is expected


@pytest.fixture
def machine(monkeypatch):
    """Makes up this machine's /dev entries and installed packages."""

    class Machine:
        devices: dict[str, list[str]] = {}
        packages: set[str] = set()

    def glob(pattern: str) -> list[str]:
        return list(Machine.devices.get(pattern, []))

    def find_spec(name: str):
        return object() if name in Machine.packages else None

    monkeypatch.setattr(devices.glob, "glob", glob)
    monkeypatch.setattr(machines.importlib.util, "find_spec", find_spec)
    return Machine


@pytest.mark.parametrize(
    "devices, files",
    [
        ({}, []),
        ({"/dev/accel*": ["/dev/accel1", "/dev/accel0"]}, ["/dev/accel0", "/dev/accel1"]),
        ({"/dev/vfio/[0-9]*": ["/dev/vfio/0", "/dev/vfio/1"]}, ["/dev/vfio/0", "/dev/vfio/1"]),
    ],
    ids=["none", "v2_v3_accel", "v4_on_vfio"],
)
def test_tpu_device_files(machine, devices, files):
    machine.devices = devices
    assert tpu_vm.devices.tpu_device_files() == files


@pytest.mark.parametrize(
    "devices, packages, detected",
    [
        ({"/dev/accel*": ["/dev/accel0"]}, {"libtpu"}, True),
        ({"/dev/vfio/[0-9]*": ["/dev/vfio/0"]}, {"libtpu"}, True),
        ({"/dev/accel*": ["/dev/accel0"]}, set(), False),  # chips, but no libtpu
        ({}, {"libtpu"}, False),  # libtpu, but no chips (a CPU VM with tensorflow-tpu)
    ],
    ids=["accel", "vfio", "no_libtpu", "no_chips"],
)
def test_tpu_vm_detected_needs_chips_and_libtpu(machine, devices, packages, detected):
    machine.devices, machine.packages = devices, packages
    assert cluster.tpu_vm_detected() is detected
