"""Restarts a two-worker MultiWorkerMirroredStrategy run many times, as a job scheduler
restarts a preempted cluster, and counts the restarts that failed or hung.

    python scripts/restart_workers_trial.py [--restarts=30] [--seed=0]

Both workers run `tpurun train --config=iris` on 127.0.0.1 with the same ports at
every restart, 20 more steps each time from the last checkpoint. They start in a
random order, the second up to 10 s after the first, since real workers never
start together. A restart counts as hung when a worker is still running 150 s
after the second one started (a healthy one takes about 5 s here); each hung or
failed restart prints the error lines of both workers' logs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from offline_env import OFFLINE_ENV, free_local_ports  # scripts/offline_env.py

HUNG_AFTER = 150  # seconds


def start(workers: list[str], index: int, model_dir: Path, steps: int, log: Path):
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "tpurun", "train", "--config=iris", "--use_tpu=false"),
            "--iterations=10",
            f"--model_dir={model_dir}",
            f"--train_steps={steps}",
        ],
        env={**os.environ, **OFFLINE_ENV, "TF_CONFIG": json.dumps(tf_config)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="tpurun-restart-trial-"))
    workers = [f"127.0.0.1:{port}" for port in free_local_ports(2)]
    bad = 0
    for attempt in range(args.restarts):
        order = rng.sample([0, 1], 2)
        delay = rng.choice([0, 0.5, 2, 5, 10])
        steps = 20 * (attempt + 1)
        logs = {i: workdir / f"worker-{i}-{attempt}.log" for i in (0, 1)}
        processes = {order[0]: start(workers, order[0], workdir / "model", steps, logs[order[0]])}
        time.sleep(delay)
        processes[order[1]] = start(workers, order[1], workdir / "model", steps, logs[order[1]])
        started = time.monotonic()
        codes: list[int | str] = []
        for index in (0, 1):
            try:
                left = max(0.0, HUNG_AFTER - (time.monotonic() - started))
                codes.append(processes[index].wait(timeout=left))
            except subprocess.TimeoutExpired:
                codes.append("hung")
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        print(
            f"restart {attempt:2d}: worker {order[1]} started {delay:4.1f}s after worker "
            f"{order[0]}; exit codes {codes}; {time.monotonic() - started:.1f}s",
            flush=True,
        )
        if codes != [0, 0]:
            bad += 1
            for index in (0, 1):
                errors = [line for line in logs[index].read_text().splitlines() if "error" in line]
                print(f"    worker {index}: {' | '.join(errors)[-600:]}")
    print(f"{bad} of {args.restarts} restarts failed or hung (logs in {workdir})")


if __name__ == "__main__":
    main()
