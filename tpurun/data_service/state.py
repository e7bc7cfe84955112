"""The tf.data service as one look sees it, and what changed since the look before (no TensorFlow).

A look (`look`) asks the dispatcher for its workers and each worker whether it answers
(`tpurun.data_service.rpc`). Its changes (`changes`) are what the servers' commands and
a training run print, one line each: the dispatcher lost or back, a worker joined, lost
or back. While the dispatcher is silent, the workers it listed last are asked still.
"""

from __future__ import annotations

import dataclasses

from tpurun.data_service.rpc import Servers, Unanswered

DISPATCHER_LOST, DISPATCHER_BACK = "dispatcher lost", "dispatcher back"
WORKER_JOINED, WORKER_LOST, WORKER_BACK = "worker joined", "worker lost", "worker back"


@dataclasses.dataclass(frozen=True)
class Look:
    """What one look found."""

    silent: str | None  # why the dispatcher did not answer; None: it answered
    workers: dict[str, bool]  # every worker it listed (or listed last): whether it answers

    @property
    def answering(self) -> list[str]:
        return [address for address, answers in self.workers.items() if answers]


@dataclasses.dataclass(frozen=True)
class Change:
    """One change between two looks: `what` happened to the server at `address`."""

    what: str
    address: str
    answering: int  # workers answering after it
    reason: str = ""  # the dispatcher's silence: why


def look(servers: Servers, before: Look | None = None) -> Look:
    """Asks the dispatcher, then every worker it lists (the ones it listed before when it
    is silent)."""
    try:
        listed, silent = servers.workers(), None
    except Unanswered as e:
        listed, silent = list(before.workers) if before else [], str(e)
    return Look(silent, {address: servers.worker_answers(address) for address in listed})


def changes(before: Look | None, now: Look, dispatcher: str) -> list[Change]:
    """What changed from `before` (None: nothing seen yet) to `now`."""
    found = []
    count = len(now.answering)
    was_silent = before.silent if before else None
    if now.silent and not was_silent:
        found.append(Change(DISPATCHER_LOST, dispatcher, count, now.silent))
    elif was_silent and not now.silent:
        found.append(Change(DISPATCHER_BACK, dispatcher, count))
    known = before.workers if before else {}
    for address, answers in now.workers.items():
        if address not in known:
            if answers:
                found.append(Change(WORKER_JOINED, address, count))
        elif known[address] and not answers:
            found.append(Change(WORKER_LOST, address, count))
        elif answers and not known[address]:
            found.append(Change(WORKER_BACK, address, count))
    return found
