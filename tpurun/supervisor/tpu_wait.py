"""Waiting until a Cloud TPU node is usable again before a restart, through cloud-tpu-client."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

# Seconds between two looks at the node (TPURUN_TPU_POLL_SECONDS: tests only).
POLL_SECONDS = float(os.environ.get("TPURUN_TPU_POLL_SECONDS", "30"))
# How long a restart waits for the node before giving up with the trainer's failure.
WAIT_SECONDS = 3600.0
ANONYMOUS_CREDENTIALS_ENV = (
    "TPURUN_TPU_ANONYMOUS_CREDENTIALS"  # as tpurun.cluster.tpu_api: tests only
)
_USABLE_HEALTH = (None, "", "HEALTHY", "HEALTH_UNSPECIFIED")


def is_named_node(tpu: str | None) -> bool:
    """Whether --tpu names a node the Cloud TPU API knows (not an address, not local)."""
    return bool(tpu) and tpu != "local" and not str(tpu).startswith("grpc://")


def client(tpu: str, zone: str | None, project: str | None) -> Any:
    from cloud_tpu_client import Client

    credentials: Any = "default"
    if os.environ.get(ANONYMOUS_CREDENTIALS_ENV) == "1":
        import google.auth.credentials

        credentials = google.auth.credentials.AnonymousCredentials()
    return Client(tpu=tpu, zone=zone, project=project, credentials=credentials)


def wait_until_usable(
    tpu_client: Any,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    stopped: Callable[[], bool] = lambda: False,
    poll_seconds: float | None = None,
    wait_seconds: float = WAIT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> int | None:
    """Polls the node until it is READY and healthy; the polls it took, or None on giving up
    (after `wait_seconds`, or when `stopped()`). A node that cannot come back by itself
    (PREEMPTED, TERMINATED: `Client.recoverable()` is false) is waited for too: a queued
    resource, or its owner, creates it again under the same name."""
    poll = POLL_SECONDS if poll_seconds is None else poll_seconds
    deadline = clock() + wait_seconds
    polls, said = 0, None
    while True:
        polls += 1
        try:
            state, health = tpu_client.state(), tpu_client.health()
        except Exception as e:  # noqa: BLE001 - the API unreachable: look again later
            state, health = "UNKNOWN", f"the Cloud TPU API failed: {' '.join(str(e).split())[:200]}"
        if state == "READY" and health in _USABLE_HEALTH:
            return polls
        if (state, health) != said:
            said = (state, health)
            how = (
                ""
                if tpu_client_recoverable(tpu_client, state)
                else (
                    " (it cannot come back by itself: waiting for it to be created again under "
                    "its name, by a queued resource or by you)"
                )
            )
            say(
                f"tpurun train: waiting for the TPU {tpu_client.name()!r} to be READY and "
                f"HEALTHY: it is {state}, {health or 'no health reported'}{how}"
            )
        if stopped() or clock() + poll > deadline:
            return None
        sleep(poll)


def tpu_client_recoverable(tpu_client: Any, state: str) -> bool:
    """cloud-tpu-client's `recoverable()` for a state already read (it reads it again)."""
    if state in ("PREEMPTED", "TERMINATED"):
        return False
    try:
        return bool(tpu_client.recoverable())
    except Exception:  # noqa: BLE001 - unknown: say nothing more
        return True
