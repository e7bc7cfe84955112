"""Keeping the trainer's lease on model_dir fresh (see `tpurun.storage.lease`)."""

from __future__ import annotations

import concurrent.futures

from tpurun.actions.base import Action, LoopStats
from tpurun.storage.background import Writer
from tpurun.storage.lease import Lease


class RenewLease(Action):
    """Renews the lease after host loops, when due (on gs://, once a minute).

    With the run's `writer` the request is made in the background: no host loop
    waits for it, and a lease another trainer took (`renew` raises) ends the run at
    a host loop after the request answered.
    """

    def __init__(self, lease: Lease, writer: Writer | None = None):
        self._lease = lease
        self._writer = writer
        self._renewing: concurrent.futures.Future[None] | None = None

    def after_loop(self, stats: LoopStats) -> None:
        if self._renewing is not None:
            if not self._renewing.done():
                return
            renewing, self._renewing = self._renewing, None
            renewing.result()  # the lease lost: its error ends the run
        if not self._lease.renew_due():
            return
        if self._writer is None:
            self._lease.renew()
        else:
            self._renewing = self._writer.submit(self._lease.renew)
