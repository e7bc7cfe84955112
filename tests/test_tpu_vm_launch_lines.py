"""The commands `tpurun check --target` prints for a multi-host slice (tpurun.tpu_vm.launch_lines).

`check --target=v4-32` prints them after its verdict: tests/test_device_data.py's v4-32 check
sees them there; the lines themselves are tested here, without a check run.
"""

from __future__ import annotations

import shlex

import pytest

from tpurun import cli
from tpurun.tpu_vm import launch_lines


@pytest.mark.parametrize(
    "multi_host, version",
    [(True, "tpu-vm-tf-2.20.0-pod-pjrt"), (False, "tpu-vm-tf-2.20.0-pjrt")],
    ids=["pod", "one_host"],
)
def test_the_runtime_is_the_tensorflow_pjrt_one(multi_host, version):
    assert launch_lines.runtime_version(multi_host) == version


def test_a_v4_32_is_created_installed_everywhere_and_run_from_worker_0():
    lines = launch_lines.lines("v4-32", 4, "mnist")
    assert lines[0].startswith("launch on a v4-32 (4 hosts; set TPU_NAME, ZONE, PROJECT and ")
    where = "$TPU_NAME --zone=$ZONE --project=$PROJECT"
    assert lines[1:] == [
        f"  gcloud compute tpus tpu-vm create {where} --accelerator-type=v4-32 "
        "--version=tpu-vm-tf-2.20.0-pod-pjrt",
        "  gcloud compute tpus tpu-vm scp --recurse . $TPU_NAME:tpurun --zone=$ZONE "
        "--project=$PROJECT --worker=all",
        f"  gcloud compute tpus tpu-vm ssh {where} --worker=all --command='cd tpurun && pip "
        "install -r requirements-tpu.txt && pip install --no-deps .'",
        f'  gcloud compute tpus tpu-vm ssh {where} --worker=0 --command="TPU_NAME=$TPU_NAME '
        "TPU_LOAD_LIBRARY=0 tpurun train --config=mnist --tpu_zone=$ZONE --gcp_project=$PROJECT "
        '--model_dir=gs://$BUCKET/mnist"',
        "  tpurun report --model_dir=gs://$BUCKET/mnist",
    ]


def test_the_command_worker_0_runs_is_one_tpurun_accepts(monkeypatch):
    """What the ssh line runs on worker 0, its variables filled in, parses as a tpurun train."""
    (line,) = [
        line for line in launch_lines.lines("v5litepod-16", 2, "iris") if "--worker=0" in line
    ]
    command = shlex.split(line)[-1].removeprefix("--command=")
    filled = command.replace("$ZONE", "us-east1-c").replace("$PROJECT", "p")
    filled = filled.replace("$BUCKET", "b").replace("$TPU_NAME", "my-slice")
    words = shlex.split(filled)
    env = dict(word.split("=", 1) for word in words[:2])
    assert env == {"TPU_NAME": "my-slice", "TPU_LOAD_LIBRARY": "0"} and words[2] == "tpurun"
    monkeypatch.setenv("TPU_NAME", env["TPU_NAME"])
    run = cli.parse_command_line(words[2:]).run_config
    assert run is not None
    assert (run.command, run.tpu, run.tpu_zone, run.gcp_project, run.model_dir) == (
        "train",
        "my-slice",
        "us-east1-c",
        "p",
        "gs://b/iris",
    )
