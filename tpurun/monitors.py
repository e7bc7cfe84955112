"""What a training run shows while it runs, and the guard rails that watch it.

The Trainer calls every monitor between host loops (never inside the compiled
loop), so watching costs nothing on the device and tags carry no `while/` prefix:

* progress: a live tqdm line on a terminal, else one absl log line per host loop;
* TensorBoard under model_dir: the model's graph once, then scalars per loop;
* a warning when the steps mostly wait for input (an input-bound run);
* `--profile_steps`: a profiler trace of those steps for TensorBoard's Profile tab;
* `--hang_timeout`: a watchdog that ends a run that stopped making progress.
"""

from __future__ import annotations

import dataclasses
import logging as std_logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

import tensorflow as tf
import tqdm
import tqdm.contrib
from absl import logging

from tpurun import checkpoints, inputs, watchdog
from tpurun.model import Mode
from tpurun.run_config import RunConfig

if TYPE_CHECKING:
    from tpurun.train import Trainer

# Above this share of a host loop spent waiting for input, the run is input-bound:
# the accelerator idles more than it computes...
INPUT_BOUND_SHARE = 0.5
# ...unless the wait is under this per step: then it is tf.data's own cost of handing
# over a batch (about 0.1 ms for in-memory Iris on a 2-core CPU, already prefetched),
# which no input_fn change removes and only a toy model's step is short enough to feel.
INPUT_BOUND_MIN_WAIT = 1e-3  # seconds per step


@dataclasses.dataclass(frozen=True)
class LoopStats:
    """What one host loop did."""

    step: int  # global step after the loop
    num_steps: int  # steps the loop ran
    last_step: int  # --train_steps
    loss: float  # mean loss over the loop's steps
    seconds: float  # wall time of the loop call
    input_seconds: float  # part of it spent waiting for the next batch
    global_batch: int
    learning_rate: float

    @property
    def steps_per_sec(self) -> float:
        return self.num_steps / self.seconds

    @property
    def examples_per_sec(self) -> float:
        return self.num_steps * self.global_batch / self.seconds

    @property
    def input_wait_share(self) -> float:
        """The part of the loop's time the steps waited for their batches, in [0, 1]."""
        return min(1.0, self.input_seconds / self.seconds) if self.seconds > 0 else 0.0


class Monitor:
    """Base class: every hook does nothing."""

    def start(self, step: int, last_step: int) -> None:
        """Training is about to run from `step` to `last_step`."""

    def before_loop(self, step: int, num_steps: int) -> None:
        """A host loop of num_steps is about to start at `step`."""

    def after_loop(self, stats: LoopStats) -> None:
        """A host loop finished (before its checkpoint, if any, is saved)."""

    def after_save(self, step: int, path: str) -> None:
        """A checkpoint was saved."""

    def close(self) -> None:
        """Training ended (normally or not); release what was opened. Must not raise."""


class LogLines(Monitor):
    """One absl log line per host loop: for log files and CI, where a live line would be noise."""

    def after_loop(self, stats: LoopStats) -> None:
        logging.info(
            "step %d/%d  loss %.4f  %.1f steps/sec  %.0f examples/sec  input wait %.0f%%",
            stats.step,
            stats.last_step,
            stats.loss,
            stats.steps_per_sec,
            stats.examples_per_sec,
            100 * stats.input_wait_share,
        )


class ProgressBar(Monitor):
    """A live line on a terminal: step/total, loss, input wait, steps/sec and the ETA (tqdm).

    While it shows, stderr goes through tqdm.write, so log lines (a saved
    checkpoint, a warning) print above the line instead of through it.
    """

    def __init__(self, stream: TextIO | None = None):
        self._stream = stream or sys.stderr
        self._bar: tqdm.tqdm | None = None
        self._logs_above = LogsAboveBar()

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

    def after_loop(self, stats: LoopStats) -> None:
        if self._bar is None:
            return
        self._bar.set_postfix_str(
            f"loss {stats.loss:.4f}, input wait {stats.input_wait_share:.0%}", refresh=False
        )
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


class InputBound(Monitor):
    """Warns once when the steps of a host loop spend more than INPUT_BOUND_SHARE of its time,
    and at least INPUT_BOUND_MIN_WAIT each, waiting for input."""

    def __init__(self, model_name: str):
        self._model_name = model_name
        self._loops = 0
        self._warned = False

    def after_loop(self, stats: LoopStats) -> None:
        self._loops += 1
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


class ResumeCost(Monitor):
    """Logs what a resume cost: the restore, then the first host loop, which also rebuilds
    the input at its position (`scripts/bench_resume.py` reads this line)."""

    def __init__(self, started: float, restore_seconds: float):
        self._started: float | None = started  # perf_counter() when train() began
        self._restore_seconds = restore_seconds

    def after_loop(self, stats: LoopStats) -> None:
        if self._started is None:
            return
        logging.info(
            "Resumed at step %d in %.2fs: restore %.2fs, first host loop %.2fs.",
            stats.step - stats.num_steps,
            time.perf_counter() - self._started,
            self._restore_seconds,
            stats.seconds,
        )
        self._started = None


class TrainSummaries(Monitor):
    """TensorBoard under model_dir: the model's graph at the start, then after every host loop
    loss, learning_rate, global_step/sec, examples/sec and input_wait_share."""

    def __init__(self, model_dir: str, graph: Callable[[], tf.Graph] | None = None):
        self._writer = tf.summary.create_file_writer(model_dir)
        self._graph = graph

    def start(self, step: int, last_step: int) -> None:
        if self._graph is None:
            return
        try:
            graph = self._graph()
        except Exception as e:  # a view of the model is never a reason to stop training
            logging.warning("No model graph for TensorBoard: tracing the model failed: %s", e)
            return
        with self._writer.as_default():
            tf.summary.graph(graph)

    def after_loop(self, stats: LoopStats) -> None:
        try:
            with self._writer.as_default(step=stats.step):
                tf.summary.scalar("loss", stats.loss)
                tf.summary.scalar("learning_rate", stats.learning_rate)
                tf.summary.scalar("global_step/sec", stats.steps_per_sec)
                tf.summary.scalar("examples/sec", stats.examples_per_sec)
                tf.summary.scalar("input_wait_share", stats.input_wait_share)
        except (tf.errors.OpError, OSError) as e:
            # Only the chief writes events: failing here would leave the other
            # workers blocked in their next all-reduce. Training goes on.
            logging.warning("Could not write TensorBoard events (step %d): %s", stats.step, e)

    def close(self) -> None:
        self._writer.close()


def forward_graph(trainer: Trainer) -> tf.Graph:
    """The model's forward pass, traced (not run) on one replica's training features."""
    ctx = tf.distribute.InputContext(num_replicas_in_sync=trainer.strategy.num_replicas_in_sync)
    params = inputs.input_params(ctx, trainer.run.train_batch_size, trainer.run.seed)
    features_spec, _ = trainer.model.input_fn(Mode.TRAIN, params).element_spec
    if isinstance(features_spec, dict):  # the graph's inputs named after the features
        features_spec = {
            k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in features_spec.items()
        }
    forward = tf.function(lambda features: trainer.keras_model(features, training=True))
    with trainer.strategy.scope():
        return forward.get_concrete_function(features_spec).graph


class ProfileSteps(Monitor):
    """--profile_steps=START,END: a TensorFlow profiler trace of the host loops covering those steps.

    Written to model_dir/plugins/profile/<time>/, where TensorBoard's Profile tab
    looks. The profiler starts and stops between host loops (a loop is one call),
    so it captures whole loops; the log line says which steps those were.
    """

    def __init__(self, model_dir: str, first: int, last: int):
        self._model_dir = model_dir
        self._first, self._last = first, last
        self._done = False
        self._from: int | None = None  # first step of the trace, while it runs
        self._through = 0  # last step finished

    def start(self, step: int, last_step: int) -> None:
        wanted = f"--profile_steps={self._first},{self._last}"
        trains = f"the steps this run trains ({step + 1}..{last_step})"
        if self._first > last_step or self._last <= step:
            logging.warning(
                "%s is outside %s: nothing will be profiled; pick steps in that range.",
                wanted,
                trains,
            )
            self._done = True
        elif self._first <= step or self._last > last_step:
            logging.warning(
                "%s reaches outside %s: only steps inside it are profiled.", wanted, trains
            )

    def before_loop(self, step: int, num_steps: int) -> None:
        overlaps = step + 1 <= self._last and step + num_steps >= self._first
        if self._done or self._from is not None or not overlaps:
            return
        try:
            tf.profiler.experimental.start(self._model_dir)
        except (tf.errors.OpError, RuntimeError) as e:  # e.g. another profiler is running
            logging.warning("--profile_steps: could not start the profiler: %s", e)
            self._done = True
            return
        self._from = step + 1

    def after_loop(self, stats: LoopStats) -> None:
        self._through = stats.step
        if self._from is not None and stats.step >= self._last:
            self._stop()

    def close(self) -> None:
        if self._from is not None:
            self._stop()  # training ended (or failed) inside the range

    def _stop(self) -> None:
        first, self._from, self._done = self._from, None, True
        try:
            tf.profiler.experimental.stop()
        except (tf.errors.OpError, RuntimeError) as e:
            logging.warning("--profile_steps: the profiler failed to write its trace: %s", e)
            return
        logging.info(
            "Profiled steps %d..%d (whole host loops) into %s: TensorBoard's Profile tab "
            "shows them (pip install tensorboard-plugin-profile).",
            first,
            self._through,
            self._model_dir.rstrip("/") + "/plugins/profile",
        )


class HangTimeout(Monitor):
    """--hang_timeout: ends the process with EXIT_HUNG when no hook came for that many seconds.

    Every hook is progress: a stuck infeed or TPU shows as a host loop that never
    returns. The error line says where it stopped and which checkpoint to resume from.
    """

    def __init__(
        self,
        timeout: float,
        model_dir: str,
        on_hang: Callable[[str], None] | None = None,
        skips_input: bool = False,
    ):
        self._timeout = timeout
        # A resumed model whose input cannot seek reads every batch already trained
        # on inside its first host loop: that loop's time grows with the step, so it
        # is not watched: a hang in it is not caught; the loops after it are.
        self._unwatched_loops = 1 if skips_input else 0
        self._model_dir = model_dir
        self._on_hang = on_hang or (
            lambda message: watchdog.exit_hung(message, tracebacks=logging.level_debug())
        )
        self._watchdog = watchdog.Watchdog(timeout, self._hung)
        self._step = 0
        self._doing = "before the first host loop"
        self._latest: str | None = None

    def start(self, step: int, last_step: int) -> None:
        # Looked up now, not when hung: a hung process may not reach its storage either.
        self._latest = checkpoints.latest(self._model_dir)
        self._step = step
        self._watchdog.start()

    def before_loop(self, step: int, num_steps: int) -> None:
        self._progress(step, f"in the host loop of steps {step + 1}..{step + num_steps}")
        if self._unwatched_loops:
            self._unwatched_loops -= 1
            self._watchdog.pause()

    def after_loop(self, stats: LoopStats) -> None:
        self._progress(stats.step, "after its host loop, saving or evaluating")

    def after_save(self, step: int, path: str) -> None:
        self._latest = path
        self._progress(step, "after saving its checkpoint")

    def close(self) -> None:
        self._watchdog.stop()

    def _progress(self, step: int, doing: str) -> None:
        self._step, self._doing = step, doing
        self._watchdog.resume()

    def _hung(self, idle_seconds: float) -> None:
        self._on_hang(
            f"tpurun train: error: no progress for --hang_timeout={self._timeout:g}s at step "
            f"{self._step} ({self._doing}): stuck waiting for input or the TPU; the latest "
            f"checkpoint is {self._latest or 'none (nothing saved yet)'}; rerun the same command "
            "to resume from it (or raise --hang_timeout if a host loop really takes that long)"
        )


def for_training(run: RunConfig, trainer: Trainer, terminal: bool | None = None) -> list[Monitor]:
    """The monitors of a training run.

    Every worker logs its loops (the chief on a terminal: a live line instead),
    warns when input-bound and watches for a hang; only the chief writes
    TensorBoard events and profiles. `terminal`: whether stderr is one (default: ask it).
    """
    if terminal is None:
        terminal = sys.stderr.isatty()
    monitors: list[Monitor] = []
    if run.hang_timeout:
        skips = trainer.step > 0 and not trainer.model.input_fn_seeks
        monitors.append(HangTimeout(run.hang_timeout, run.model_dir, skips_input=skips))
    monitors.append(ProgressBar() if terminal and trainer.is_chief else LogLines())
    monitors.append(InputBound(type(trainer.model).__name__))
    if trainer.is_chief:
        monitors.append(TrainSummaries(run.model_dir, graph=lambda: forward_graph(trainer)))
        if run.profile_steps is not None:
            monitors.append(ProfileSteps(run.model_dir, *run.profile_steps))
    return monitors
