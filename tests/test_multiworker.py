"""MultiWorkerMirroredStrategy from TF_CONFIG: two worker processes on 127.0.0.1 train together."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import OFFLINE_ENV

pytestmark = pytest.mark.slow

# Runs the launcher's own train path, then saves this worker's final weights so the
# test can compare workers (a non-chief keeps no checkpoint of its own).
WORKER = """
import logging
import sys
import numpy as np
from absl import logging as absl_logging
from tpurun import cli, cluster as cluster_lib, commands, model as model_lib
from tpurun.train import Trainer

run = cli.parse("train", ["tpurun", *sys.argv[2:]])
absl_logging.use_absl_handler()
logging.root.setLevel(logging.INFO)
cluster = cluster_lib.build(run)
if cluster.is_chief:
    commands.prepare_model_dir(run)
    commands.write_record(run)
trainer = Trainer(run, cluster, model_lib.create(run.config))
trainer.train()
np.savez(sys.argv[1], *[v.numpy() for v in trainer.keras_model.weights])
print("task", cluster.task, "chief", cluster.is_chief, "replicas", cluster.num_replicas)
"""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_two_workers_end_with_identical_weights_and_only_the_chief_writes(tmp_path):
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    model_dir = tmp_path / "model"
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, **OFFLINE_ENV, "TF_CONFIG": json.dumps(tf_config)}
        args = [
            sys.executable,
            "-c",
            WORKER,
            str(tmp_path / f"weights-{index}.npz"),
            "--config=iris",
            "--use_tpu=false",
            "--train_steps=40",
            "--iterations=10",
            "--config.train.save_checkpoints_steps=20",
            f"--model_dir={model_dir}",
        ]
        processes.append(
            subprocess.Popen(
                args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs = [p.communicate(timeout=300) for p in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err[-4000:]
    assert "task worker-0 chief True replicas 2" in outputs[0][0]
    assert "task worker-1 chief False replicas 2" in outputs[1][0]

    chief = np.load(tmp_path / "weights-0.npz")
    other = np.load(tmp_path / "weights-1.npz")
    assert len(chief.files) == 6
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name])

    # Only the chief's checkpoints and one run record; the worker's scratch copies are gone.
    assert (model_dir / "ckpt-20.index").exists() and (model_dir / "ckpt-40.index").exists()
    assert len(list((model_dir / "runs").iterdir())) == 1
    scratch = model_dir / ".scratch"
    assert not scratch.exists() or not any(scratch.rglob("*.index"))
    assert "Saved checkpoint" in outputs[0][1] and "Saved checkpoint" not in outputs[1][1]
