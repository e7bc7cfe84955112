"""Fakes shared by the unit tests: a clock that moves only when told, checkpoint files.

Unit tests never wait on the wall clock: what depends on time (the watchdog, the
sidecar's polls, the controller's save_checkpoints_secs) reads a FakeClock instead,
patched into the module under test as its `time`.
"""

from __future__ import annotations

import threading
import types
from pathlib import Path


class FakeClock:
    """`monotonic()` returns what `advance` made it; `sleep` advances it at once.

    `reads_by` names a thread (the watchdog's) whose reads are counted, so a test
    can wait until that thread has looked at the clock again (`wait_for_reads`)
    instead of sleeping and hoping it did.
    """

    def __init__(self, start: float = 1000.0, reads_by: str | None = None):
        self.now = start
        self._reads_by = reads_by
        self._reads = 0
        self._changed = threading.Condition()

    def monotonic(self) -> float:
        with self._changed:
            if threading.current_thread().name == self._reads_by:
                self._reads += 1
                self._changed.notify_all()
            return self.now

    def advance(self, seconds: float) -> None:
        with self._changed:
            self.now += seconds

    sleep = advance

    def wait_for_reads(self, count: int, timeout: float = 60) -> bool:
        """Whether the watched thread read the clock `count` more times (within `timeout`:
        a guard against a hang, not a measure of speed)."""
        with self._changed:
            target = self._reads + count
            return self._changed.wait_for(lambda: self._reads >= target, timeout)

    def as_time_module(self) -> types.SimpleNamespace:
        """What to patch in as a module's `time`."""
        return types.SimpleNamespace(monotonic=self.monotonic, sleep=self.sleep)


def step_of(path: str | Path) -> int:
    return int(str(path).rsplit("-", 1)[1])


def fake_checkpoint(model_dir: Path, step: int) -> str:
    """ckpt-<step> files (contents unread here) and the state file listing every one."""
    import tensorflow as tf

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / f"ckpt-{step}.index").write_text(f"index {step}")
    (model_dir / f"ckpt-{step}.data-00000-of-00001").write_text(f"data {step}")
    saved = sorted((str(p)[: -len(".index")] for p in model_dir.glob("ckpt-*.index")), key=step_of)
    tf.compat.v1.train.update_checkpoint_state(
        str(model_dir), saved[-1], all_model_checkpoint_paths=saved
    )
    return str(model_dir / f"ckpt-{step}")


def delete_checkpoint(model_dir: Path, step: int) -> None:
    """What keep_checkpoint_max does: the files go, the state file may still list them."""
    for path in model_dir.glob(f"ckpt-{step}.*"):
        path.unlink()
