"""--hang_timeout: ends a run whose host loops or saves stopped coming."""

from __future__ import annotations

from collections.abc import Callable

from absl import logging

from tpurun.actions import watchdog
from tpurun.actions.base import Action, LoopStats, Saved, SaveState
from tpurun.storage import checkpoints


class HangTimeout(Action):
    """--hang_timeout: ends the process with EXIT_HUNG when no hook came for that many seconds.

    Every hook is progress: a stuck infeed or TPU shows as a host loop that never
    returns. The error line says where it stopped and which checkpoint to resume from.
    """

    def __init__(
        self,
        timeout: float,
        model_dir: str,
        on_hang: Callable[[str], None] | None = None,
        input_seeks: bool = True,
    ):
        self._timeout = timeout
        self._input_seeks = input_seeks
        self._unwatched_loops = 0
        self._model_dir = model_dir
        self._on_hang = on_hang or (
            lambda message: watchdog.exit_hung(message, tracebacks=logging.level_debug())
        )
        self._watchdog = watchdog.Watchdog(timeout, self._hung)
        self._step = 0
        self._doing = "before the first host loop"
        self._latest: str | None = None
        self._saves = SaveState()

    def start(self, step: int, last_step: int) -> None:
        # Known now, not looked up when hung (a hung process may not reach its storage):
        # the run restored ckpt-<step>, or starts from step 0 (fresh or warm-started).
        self._latest = checkpoints.path_of(self._model_dir, step) if step else None
        self._step = step
        # A resumed model whose input cannot seek reads every batch already trained
        # on inside its first host loop: that loop's time grows with the step, so it
        # is not watched: a hang in it is not caught; the loops after it are.
        self._unwatched_loops = 1 if step > 0 and not self._input_seeks else 0
        self._watchdog.start()

    def before_loop(self, step: int, num_steps: int) -> None:
        self._progress(step, f"in the host loop of steps {step + 1}..{step + num_steps}")
        if self._unwatched_loops:
            self._unwatched_loops -= 1
            self._watchdog.pause()

    def after_loop(self, stats: LoopStats) -> None:
        self._progress(stats.step, "after its host loop, saving or evaluating")

    def saved(self, saved: Saved) -> None:
        self._latest = saved.path
        self._progress(saved.step, "after saving its checkpoint")

    def save_state(self, state: SaveState) -> None:
        self._saves = state

    def close(self) -> None:
        self._watchdog.stop()

    def _progress(self, step: int, doing: str) -> None:
        self._step, self._doing = step, doing
        self._watchdog.resume()

    def _hung(self, idle_seconds: float) -> None:
        latest, saving = self._latest, self._saves
        # A save written in the background since the loop got stuck is the latest now.
        if saving.in_flight is not None and saving.writing is not None and saving.writing.done():
            if saving.writing.exception() is None:
                latest = checkpoints.path_of(self._model_dir, saving.in_flight)
        self._on_hang(
            f"tpurun train: error: no progress for --hang_timeout={self._timeout:g}s at step "
            f"{self._step} ({self._doing}): stuck waiting for input or the TPU; the latest "
            f"checkpoint is {latest or 'none (nothing saved yet)'}; rerun the same command "
            "to resume from it (or raise --hang_timeout if a host loop really takes that long)"
        )
