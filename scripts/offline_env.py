"""The environment every script's tpurun subprocess runs in: no traffic beyond 127.0.0.1.

Google libraries probe the metadata server and googleapis.com on their own; these
point them at a closed local port (as the Makefile and tests/conftest.py do).
Servers the scripts and tests start (worker clusters, fakes) take ports from
`free_local_ports`.
"""

import json
import os
import socket
import subprocess
import sys
import time

OFFLINE_ENV = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:1",
    "GCE_METADATA_IP": "127.0.0.1:1",
    "GCS_RETRY_CONFIG_MAX_RETRIES": "0",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def free_local_ports(count: int) -> list[int]:
    """`count` distinct ports on 127.0.0.1 that nothing listens on right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_json_worker(command: list[str]) -> object:
    """Runs a benchmark worker (a Python command) offline; its last stdout line, as JSON.

    Anything above that line is noise (TensorFlow's own prints); a failed worker
    shows its stderr and ends the benchmark.
    """
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **OFFLINE_ENV}
    )
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(f"{' '.join(command[1:3])} failed (exit {result.returncode})")
    return json.loads(result.stdout.strip().splitlines()[-1])


def execution_stamps():
    """A Keras callback whose `stamps` are the perf_counter() at the end of every
    execution of `fit` (`steps_per_execution` steps): timing fit from inside."""
    import keras  # here: only the benchmarks that time fit import Keras

    class ExecutionStamps(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.stamps: list[float] = []

        def on_train_batch_end(self, batch, logs=None) -> None:
            self.stamps.append(time.perf_counter())

    return ExecutionStamps()
