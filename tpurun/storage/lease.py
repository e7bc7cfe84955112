"""One trainer per model_dir: the lease `model_dir/trainer.lease`, held by the running `tpurun train`.

Two trainers on one model_dir race: each deletes the other's old checkpoints and
rewrites the `checkpoint` state file, until one fails on a file the other removed.
So `tpurun train` takes the lease before it connects to anything, and a second
trainer refuses at once, naming the holder (host, pid, since when). Only the chief
of a multi-worker cluster takes it: it is the cluster's.

How the lease is made atomic, by file system:

* A local disk: the file is locked with flock(2) for the life of the trainer. The
  kernel drops the lock when the process dies however it dies, so a killed
  trainer's lease is free at once; nothing needs renewing.
* gs://: TensorFlow's client cannot make a write conditional, so the lease object
  is written through the GCS JSON API (gcsfs: `tpurun.layout.plain_files.GcsObjects`)
  with a generation precondition: `ifGenerationMatch=0` creates it only if there
  is none, and renewing or taking over replaces exactly the generation that was
  read, so of two trainers that try at once one wins and the other gets 412. The
  holder renews it after a host loop at most every RENEW_SECONDS (no request in
  the other loops). A lease not renewed for its `stale_after_seconds` (the holder's
  --hang_timeout plus STALE_MARGIN: a live trainer that long without a host loop
  has been ended by its watchdog), or held by a process of this machine that is
  gone, is stale and taken over.
* Other file systems (ram://): no lease.

`--force_takeover` takes the lease whatever its state: for a holder that is known
to be gone on another machine, before its lease is stale.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import time
from typing import Any

from absl import logging

from tpurun import storage
from tpurun.errors import RunError
from tpurun.layout import names
from tpurun.layout.plain_files import GcsObjects

RENEW_SECONDS = 60.0
STALE_MARGIN = 300.0  # seconds beyond the holder's --hang_timeout
NO_HANG_TIMEOUT_STALE = 3600.0  # the bound when the holder runs with --hang_timeout=0


class LeaseHeld(RunError):
    """Another live trainer holds model_dir's lease."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """What the lease says about the trainer that holds it."""

    host: str
    pid: int
    since: str  # ISO time, UTC
    renewed: float  # time.time() of the last renewal
    stale_after_seconds: float

    @classmethod
    def me(cls, stale_after: float) -> Holder:
        now = time.time()
        since = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
        return cls(
            socket.gethostname(), os.getpid(), since.isoformat(timespec="seconds"), now, stale_after
        )

    def text(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n"

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """None for a lease that is not one tpurun wrote (empty, garbled): taken over."""
        try:
            fields: dict[str, Any] = json.loads(data)
            return cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls)})
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {self.since}"

    def stale(self) -> str | None:
        """Why this holder is gone, or None while it may be alive."""
        if self.host == socket.gethostname() and not storage.process_alive(self.pid):
            return f"pid {self.pid} of this machine is gone"
        age = time.time() - self.renewed
        if age > self.stale_after_seconds:
            return f"not renewed for {age:.0f}s (stale after {self.stale_after_seconds:.0f}s)"
        return None


def stale_after(hang_timeout: float) -> float:
    return (hang_timeout or NO_HANG_TIMEOUT_STALE) + STALE_MARGIN


def _refusal(model_dir: str, holder: Holder | None) -> LeaseHeld:
    who = holder.describe() if holder else "a process whose lease cannot be read"
    return LeaseHeld(
        f"{model_dir} is being trained by another tpurun train ({who}; lease "
        f"{storage.join(model_dir, names.LEASE)}): two trainers would delete each other's "
        "checkpoints; wait for it to finish or stop it, or, if it is gone on another machine, "
        "rerun once its lease is stale or pass --force_takeover"
    )


class Lease:
    """The lease of a trainer: `renew()` after host loops, `release()` at the end."""

    def renew_due(self) -> bool:
        """Whether `renew` would make a request now (on gs://, RENEW_SECONDS after the last)."""
        return False

    def renew(self) -> None:
        """Keeps the lease fresh (a request at most every RENEW_SECONDS, on gs:// only)."""

    def release(self) -> None:
        """Gives the lease up; never raises (the run's own error matters more)."""


class _LocalLease(Lease):
    def __init__(self, path: str, descriptor: int):
        self._path, self._descriptor = path, descriptor

    def release(self) -> None:
        try:
            if (
                os.path.exists(self._path)
                and os.stat(self._path).st_ino == os.fstat(self._descriptor).st_ino
            ):
                os.unlink(self._path)  # while locked: the next trainer makes a new one
        except OSError as e:
            logging.warning("Could not remove the lease %s: %s", self._path, e)
        os.close(self._descriptor)


def _acquire_local(model_dir: str, holder: Holder, force: bool) -> Lease:
    path = storage.join(model_dir, names.LEASE)
    for _ in range(3):  # a lease released (unlinked) between our open and our lock
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(descriptor)
                raise
            current = Holder.parse(os.pread(descriptor, 4096, 0))
            os.close(descriptor)
            if not force:
                raise _refusal(model_dir, current) from None
            logging.warning(
                "--force_takeover: taking the lease of %s.", current and current.describe()
            )
            os.unlink(path)  # the other keeps a lock on a file no longer there
            continue
        if os.fstat(descriptor).st_ino != os.stat(path).st_ino:
            os.close(descriptor)  # released and unlinked after we opened it
            continue
        previous = Holder.parse(os.pread(descriptor, 4096, 0))
        if previous is not None:
            logging.info("Took over the lease of %s, which is gone.", previous.describe())
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, holder.text().encode(), 0)
        return _LocalLease(path, descriptor)
    raise RunError(f"cannot take the lease {path}: it keeps changing; rerun")


class _GcsLease(Lease):
    """The lease object, replaced only at the generation this trainer wrote."""

    def __init__(self, client: GcsObjects, path: str, holder: Holder, generation: str):
        self._client, self._path, self._holder = client, path, holder
        self._generation, self._renewed = generation, time.monotonic()
        self._lost = False

    def renew_due(self) -> bool:
        return time.monotonic() - self._renewed >= RENEW_SECONDS

    def renew(self) -> None:
        if not self.renew_due():
            return
        holder = dataclasses.replace(self._holder, renewed=time.time())
        try:
            self._generation = self._client.write(self._path, holder.text(), self._generation)
        except FileExistsError:
            self._lost = True
            current = _read(self._client, self._path)
            who = current[0].describe() if current and current[0] else "another trainer"
            raise RunError(
                f"another trainer ({who}) took over the lease {self._path} while this one ran "
                "(--force_takeover, or this run was stalled past its stale bound); this one "
                "stops: its checkpoints are intact, the other trainer writes on"
            ) from None
        except OSError as e:  # storage trouble: the next loop tries again, long before stale
            logging.warning("Could not renew the lease %s: %s", self._path, e)
            return
        self._renewed = time.monotonic()

    def release(self) -> None:
        if self._lost:
            return  # the other trainer's now
        try:
            self._client.delete(self._path, self._generation)
        except OSError as e:
            logging.warning("Could not remove the lease %s: %s", self._path, e)


def _read(objects: GcsObjects, path: str) -> tuple[Holder | None, str] | None:
    """(holder, generation) of the lease object; None if there is none."""
    found = objects.read(path)
    return (Holder.parse(found[0]), found[1]) if found else None


def _acquire_gcs(model_dir: str, holder: Holder, force: bool) -> Lease:
    client, path = GcsObjects(), storage.join(model_dir, names.LEASE)
    generation = "0"  # none yet
    for _ in range(3):
        try:
            written = client.write(path, holder.text(), generation)
        except FileExistsError:
            current = _read(client, path)
            if current is None:
                generation = "0"  # released meanwhile
                continue
            other, generation = current
            why = other.stale() if other else "it is not a tpurun lease"
            if why is None and not force:
                raise _refusal(model_dir, other) from None
            logging.warning(
                "Taking over the lease of %s: %s.",
                other.describe() if other else path,
                why or "--force_takeover",
            )
            continue
        return _GcsLease(client, path, holder, written)
    current = _read(client, path)
    raise _refusal(model_dir, current[0] if current else None)


def acquire(model_dir: str, hang_timeout: float, force: bool = False) -> Lease:
    """Takes model_dir's lease for this trainer, or raises LeaseHeld naming its holder.

    Raises RunError (one line) when the storage refuses or fails.
    """
    holder = Holder.me(stale_after(hang_timeout))
    if storage.is_local(model_dir):
        return _acquire_local(model_dir, holder, force)
    if model_dir.startswith("gs://"):
        try:
            return _acquire_gcs(model_dir, holder, force)
        except OSError as e:
            raise RunError(f"cannot take the lease of {model_dir}: {e}") from None
    return Lease()  # ram:// and other TensorFlow file systems: one process at a time anyway
