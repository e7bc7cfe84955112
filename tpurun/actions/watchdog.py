"""A watchdog thread: calls back when nobody fed it for `timeout` seconds.

A stuck infeed or TPU leaves the main thread blocked inside a TensorFlow C++
call, where no Python exception or signal handler can reach it; only another
thread can notice and end the process (`exit_hung`).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable

from tpurun.errors import EXIT_HUNG


class Watchdog:
    """Calls `on_timeout(idle_seconds)` once, from its own thread, when `feed()` stops coming."""

    def __init__(self, timeout: float, on_timeout: Callable[[float], None]):
        if timeout <= 0:
            raise ValueError(f"timeout={timeout} must be > 0")
        self._timeout = timeout
        self._on_timeout = on_timeout
        self._last_fed = time.monotonic()
        self._paused = False
        self._stopped = threading.Event()
        # A daemon: a watchdog must never be what keeps a finished process alive.
        self._thread = threading.Thread(target=self._watch, name="tpurun-watchdog", daemon=True)

    def start(self) -> None:
        self.feed()
        self._thread.start()

    def feed(self) -> None:
        self._last_fed = time.monotonic()  # one assignment: atomic, no lock needed

    def pause(self) -> None:
        """Stops counting until the next resume() (for a phase that may rightly take long)."""
        self._paused = True

    def resume(self) -> None:
        """Feeds it and counts again."""
        self.feed()
        self._paused = False

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        # Checked a few times per timeout, at most once a second: cheap, and late by
        # at most a second.
        poll = min(1.0, self._timeout / 4)
        while not self._stopped.wait(poll):
            idle = time.monotonic() - self._last_fed
            if idle >= self._timeout and not self._paused:
                self._on_timeout(idle)
                return


def exit_hung(message: str, tracebacks: bool = False, exit_code: int = EXIT_HUNG) -> None:
    """Prints `message` as the run's one error line and ends the process with EXIT_HUNG (or
    `exit_code`: a tf.data service's lost input ends with EXIT_UNAVAILABLE).

    os._exit, not sys.exit: the latter only raises SystemExit in this thread, and
    the stuck main thread would never see it. Checkpoints are written atomically,
    so ending the process at any moment leaves the latest one intact.
    """
    if tracebacks and sys.__stderr__ is not None:
        # --verbosity=1: where every thread was (the main one: in which TensorFlow call).
        faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
    print(message, file=sys.stderr, flush=True)
    for stream in (sys.stdout, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    os._exit(exit_code)
