"""How long `tpurun <command> --help` takes in a fresh process, against `python -c pass`.

    python scripts/bench_help.py            (part of: make bench)

Help and usage errors answer without importing TensorFlow (tests/test_cli_help.py
checks that it is not imported); this shows what that buys: the median of 5 runs
per command, and the ratio to a bare interpreter start on the same machine.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from offline_env import OFFLINE_ENV  # scripts/offline_env.py

from tpurun.run_config.command_table import COMMANDS

RUNS = 5


def median_seconds(args: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(
            args, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **OFFLINE_ENV}
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    bare = median_seconds([sys.executable, "-c", "pass"])
    print(f"{'command':<24}{'seconds':>10}{'x python -c pass':>20}")
    print(f"{'python -c pass':<24}{bare:>10.3f}{1.0:>20.1f}")
    for command in (c.name for c in COMMANDS):
        seconds = median_seconds([sys.executable, "-m", "tpurun", command, "--help"])
        print(f"{'tpurun ' + command + ' --help':<24}{seconds:>10.3f}{seconds / bare:>20.1f}")


if __name__ == "__main__":
    main()
