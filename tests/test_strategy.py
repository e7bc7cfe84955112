"""tpurun.cluster.strategy: which tf.distribute strategy a run gets, on this CPU-only test process.

The process's CPU is split into 8 logical devices at start-up (conftest), as
`--num_shards=8` splits a fresh process's.
"""

from __future__ import annotations

import json

import pytest
import tensorflow as tf
from conftest import IN_PROCESS_REPLICAS, capture_info_logs

from tpurun.cluster import packed_reduction, strategy, tpu
from tpurun.errors import RunError, UsageError
from tpurun.run_config import RunConfig, config_files, merge_flags


def iris_run(**fields) -> RunConfig:
    config = merge_flags(config_files.load(config_files.resolve("iris")), {})
    return RunConfig("train", "iris", config, model_dir="/tmp/unused", **fields)


@pytest.mark.parametrize("num_shards", [None, 1])
def test_one_replica_is_tensorflows_default_strategy(num_shards):
    """Not MirroredStrategy over one device: about 2.5x slower per step."""
    one = strategy.local(num_shards)
    assert one.strategy is tf.distribute.get_strategy()
    assert one.num_replicas == 1
    assert one.description == "1 CPU replica (default strategy)"
    assert (one.is_chief, one.num_workers, one.is_tpu) == (True, 1, False)


@pytest.mark.parametrize("num_shards", [2, 3, 8])
def test_n_replicas_are_a_mirrored_strategy_over_n_logical_cpus(num_shards):
    local = strategy.local(num_shards)
    assert isinstance(local.strategy, tf.distribute.MirroredStrategy)
    assert local.num_replicas == num_shards
    assert local.description == f"{num_shards} logical CPU replicas (MirroredStrategy)"
    devices = local.strategy.extended.worker_devices
    assert [tf.DeviceSpec.from_string(d).device_index for d in devices] == list(range(num_shards))
    assert isinstance(
        local.strategy.extended._cross_device_ops,  # noqa: SLF001 - no public accessor
        packed_reduction.PackedReductionToOneDevice,
    )


def test_more_replicas_than_the_process_split_its_cpu_into_is_a_run_error():
    with pytest.raises(RunError) as raised:
        strategy.local(IN_PROCESS_REPLICAS + 1)
    assert str(raised.value) == (
        f"--num_shards={IN_PROCESS_REPLICAS + 1} needs {IN_PROCESS_REPLICAS + 1} logical CPU "
        f"devices but TensorFlow was already initialised with {IN_PROCESS_REPLICAS} in this "
        "process; run tpurun in a new process"
    )


@pytest.mark.parametrize(
    "tf_config",
    [
        "{not json",
        json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}),  # no task
        json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker"}}),
        json.dumps({"cluster": {}, "task": {"type": "worker", "index": "first"}}),
        json.dumps(["not", "a", "dict"]),
    ],
    ids=["not_json", "no_task", "no_index", "index_not_a_number", "a_list"],
)
def test_an_invalid_tf_config_is_a_usage_error_showing_a_valid_one(monkeypatch, tf_config):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(UsageError) as raised:
        strategy.build(iris_run(use_tpu=False))
    assert str(raised.value).startswith("TF_CONFIG is not valid: it must be JSON like {")


@pytest.mark.parametrize(
    "tf_config",
    [
        "",
        "  \n",
        json.dumps(
            {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
        ),
    ],
    ids=["empty", "blank", "one_worker"],
)
def test_tf_config_of_one_worker_or_none_runs_locally(monkeypatch, tf_config):
    """A blank TF_CONFIG (as a scheduler may export) is no cluster: MirroredStrategy used to
    fail on it with "unexpected JSONDecodeError"."""
    monkeypatch.setenv("TF_CONFIG", tf_config)
    assert strategy.build(iris_run(use_tpu=False, num_shards=2)).num_replicas == 2
    assert strategy.local(3).num_replicas == 3  # as `tpurun check` builds it


@pytest.fixture
def no_tpu_connect(monkeypatch):
    """tpu.connect replaced by a recorder: what build decides, without connecting anywhere."""
    connected: list[RunConfig] = []
    monkeypatch.setattr(tpu, "connect", lambda run: connected.append(run) or "the TPU")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    return connected


@pytest.mark.parametrize(
    "use_tpu, tpu_name, vm, wants_tpu",
    [
        (True, None, False, True),  # asked for: TPU or fail (connect says why)
        (None, "grpc://10.0.0.2:8470", False, True),  # configured
        (None, None, True, True),  # detected: a TPU VM
        (None, None, False, False),  # none: local, said in one line
        (False, None, True, False),  # --use_tpu=false on a TPU VM: local
    ],
    ids=["use_tpu", "configured", "tpu_vm", "nothing", "use_tpu_false"],
)
def test_build_picks_the_tpu_or_local(
    monkeypatch, caplog, no_tpu_connect, use_tpu, tpu_name, vm, wants_tpu
):
    capture_info_logs(caplog)
    monkeypatch.setattr(strategy, "tpu_vm_detected", lambda: vm)
    run = iris_run(use_tpu=use_tpu, tpu=tpu_name)
    built = strategy.build(run)
    assert (built == "the TPU") is wants_tpu
    assert no_tpu_connect == ([run] if wants_tpu else [])
    said = "No TPU configured (--tpu and TPU_NAME unset, not a TPU VM): running locally."
    assert (said in caplog.messages) is (use_tpu is None and not wants_tpu)
