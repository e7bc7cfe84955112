"""A TPU VM's slice, from a fake metadata server on 127.0.0.1 (tpurun.tpu_vm.slice_rules, metadata).

The four machines of a pod slice's life: a single-host v5e-8 (nothing changes), worker 0 of a
v4-32 (--tpu=local refused with the command to run instead; --tpu=<the slice> runs, with
TPU_LOAD_LIBRARY=0), worker 2 of it (refused: the job runs from worker 0), and a machine with
no metadata server (nothing changes, nothing waits). All of it happens before TensorFlow starts:
the refusals call the CLI's `main` in this process, which returns before anything loads or
runs TensorFlow; the rest calls `tpu_vm.prepare` as the CLI does. Every socket the test's thread connects is recorded: only
the fake server's address appears.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest
from conftest import free_local_ports
from fake_metadata import FakeMetadataServer, slice_attributes

from tpurun import cli, tpu_vm
from tpurun.errors import UsageError
from tpurun.tpu_vm import metadata

LOAD_LIBRARY = "TPU_LOAD_LIBRARY"
ZONE_AND_PROJECT = ("--tpu_zone=us-central2-b", "--gcp_project=my-project")


@pytest.fixture
def connections(monkeypatch) -> list[object]:
    """The addresses this test's thread connects a socket to, in order."""
    seen: list[object] = []
    mine = threading.get_ident()
    real_connect = socket.socket.connect

    def connect(sock, address):
        if threading.get_ident() == mine:
            seen.append(address)
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return seen


@pytest.fixture(autouse=True)
def no_load_library_set(monkeypatch):
    """TPU_LOAD_LIBRARY unset for the test, and unset again after it (tpurun sets it)."""
    monkeypatch.setenv(LOAD_LIBRARY, "unset")
    monkeypatch.delenv(LOAD_LIBRARY)


@pytest.fixture
def tpu_chips(monkeypatch):
    """This machine shows TPU chips (as a TPU VM's /dev does)."""
    monkeypatch.setattr(tpu_vm.checks, "tpu_device_files", lambda: ["/dev/accel0"])


def served(monkeypatch, attributes: dict[str, str]) -> FakeMetadataServer:
    server = FakeMetadataServer(attributes)
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return server


def parsed(*args: str):
    argv = ["tpurun", *args]
    invocation = cli.parse_command_line(argv)
    assert invocation.run_config is not None
    return argv, invocation.run_config


def host_port(address: str) -> tuple[str, int]:
    host, port = address.split(":")
    return host, int(port)


# --- The four machines --------------------------------------------------------------------


def test_a_single_host_v5e_8_changes_nothing(monkeypatch, connections, tmp_path):
    with served(monkeypatch, slice_attributes("v5litepod-8", worker=0, hosts=1)) as server:
        argv, run = parsed("train", "--config=iris", "--tpu=local", f"--model_dir={tmp_path}/m")
        tpu_vm.prepare(argv, run)  # no error, no line: on to TensorFlow
    assert server.requests[0].endswith("/accelerator-type")
    assert LOAD_LIBRARY not in os.environ
    assert set(connections) == {host_port(server.address)}


def test_worker_0_of_a_v4_32_refuses_tpu_local_with_the_command_to_run(
    monkeypatch, connections, capsys, tmp_path
):
    with served(monkeypatch, slice_attributes("v4-32", worker=0, hosts=4)) as server:
        code = cli.main(
            ["tpurun", "train", "--config=iris", "--tpu=local", f"--model_dir={tmp_path}/m"]
        )
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "tpurun train: error: --tpu=local cannot drive worker 0 of the v4-32 slice 'pod' "
        "(4 hosts): TensorFlow's local TPU is this host's chips alone; run, on this worker 0: "
        f"tpurun train --config=iris --model_dir={tmp_path}/m --tpu=pod "
        "--tpu_zone=us-central2-b --gcp_project=my-project"
    ]
    assert list(tmp_path.iterdir()) == []
    assert set(connections) == {host_port(server.address)}


def test_worker_0_of_a_v4_32_runs_the_slice_by_name_without_loading_libtpu(
    monkeypatch, connections, tpu_chips
):
    """`TPU_NAME=pod tpurun train` as Google's runbook has it: TensorFlow will load no libtpu."""
    monkeypatch.setenv("TPU_NAME", "pod")
    with served(monkeypatch, slice_attributes("v4-32", worker=0, hosts=4)) as server:
        argv, run = parsed(
            "train", "--config=iris", *ZONE_AND_PROJECT, "--model_dir=gs://bucket/iris"
        )
        assert run.tpu == "pod"
        tpu_vm.prepare(argv, run)  # no error: on to TensorFlow
    assert os.environ[LOAD_LIBRARY] == "0"
    assert set(connections) == {host_port(server.address)}


def test_a_users_tpu_load_library_is_left_alone(monkeypatch, tpu_chips):
    monkeypatch.setenv(LOAD_LIBRARY, "1")
    with served(monkeypatch, slice_attributes("v4-32", worker=0, hosts=4)):
        argv, run = parsed("train", "--config=iris", "--tpu=pod", *ZONE_AND_PROJECT)
        tpu_vm.prepare(argv, run)
    assert os.environ[LOAD_LIBRARY] == "1"


def test_worker_2_of_a_v4_32_says_the_job_runs_from_worker_0(
    monkeypatch, connections, tpu_chips, capsys, tmp_path
):
    with served(monkeypatch, slice_attributes("v4-32", worker=2, hosts=4)) as server:
        code = cli.main(
            [
                "tpurun",
                "train",
                "--config=iris",
                "--tpu=pod",
                *ZONE_AND_PROJECT,
                f"--model_dir={tmp_path}/m",
            ]
        )
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "tpurun train: error: this is worker 2 of the v4-32 slice 'pod' (4 hosts): a job on a "
        "multi-host slice runs from worker 0 only, which drives every host's TPU; run it "
        "there: gcloud compute tpus tpu-vm ssh pod --zone=us-central2-b --project=my-project "
        "--worker=0 --command='tpurun train --config=iris --tpu=pod --tpu_zone=us-central2-b "
        f"--gcp_project=my-project --model_dir={tmp_path}/m'"
    ]
    assert list(tmp_path.iterdir()) == []  # the model_dir untouched
    assert LOAD_LIBRARY not in os.environ
    assert set(connections) == {host_port(server.address)}


def test_no_metadata_server_changes_nothing(monkeypatch, connections, tmp_path):
    """--tpu=local where nothing answers: one refused connection to the configured address."""
    (port,) = free_local_ports(1)
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")
    argv, run = parsed("train", "--config=iris", "--tpu=local", f"--model_dir={tmp_path}/m")
    tpu_vm.prepare(argv, run)
    assert connections == [("127.0.0.1", port)]
    assert LOAD_LIBRARY not in os.environ


def test_a_laptop_asks_nothing(monkeypatch, connections, tmp_path):
    """No TPU chips and no --tpu=local: not one connection, so nothing to wait for."""
    monkeypatch.setattr(tpu_vm.checks, "tpu_device_files", lambda: [])
    for args in (["--use_tpu=false"], [], ["--tpu=grpc://127.0.0.1:1"], ["--tpu=pod"]):
        argv, run = parsed("train", "--config=iris", *args, *ZONE_AND_PROJECT)
        tpu_vm.prepare(argv, run)
    assert connections == []


# --- What the rules cover ------------------------------------------------------------------


def test_a_cpu_run_or_a_check_on_a_worker_asks_nothing(monkeypatch, connections, tpu_chips):
    """--use_tpu=false trains on this host's CPU, and check traces on it: no slice rule."""
    for args in (["train", "--use_tpu=false"], ["check", "--target=v4-32"]):
        argv, run = parsed(*args, "--config=iris", "--model_dir=gs://b/iris")
        tpu_vm.prepare(argv, run)
    assert connections == []


@pytest.mark.parametrize("command", ["eval", "predict", "export"])
def test_every_job_on_the_tpu_runs_from_worker_0(monkeypatch, tpu_chips, command):
    with served(monkeypatch, slice_attributes("v5litepod-16", worker=1, hosts=2)):
        argv, run = parsed(command, "--config=iris", "--tpu=pod", *ZONE_AND_PROJECT)
        with pytest.raises(UsageError, match="runs from worker 0 only"):
            tpu_vm.prepare(argv, run)


def test_no_tpu_flag_on_a_pod_worker_is_tpu_local(monkeypatch, tpu_chips):
    with served(monkeypatch, slice_attributes("v4-32", worker=0, hosts=4)):
        argv, run = parsed("train", "--config=iris", "--model_dir=gs://b/iris")
        with pytest.raises(UsageError) as raised:
            tpu_vm.prepare(argv, run)
    assert str(raised.value).startswith("no --tpu (on a TPU VM: --tpu=local) cannot drive")
    assert str(raised.value).endswith(
        "tpurun train --config=iris --model_dir=gs://b/iris --tpu=pod "
        "--tpu_zone=us-central2-b --gcp_project=my-project"
    )


def test_a_slice_without_tpu_env_names_what_to_fill_in(monkeypatch, tpu_chips):
    attributes = slice_attributes("v4-32", worker=0, hosts=4)
    del attributes["tpu-env"]
    with served(monkeypatch, attributes):
        argv, run = parsed("train", "--config=iris", "--tpu", "local", "--tpu_zone=z")
        with pytest.raises(UsageError) as raised:
            tpu_vm.prepare(argv, run)
    assert str(raised.value).endswith(
        "tpurun train --config=iris --tpu_zone=z '--tpu=<the slice name>' '--gcp_project=<project>'"
    )


# --- The metadata server ------------------------------------------------------------------


def test_the_slice_as_the_metadata_server_describes_it(monkeypatch):
    with served(monkeypatch, slice_attributes("v4-32", worker=2, hosts=4)) as server:
        facts = metadata.read_slice()
    assert facts == metadata.SliceFacts(
        accelerator_type="v4-32",
        worker=2,
        worker_addresses=("10.130.0.10", "10.130.0.11", "10.130.0.12", "10.130.0.13"),
        name="pod",
        zone="us-central2-b",
        project="my-project",
    )
    assert facts.multi_host and facts.hosts == 4
    assert server.requests == [
        metadata.ATTRIBUTES + name
        for name in (
            "accelerator-type",
            "agent-worker-number",
            "worker-network-endpoints",
            "tpu-env",
        )
    ]


def test_a_gce_vm_without_a_tpu_is_no_slice(monkeypatch):
    with served(monkeypatch, {"something-else": "x"}) as server:
        assert metadata.read_slice() is None
    assert len(server.requests) == 1  # asked for the accelerator type, and stopped


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "169.254.169.254"),
        ({"GCE_METADATA_IP": "127.0.0.1:9"}, "127.0.0.1:9"),
        ({"GCE_METADATA_HOST": "127.0.0.1:8", "GCE_METADATA_IP": "127.0.0.1:9"}, "127.0.0.1:8"),
    ],
    ids=["the_vms_own", "ip", "host_first"],
)
def test_only_the_vms_own_metadata_address_is_asked(monkeypatch, env, expected):
    for name in metadata.ADDRESS_ENVS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert metadata.address() == expected
