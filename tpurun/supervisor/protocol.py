"""What a supervised trainer and its supervisor tell each other: environment names, start times.

`tpurun train --max_restarts` (`tpurun.supervisor`) starts the trainer with these
variables; the trainer's time account (`tpurun.actions.goodput`) reads them and
writes its progress to the pipe. TensorFlow-free, so both sides import it.
"""

from __future__ import annotations

import contextlib
import os
import time

SUPERVISED_ENV = "TPURUN_SUPERVISED"  # "<restart>/<max_restarts>"
SPAWNED_AT_ENV = "TPURUN_SPAWNED_AT"  # when the supervisor started the trainer (epoch s)
SUPERVISOR_START_ENV = "TPURUN_SUPERVISOR_START"  # when the supervisor started (epoch s)
PREVIOUS_DEATH_ENV = "TPURUN_PREVIOUS_DEATH"  # a time_account.Death, as JSON
# A pipe to the supervisor: "<step> <epoch s>" after every host loop, so it knows the last
# step and when it was reached even if the trainer is killed between two record writes.
PROGRESS_FD_ENV = "TPURUN_PROGRESS_FD"


def kernel_start() -> float:
    """When this process started (epoch seconds, the kernel's count in /proc), else now."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        # The boot time from the uptime (hundredths of a second), not /proc/stat's btime:
        # whole seconds, which put every start up to a second early.
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def process_start() -> float:
    """When this trainer started (epoch seconds): its supervisor's spawn time, else the
    kernel's start time of the process."""
    spawned = os.environ.get(SPAWNED_AT_ENV)
    if spawned:
        with contextlib.suppress(ValueError):
            return float(spawned)
    return kernel_start()
