"""Evaluating a checkpoint and keeping what it says: results file, TensorBoard, the best, a line.

The same actions follow an evaluation in `train --eval_every`, `tpurun eval` and
the `eval --continuous` sidecar.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
from absl import logging

from tpurun import best, storage
from tpurun.eval_results import summary_line, write_results
from tpurun.run_config import RunConfig

Evaluate = Callable[[str], dict[str, float]]  # checkpoint path -> eval results


class EvalSummaries:
    """Every eval metric as a TensorBoard scalar under model_dir/eval, at the checkpoint's step.

    One events file per run however many checkpoints it evaluates, created at the
    first write (a failed eval leaves none) and flushed after each, so TensorBoard
    shows a sidecar's results as they come.
    """

    def __init__(self, model_dir: str):
        self._logdir = tf.io.gfile.join(model_dir, "eval")
        self._writer: tf.summary.SummaryWriter | None = None

    def write(self, results: dict[str, float]) -> None:
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self._logdir)
        with self._writer.as_default(step=int(results["global_step"])):
            for name, value in results.items():
                if name != "global_step":
                    tf.summary.scalar(name, value)
        self._writer.flush()


class ReportEval:
    """What follows every evaluation of a checkpoint: `report(path, results)`.

    Every worker prints the `eval at step` line; the chief alone (every worker has
    the same summed results) writes eval/results-<step>.json and the TensorBoard
    scalars, and keeps the checkpoint if it is the best so far.
    """

    def __init__(self, run: RunConfig, is_chief: bool):
        self._run = run
        self._summaries = EvalSummaries(run.model_dir) if is_chief else None

    def __call__(self, checkpoint_path: str, results: dict[str, float]) -> None:
        if self._summaries is not None:
            logging.info("Wrote %s.", write_results(self._run.model_dir, results))
            try:
                self._summaries.write(results)
                best.update(self._run, checkpoint_path, results)
            except (tf.errors.OpError, OSError) as e:
                # The chief alone does this: failing here would leave the other
                # workers of a train --eval_every blocked in their next all-reduce.
                logging.warning(
                    "Could not write the eval summaries or the best checkpoint: %s",
                    storage.failure(e),
                )
        print(summary_line(results), flush=True)


class EvaluateCheckpoint:
    """`evaluate_checkpoint(path)`: evaluates the checkpoint, then reports it (on every worker).

    `make_evaluate` is called once, at the first evaluation: in `train --eval_every`
    the evaluator must be built after the Trainer built its model, or it would draw
    from the seeded random state and change the initial weights.
    """

    def __init__(self, make_evaluate: Callable[[], Evaluate], report: ReportEval):
        self._make_evaluate = make_evaluate
        self._evaluate: Evaluate | None = None
        self.report = report

    @property
    def evaluate(self) -> Evaluate:
        if self._evaluate is None:
            self._evaluate = self._make_evaluate()
        return self._evaluate

    def __call__(self, checkpoint_path: str) -> None:
        self.report(checkpoint_path, self.evaluate(checkpoint_path))
