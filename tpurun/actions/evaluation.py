"""Evaluating a checkpoint and keeping what it says: results file, TensorBoard, the best, a line.

The same actions follow an evaluation in `train --eval_every`, `tpurun eval` and
the `eval --continuous` sidecar. Every evaluation is of one named split; only the
selecting split (config.eval.best_split) is offered to best/.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
from absl import logging

from tpurun import storage
from tpurun.layout import names
from tpurun.run_config import RunConfig
from tpurun.run_config.splits import Splits
from tpurun.storage import best
from tpurun.storage.eval_results import summary_line, write_results

Evaluate = Callable[[str, str], dict[str, float]]  # checkpoint path, split -> eval results


def summaries_dir(model_dir: str, split: str) -> str:
    """eval_<split>, so TensorBoard shows each split as a run of its own (eval_val, eval_test);
    the default split of a model that declares none keeps the old eval/."""
    return names.eval_summaries_dir(model_dir, split)


class EvalSummaries:
    """Every eval metric as a TensorBoard scalar under model_dir/eval_<split>, at the
    checkpoint's step.

    One events file per split and run however many checkpoints it evaluates, created
    at the first write (a failed eval leaves none) and flushed after each, so
    TensorBoard shows a sidecar's results as they come.
    """

    def __init__(self, model_dir: str):
        self._model_dir = model_dir
        self._writers: dict[str, tf.summary.SummaryWriter] = {}

    def write(self, split: str, results: dict[str, float]) -> None:
        if split not in self._writers:
            logdir = summaries_dir(self._model_dir, split)
            self._writers[split] = tf.summary.create_file_writer(logdir)
        with self._writers[split].as_default(step=int(results["global_step"])):
            for name, value in results.items():
                if name != "global_step":
                    tf.summary.scalar(name, value)
        self._writers[split].flush()


class ReportEval:
    """What follows every evaluation of a checkpoint: `report(path, split, results)`.

    Every worker prints the `eval at step N on <split>` line; the chief alone (every
    worker has the same summed results) writes eval/<split>/results-<step>.json and
    the TensorBoard scalars, and, for the selecting split only, keeps the
    checkpoint if it is the best so far.
    """

    def __init__(self, run: RunConfig, is_chief: bool, model_splits: Splits):
        self._run = run
        self._splits = model_splits
        self._summaries = EvalSummaries(run.model_dir) if is_chief else None
        self._said_unchanged: set[str] = set()

    def __call__(self, checkpoint_path: str, split: str, results: dict[str, float]) -> None:
        if self._summaries is not None:
            # The results file comes last: it is what marks the step evaluated (a sidecar
            # or a resumed run skips it), so a step whose best update failed is offered
            # to best/ again by the next evaluation instead of never.
            try:
                self._summaries.write(split, results)
                if split == self._splits.best:
                    best.update(self._run, checkpoint_path, results, split)
            except (tf.errors.OpError, OSError) as e:
                # The chief alone does this: failing here would leave the other
                # workers of a train --eval_every blocked in their next all-reduce.
                logging.warning(
                    "Could not write the eval summaries or the best checkpoint: %s; the "
                    "results of step %d are not recorded, so the next evaluation of this "
                    "model_dir evaluates it again",
                    storage.failure(e),
                    int(results["global_step"]),
                )
            else:
                logging.info("Wrote %s.", write_results(self._run.model_dir, results, split))
        print(summary_line(results, split), flush=True)
        if split != self._splits.best and split not in self._said_unchanged:
            self._said_unchanged.add(split)  # once: a sidecar evaluates many checkpoints
            print(f"not the best_split {self._splits.best!r}: best/ unchanged", flush=True)


class EvaluateCheckpoint:
    """`evaluate_checkpoint(path)`: evaluates the checkpoint on each of `eval_splits`, then
    reports it (on every worker).

    `make_evaluate` is called once, at the first evaluation: in `train --eval_every`
    the evaluator must be built after the Trainer built its model, or it would draw
    from the seeded random state and change the initial weights.
    """

    def __init__(
        self,
        make_evaluate: Callable[[], Evaluate],
        report: ReportEval,
        eval_splits: tuple[str, ...],
    ):
        self._make_evaluate = make_evaluate
        self._evaluate: Evaluate | None = None
        self.report = report
        self._eval_splits = eval_splits

    @property
    def evaluate(self) -> Evaluate:
        if self._evaluate is None:
            self._evaluate = self._make_evaluate()
        return self._evaluate

    def __call__(self, checkpoint_path: str) -> None:
        for split in self._eval_splits:
            self.report(checkpoint_path, split, self.evaluate(checkpoint_path, split))
