"""The run's one background thread for storage: `Writer`."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

import tensorflow as tf
from absl import logging

from tpurun import storage

T = TypeVar("T")


class Writer:
    """Does a run's storage work off the training loop, on one thread, in the order handed over.

    One thread, not a pool: the work waits on storage rather than the CPU, and one
    order keeps right what depends on it (a checkpoint's state file after its
    tensors; an events file's last version before the next file appears).

    * `submit(fn)`: runs `fn()`; its Future gives the result or raises its error,
      for work whose failure matters (a checkpoint save);
    * `write(path, data)`: a record or an events file, only the newest data of a
      path written, a failure logged and never raised;
    * `flush()`: waits for everything handed over so far; `close()` flushes and ends.
    """

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tpurun-writer"
        )
        self._lock = threading.Lock()
        self._newest: dict[str, str | bytes] = {}  # path -> data not yet written
        self._closed = False

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Runs `fn()` after everything handed over before; returns at once."""
        return self._pool.submit(fn)

    def write(self, path: str, data: str | bytes) -> None:
        """Writes `data` to `path` (`storage.write_atomically`) soon; returns at once.

        A write of the same path still waiting takes the new data instead (only the
        newest is written, in the waiting write's place in the order). A failure is
        logged, not raised: a record or an events file is no reason to stop a run,
        and the path's next write tries again.
        """
        with self._lock:
            waiting = path in self._newest
            self._newest[path] = data
        if not waiting:
            self._pool.submit(self._write, path)

    def _write(self, path: str) -> None:
        with self._lock:
            data = self._newest.pop(path)
        try:
            storage.write_atomically(path, data)
        except (tf.errors.OpError, OSError) as e:
            logging.warning(
                "Could not write %s (its next write tries again): %s", path, storage.failure(e)
            )

    def flush(self) -> None:
        """Waits until everything handed over before this call is done (its errors stay with
        its Futures); nothing once closed."""
        if not self._closed:
            self._pool.submit(lambda: None).result()

    def close(self) -> None:
        """Waits for everything handed over, then ends the thread; a second call does nothing."""
        self._closed = True
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
