"""Runs `tpurun train --max_restarts=2`, SIGKILLs its trainer twice at random moments, lets
the third trainer finish, then prints `tpurun report` and what one restart cost.

    python scripts/restart_trial.py [--seed=0] [--after=5] -- <train flags...>

e.g. `-- --config=iris --use_tpu=false --train_steps=200000`. Each trainer is killed
after training for a random time in [after, 2 x after] seconds. A restart's cost is
what the two restarts added to the report, halved: the startup and compile of every
trainer but the first, the progress lost and the downtime.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

from offline_env import OFFLINE_ENV  # scripts/offline_env.py

from tpurun.report import goodput, run_records

STARTED = re.compile(r"trainer started \(pid (\d+)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--after", type=float, default=5.0)
    parser.add_argument("--model_dir", default="")
    parser.add_argument("flags", nargs="*")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="restart-trial-")
    command = [sys.executable, "-m", "tpurun", "train", *args.flags]
    command += [f"--model_dir={model_dir}", "--max_restarts=2"]
    print("$", " ".join(command[1:]), flush=True)
    began = time.monotonic()
    process = subprocess.Popen(
        command,
        env={**os.environ, **OFFLINE_ENV},
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    kills, training_since = 0, None
    wait = rng.uniform(args.after, 2 * args.after)
    pid = None
    for line in process.stderr:
        if line.startswith(("restart ", "tpurun train: ")):
            print(line, end="", flush=True)
        started = STARTED.search(line)
        if started:
            pid, training_since = int(started.group(1)), None
        elif "Training from step" in line:
            training_since = time.monotonic()
        elif training_since and kills < 2 and time.monotonic() - training_since >= wait:
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            kills += 1
            training_since = None
            wait = rng.uniform(args.after, 2 * args.after)
    code = process.wait()
    wall = time.monotonic() - began
    print(f"exit {code} after {wall:.1f} s (measured)")
    report = subprocess.run(
        [sys.executable, "-m", "tpurun", "report", f"--model_dir={model_dir}"],
        capture_output=True,
        text=True,
        check=True,
    )
    print(report.stdout)
    data = json.loads(
        subprocess.run(
            [sys.executable, "-m", "tpurun", "report", f"--model_dir={model_dir}", "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    bad = data["badput_s"]
    print(f"sum of goodput and badput: {data['goodput_s'] + sum(bad.values()):.1f} s")
    # What the two restarts added: every trainer's startup and compile but the first's,
    # the progress lost and the downtime; per restart.
    accounts = [account for _, account in run_records.time_accounts(model_dir).found]
    first = goodput.account(accounts[:1]).badput_s
    added = {
        "startup": bad["startup"] - first["startup"],
        "compile": bad["compile"] - first["compile"],
        "lost_progress": bad["lost_progress"],
        "downtime": bad["downtime"],
    }
    print(
        f"one restart cost {sum(added.values()) / 2:.2f} s: "
        + ", ".join(f"{name} {value / 2:.2f} s" for name, value in added.items())
    )


if __name__ == "__main__":
    main()
