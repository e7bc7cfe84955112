"""What a training run shows while it runs: a live line on a terminal or log lines (with the
checkpoint save in flight or how long the last took), the input-bound warning, what a
resume cost, and a line when a long phase (a compile, `tpurun check`'s steps) starts and
ends."""

from __future__ import annotations

import contextlib
import logging as std_logging
import sys
import time
from collections.abc import Iterator
from typing import TextIO

import tqdm
import tqdm.contrib
from absl import logging

from tpurun.actions.base import Action, LoopStats, SaveState
from tpurun.layout import names
from tpurun.run_config.epochs import EpochCount

# Above this share of a host loop spent waiting for input, the run is input-bound:
# the accelerator idles more than it computes...
INPUT_BOUND_SHARE = 0.5
# ...unless the wait is under this per step: then it is tf.data's own cost of handing
# over a batch (about 0.1 ms for in-memory Iris on a 2-core CPU, already prefetched),
# which no input_fn change removes and only a toy model's step is short enough to feel.
INPUT_BOUND_MIN_WAIT = 1e-3  # seconds per step


@contextlib.contextmanager
def announced(doing: str, done: str) -> Iterator[None]:
    """Logs "<doing> ..." now and "<done> in 12.3s." when the block ends (not when it fails):
    a first host loop can compile for minutes, and without a terminal nothing else is
    printed meanwhile."""
    logging.info("%s ...", doing)
    start = time.perf_counter()
    yield
    logging.info("%s in %.1fs.", done, time.perf_counter() - start)


class LogLines(Action):
    """One absl log line per host loop: for log files and CI, where a live line would be noise.

    `epochs`: how the steps count epochs, when the run counted its examples (the line
    then shows the epoch)."""

    def __init__(self, epochs: EpochCount | None = None) -> None:
        self._last_step = 0
        self._epochs = epochs
        self._saves = SaveState()

    def start(self, step: int, last_step: int) -> None:
        self._last_step = last_step

    def save_state(self, state: SaveState) -> None:
        self._saves = state

    def after_loop(self, stats: LoopStats) -> None:
        note = saving(self._saves)
        logging.info(
            "step %d/%d  %s%s  %.1f steps/sec  %.0f examples/sec  %s%s",
            stats.step,
            self._last_step,
            f"{self._epochs.text(stats.step)}  " if self._epochs else "",
            scalars_text(stats, "  "),
            stats.steps_per_sec,
            stats.examples_per_sec,
            input_wait(stats),
            f"  {note}" if note else "",
        )


def scalars_text(stats: LoopStats, separator: str) -> str:
    """'loss 0.1234', or a step's named scalars: 'd_loss -6.3530  g_loss -20.7056  gp 0.0898'."""
    return separator.join(f"{name} {value:.4f}" for name, value in stats.named_scalars().items())


def saving(state: SaveState) -> str:
    """'saving ckpt-500' while a save is written in the background, else 'last save 2.41s'
    ('' before the first)."""
    if state.in_flight is not None:
        return f"saving {names.checkpoint_name(state.in_flight)}"
    return "" if state.last_seconds is None else f"last save {state.last_seconds:.2f}s"


def input_wait(stats: LoopStats) -> str:
    """'input wait 74%', or with device data, where no step waits, 'input on device'."""
    if stats.device_input:
        return "input on device (no wait)"
    return f"input wait {stats.input_wait_share:.0%}"


class ProgressBar(Action):
    """A live line on a terminal: step/total, the epoch (`epochs`: as for LogLines), the loss
    (or the step's named scalars), input wait, steps/sec and the ETA (tqdm).

    While it shows, stderr goes through tqdm.write, so log lines (a saved
    checkpoint, a warning) print above the line instead of through it.
    """

    def __init__(self, stream: TextIO | None = None, epochs: EpochCount | None = None):
        self._stream = stream or sys.stderr
        self._bar: tqdm.tqdm | None = None
        self._logs_above = LogsAboveBar()
        self._epochs = epochs
        self._saves = SaveState()

    def start(self, step: int, last_step: int) -> None:
        self._bar = tqdm.tqdm(
            total=last_step,
            initial=step,  # a resumed run: the line and its ETA start where it resumed
            file=self._stream,
            unit=" steps",
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| step {n_fmt}/{total_fmt}{postfix} [{rate_fmt}, ETA {remaining}]",
        )
        self._logs_above.install(self._stream)

    def save_state(self, state: SaveState) -> None:
        self._saves = state

    def after_loop(self, stats: LoopStats) -> None:
        if self._bar is None:
            return
        epoch = self._epochs.text(stats.step) if self._epochs else ""
        notes = [epoch, scalars_text(stats, ", "), input_wait(stats), saving(self._saves)]
        self._bar.set_postfix_str(", ".join(n for n in notes if n), refresh=False)
        self._bar.update(stats.num_steps)

    def close(self) -> None:
        self._logs_above.uninstall()
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class LogsAboveBar:
    """Sends sys.stderr, and absl's log handler writing to it, through tqdm.write.

    absl's handler keeps its own reference to the stream, and writes a record a
    second time when that differs from sys.stderr: both are swapped together.
    """

    def __init__(self) -> None:
        self._saved: TextIO | None = None
        self._handler: std_logging.StreamHandler | None = None

    def install(self, stream: TextIO) -> None:
        if self._saved is not None:
            return
        wrapper = tqdm.contrib.DummyTqdmFile(stream)
        self._saved = sys.stderr
        handler = logging.get_absl_handler().python_handler
        if handler.stream is sys.stderr:  # not when absl logs to a file (--log_dir)
            self._handler = handler
            handler.setStream(wrapper)
        sys.stderr = wrapper  # type: ignore[assignment]

    def uninstall(self) -> None:
        if self._saved is None:
            return
        sys.stderr = self._saved
        if self._handler is not None:
            self._handler.setStream(self._saved)
        self._saved = self._handler = None


class InputBound(Action):
    """Warns once when the steps of a host loop spend more than INPUT_BOUND_SHARE of its time,
    and at least INPUT_BOUND_MIN_WAIT each, waiting for input."""

    def __init__(self, model_name: str):
        self._model_name = model_name
        self._loops = 0
        self._warned = False

    def after_loop(self, stats: LoopStats) -> None:
        self._loops += 1
        if stats.device_input:
            return  # the batches are gathered in the step: nothing to wait for
        per_step = stats.input_seconds / stats.num_steps
        waiting = stats.input_wait_share > INPUT_BOUND_SHARE and per_step >= INPUT_BOUND_MIN_WAIT
        # The first loop is not representative: it compiles the step and waits for
        # the pipeline to fill (shuffle buffers, the first files).
        if self._warned or self._loops == 1 or not waiting:
            return
        self._warned = True
        logging.warning(
            "Training is input-bound: in the host loop up to step %d the steps waited for "
            "input %.0f%% of the time (more than %.0f%%), so the accelerator idles while "
            "%s.input_fn makes batches (%.1f ms per step). Speed up the input_fn: end it with "
            ".prefetch(tf.data.AUTOTUNE); give .map() num_parallel_calls=tf.data.AUTOTUNE; "
            "read several files at once (.interleave(..., num_parallel_calls=tf.data.AUTOTUNE) "
            "or TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)); .cache() the "
            "decoded data if it fits in memory; prefer fewer, larger files (100 MB+) to many "
            "small ones.",
            stats.step,
            100 * stats.input_wait_share,
            100 * INPUT_BOUND_SHARE,
            self._model_name,
            1000 * per_step,
        )


class ResumeCost(Action):
    """Logs what a resume cost: the restore, then the first host loop, which also rebuilds
    the input at its position (`scripts/bench_resume.py` reads this line).

    Made just before the controller restores; `start` comes right after the restore.
    """

    def __init__(self) -> None:
        self._began = time.perf_counter()
        self._restore_seconds: float | None = None

    def start(self, step: int, last_step: int) -> None:
        if step > 0:  # resumed, not a fresh start
            self._restore_seconds = time.perf_counter() - self._began

    def after_loop(self, stats: LoopStats) -> None:
        if self._restore_seconds is None:
            return
        logging.info(
            "Resumed at step %d in %.2fs: restore %.2fs, first host loop %.2fs.",
            stats.step - stats.num_steps,
            time.perf_counter() - self._began,
            self._restore_seconds,
            stats.seconds,
        )
        self._restore_seconds = None
