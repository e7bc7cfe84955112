"""Keeping the trainer's lease on model_dir fresh (see `tpurun.lease`)."""

from __future__ import annotations

from tpurun.actions.base import Action, LoopStats
from tpurun.lease import Lease


class RenewLease(Action):
    """Renews the lease after host loops; the lease itself makes a request at most once a minute."""

    def __init__(self, lease: Lease):
        self._lease = lease

    def after_loop(self, stats: LoopStats) -> None:
        self._lease.renew()
