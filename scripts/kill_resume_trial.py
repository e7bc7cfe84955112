"""Kills a training run with SIGKILL at random moments, resumes it each time, and compares
its final weights with an uninterrupted run's.

    python scripts/kill_resume_trial.py [--kills=20] [--seed=0]

Iris, 2000 steps, a checkpoint every host loop of 10 steps (keeping 3), so a kill
lands in a loop, in a save or in the deletion of an old checkpoint. For each kill
it prints the last step the run logged, what the kill left in model_dir, and the
step the next attempt resumed from (the steps it redoes). The weights are then
compared bit for bit (the checkpoint's save counter aside).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from offline_env import OFFLINE_ENV  # scripts/offline_env.py

ARGS = (
    "--config=iris",
    "--use_tpu=false",
    "--iterations=10",
    "--save_checkpoints_steps=10",
    "--keep_checkpoint_max=3",
    "--train_steps=2000",
)


def start(model_dir: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tpurun", "train", *ARGS, f"--model_dir={model_dir}"],
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )


def leftovers(model_dir: Path) -> str:
    """What an interrupted save left, as TensorFlow wrote it."""
    import tensorflow as tf

    found = []
    if list(model_dir.glob("ckpt-*_temp*")):
        found.append("unmerged _temp")
    indexes = {p.name[: -len(".index")] for p in model_dir.glob("ckpt-*.index")}
    data = {p.name.split(".data-")[0] for p in model_dir.glob("ckpt-*.data-*")}
    if data - indexes:
        found.append(".data without .index")
    newest = max(indexes, key=lambda n: int(n[5:]), default=None)
    named = tf.train.latest_checkpoint(str(model_dir))
    if newest and (named is None or Path(named).name != newest):
        found.append("state file behind the files")
    return ", ".join(found) or "-"


def weights(path: str) -> dict[str, np.ndarray]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    return {
        n: reader.get_tensor(n)
        for n in reader.get_variable_to_shape_map()
        if not n.startswith("save_counter")
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    flags = parser.parse_args()
    rng = random.Random(flags.seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        reference = work / "reference"
        process = start(reference, work / "reference.log")
        began = time.monotonic()
        if process.wait() != 0:
            raise SystemExit((work / "reference.log").read_text()[-3000:])
        print(f"uninterrupted run: {time.monotonic() - began:.1f}s")

        model_dir = work / "killed"
        print(f"{'kill':>4} {'after':>7} {'last logged':>11} {'left behind':<40} {'resumed':>8}")
        rows = []
        attempt = 0
        while True:
            log = work / f"attempt-{attempt}.log"
            process = start(model_dir, log)
            if len(rows) < flags.kills:
                # Wait until this attempt trains (its first loop line), then kill
                # after a random 0-400 ms: inside loops, saves and deletions.
                while not re.search(r"\] step \d+/", log.read_text()) and process.poll() is None:
                    time.sleep(0.01)
                delay = rng.uniform(0.0, 0.4)
                time.sleep(delay)
                if process.poll() is None:
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                    text = log.read_text()
                    logged = re.findall(r"\] step (\d+)/", text)
                    rows.append(
                        [len(rows) + 1, delay, logged[-1] if logged else "-", leftovers(model_dir)]
                    )
                    attempt += 1
                    continue
            if process.wait() != 0:
                raise SystemExit(log.read_text()[-3000:])
            break
        # The step each later attempt resumed from.
        for index, row in enumerate(rows):
            text = (work / f"attempt-{index + 1}.log").read_text()
            match = re.search(r"Resuming from \S+ \(step (\d+)\)", text)
            row.append(match.group(1) if match else "0")
            print(f"{row[0]:>4} {row[1] * 1000:>5.0f}ms {row[2]:>11} {row[3]:<40} {row[4]:>8}")
        a, b = weights(str(reference / "ckpt-2000")), weights(str(model_dir / "ckpt-2000"))
        differ = [n for n in a if not np.array_equal(a[n], b[n])]
        inside = sum(row[3] != "-" for row in rows)
        print(
            f"{len(rows)} kills ({inside} left an interrupted save behind); final weights "
            + ("bit-identical to the uninterrupted run" if not differ else f"DIFFER in {differ}")
        )


if __name__ == "__main__":
    main()
