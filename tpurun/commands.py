"""What each subcommand does, from a RunConfig: the only place the pieces meet."""

from __future__ import annotations

import datetime
import json
import re
import sys
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import tensorflow as tf
from absl import logging

from tpurun import checkpoints
from tpurun import cluster as cluster_lib
from tpurun import model as model_lib
from tpurun.errors import RunError, UsageError
from tpurun.files import write_atomically
from tpurun.model import Mode
from tpurun.run_config import RunConfig
from tpurun.tf_errors import one_line, op_error_line

if TYPE_CHECKING:
    from tpurun.evaluate import Evaluator


def run(run: RunConfig) -> None:
    if run.command == "check":
        # Traces the steps on the CPU only: no model_dir, checkpoint or run record.
        from tpurun import check

        check.main(run)
        return
    created_dir = False
    if run.command == "train":
        created_dir = prepare_model_dir(run)
    elif run.command == "eval" and run.continuous:
        from tpurun.evaluate import wait_for_checkpoint

        # A sidecar may start before the trainer: it waits for the first checkpoint
        # instead, writing nothing (not even model_dir) until there is one.
        wait_for_checkpoint(run)
    else:
        # Before anything is written: eval/predict/export of nothing is an error.
        require_checkpoint(run)
    outputs_before = _outputs(run)
    record = None
    try:
        # The strategy first: splitting the CPU must happen before TensorFlow runs an op.
        cluster = cluster_lib.build(run) if run.command != "export" else None
        if cluster is not None:
            cluster.check_batch_sizes(run)
        model = model_lib.create(run.config)
        if cluster is None or cluster.is_chief:  # one record per run, not per worker
            record = write_record(run)
        tf.keras.utils.set_random_seed(run.seed)
        run_command(run, cluster, model)
    except BaseException:
        # Nothing half-written left behind: unless a train saved a checkpoint (or a
        # sidecar evaluated one), a run that fails (no TPU, bad data, bad config,
        # Ctrl-C) removes the model_dir it created, or else its run record: no
        # model_dir records a run that made nothing.
        if _outputs(run) == outputs_before and cluster_lib.is_chief_process():
            _undo(run.model_dir if created_dir else None, record)
        raise


def require_checkpoint(run: RunConfig) -> None:
    """Fails unless there is a checkpoint to read: the latest, or for export --best the best."""
    checkpoints.require_latest(run)
    if run.command == "export" and run.export_best:
        from tpurun import best

        best.require(run)


def _outputs(run: RunConfig) -> object:
    """What a run keeps even when it fails later: train's checkpoints, a sidecar's results."""
    if run.command == "train":
        return checkpoints.latest(run.model_dir)
    if run.command == "eval" and run.continuous:
        pattern = tf.io.gfile.join(run.model_dir, "eval", "results-*.json")
        try:
            return sorted(tf.io.gfile.glob(pattern))
        except tf.errors.NotFoundError:
            return []
    return None  # eval/predict/export write their one output last


# What a bad record raises inside the compiled loops (a feature of the wrong type or
# size, a truncated or corrupt file): TensorFlow's message names an op, not the file.
DATA_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.DataLossError)


def run_command(run: RunConfig, cluster, model) -> None:
    """Runs the command; a data error becomes the model's diagnosis when it has one."""
    command = {"train": train, "eval": evaluate, "predict": predict, "export": export}
    try:
        command[run.command](run, cluster, model)
    except tf.errors.UnavailableError as error:
        reason = (
            lost_worker_reason(error) if cluster is not None and cluster.num_workers > 1 else None
        )
        if reason is None:
            raise
        # TensorFlow's own words ("Restart your program to reset") do not say that
        # another worker is gone, nor that every worker must be restarted.
        raise RunError(
            f"lost contact with another worker of the cluster ({reason}); one failed or "
            "was preempted (its own log says why): restart every worker with the same "
            "command, which resumes from the last checkpoint"
        ) from error
    except DATA_ERRORS as error:
        diagnosis = diagnose_data(run, model, error)
        if diagnosis is None:
            raise
        raise RunError(diagnosis) from error


def lost_worker_reason(error: tf.errors.UnavailableError) -> str | None:
    """Why a collective with the other workers was aborted; None if the error is not that.

    Unavailable storage (a GCS outage) raises the same error type, and must not be
    reported as a lost worker.
    """
    message = error.message
    if "Collective ops is aborted" not in message and "/job:" not in message:
        return None
    aborted = re.search(r"Collective ops is aborted by: ([^\n]*)", message)
    return (aborted.group(1) if aborted else op_error_line(message)).strip()[:200]


def diagnose_data(run: RunConfig, model, error: Exception) -> str | None:
    """The model's `diagnose_data` for the data this command read; None if it finds nothing."""
    if run.command not in ("train", "eval", "predict"):
        return None  # export reads no data
    mode = Mode(run.command)
    if mode is Mode.PREDICT and model_lib.has_generate(model):
        return None  # predict ran the model's generate(), not its input_fn
    logging.info(
        "%s during %s; looking for a bad record in the %s data.",
        type(error).__name__,
        run.command,
        mode.value,
    )
    try:
        return model.diagnose_data(mode)
    except Exception as e:  # noqa: BLE001 - a failed diagnosis must not hide the real error
        logging.warning("%s.diagnose_data(%s) failed: %s", type(model).__name__, mode.value, e)
        return None


def _undo(created_dir: str | None, record: str | None) -> None:
    """Removes the model_dir this run created, else this run's record; never raises."""
    try:
        if created_dir:
            tf.io.gfile.rmtree(created_dir)
        elif record and tf.io.gfile.exists(record):
            tf.io.gfile.remove(record)
    except (tf.errors.OpError, OSError) as e:
        logging.warning("Could not clean up after the failed run: %s", e)


def train(run: RunConfig, cluster, model) -> None:
    from tpurun.train import Trainer

    logging.info(
        "Global batch %d split over %d replica(s): %d examples per replica.",
        run.train_batch_size,
        cluster.num_replicas,
        run.train_batch_size // cluster.num_replicas,
    )
    evaluate_checkpoint = None
    if run.config.train.eval_every:
        from tpurun import best
        from tpurun.evaluate import eval_metrics

        best.check_metric(run, eval_metrics(model))  # before training, not at the first eval
        evaluate_checkpoint = EvalAfterSave(run, cluster, model)
    Trainer(run, cluster, model, evaluate_checkpoint=evaluate_checkpoint).train()


class EvalAfterSave:
    """train --eval_every: evaluates the checkpoint the Trainer just saved, on every worker.

    The Evaluator is built at the first call, once, after the Trainer built its
    model: built before, it would draw from the seeded random state and change the
    initial weights, so --eval_every would change what is trained.
    """

    def __init__(self, run: RunConfig, cluster, model):
        self.run, self.cluster, self.model = run, cluster, model
        self.evaluator: Evaluator | None = None
        self.report = eval_report(run, cluster)

    def __call__(self, path: str) -> None:
        from tpurun.evaluate import Evaluator

        if self.evaluator is None:
            self.evaluator = Evaluator(self.run, self.cluster, self.model)
        self.report(path, self.evaluator.evaluate(path))


def eval_report(run: RunConfig, cluster) -> Callable[[str, dict[str, float]], None]:
    """What follows every evaluation of a checkpoint, as a function of (path, results).

    Every worker prints the `eval at step` line; the chief alone (every worker has
    the same summed results) writes eval/results-<step>.json and the TensorBoard
    scalars, and keeps the checkpoint if it is the best so far.
    """
    from tpurun import best
    from tpurun.evaluate import EvalSummaries, summary_line, write_results

    summaries = EvalSummaries(run.model_dir) if cluster.is_chief else None

    def report(checkpoint_path: str, results: dict[str, float]) -> None:
        if summaries is not None:
            logging.info("Wrote %s.", write_results(run, results))
            try:
                summaries.write(results)
                best.update(run, checkpoint_path, results)
            except (tf.errors.OpError, OSError) as e:
                # The chief alone does this: failing here would leave the other
                # workers of a train --eval_every blocked in their next all-reduce.
                logging.warning("Could not write the eval summaries or the best checkpoint: %s", e)
        print(summary_line(results), flush=True)

    return report


def evaluate(run: RunConfig, cluster, model) -> None:
    from tpurun import best
    from tpurun.evaluate import Evaluator, evaluate_continuously

    if run.continuous and cluster.num_workers > 1:
        # The workers would each watch model_dir and could pick different checkpoints.
        raise UsageError(
            "tpurun eval --continuous runs on one machine: unset TF_CONFIG (it describes "
            f"{cluster.num_workers} workers) and run it once"
        )
    evaluator = Evaluator(run, cluster, model)
    best.check_metric(run, evaluator.metrics)
    report = eval_report(run, cluster)
    if run.continuous:
        print(evaluate_continuously(run, evaluator.evaluate, report), flush=True)
        return
    path = checkpoints.require_latest(run)
    report(path, evaluator.evaluate(path))


def predict(run: RunConfig, cluster, model) -> None:
    from tpurun.model import to_json
    from tpurun.predict import Predictor

    if cluster.num_workers > 1:
        # Each worker would predict only its own shard of the rows.
        raise UsageError(
            "tpurun predict runs on one machine: unset TF_CONFIG (it describes "
            f"{cluster.num_workers} workers) and run it once"
        )
    rows = list(Predictor(run, cluster, model).predict(checkpoints.require_latest(run)))
    output = run.config.predict.output
    if output:
        write_atomically(output, "".join(json.dumps(to_json(row)) + "\n" for row in rows))
        print(f"wrote {len(rows)} predictions to {output}")
        return
    for line in model.format_predictions(rows):
        print(line)


def export(run: RunConfig, cluster, model) -> None:
    from tpurun import best
    from tpurun.export import export as export_model

    if run.export_best:
        chosen = best.require(run)
        logging.info(
            "Exporting the best checkpoint: step %d, %s=%.4f (%s).",
            chosen.step,
            chosen.metric,
            chosen.value,
            chosen.path,
        )
        path = chosen.path
    else:
        path = checkpoints.require_latest(run)
    print(export_model(run, model, path))


def prepare_model_dir(run: RunConfig) -> bool:
    """Creates model_dir, or fails with a message if it cannot be written.

    Returns whether it created the directory (then a failed run removes it again).
    """
    try:
        created = not tf.io.gfile.isdir(run.model_dir)
        tf.io.gfile.makedirs(run.model_dir)
        # A name of its own: every worker of a cluster probes the same model_dir at
        # once, and one removing another's probe made that one fail.
        probe = tf.io.gfile.join(run.model_dir, f".tpurun-write-probe-{uuid.uuid4().hex}")
        with tf.io.gfile.GFile(probe, "w") as f:
            f.write("ok")
        tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
        raise RunError(
            f"cannot write to --model_dir={run.model_dir} ({one_line(e)}); "
            "choose a directory you can write"
        ) from None
    return created


def write_record(run: RunConfig) -> str:
    """The run record: run config and versions, one JSON file per run under model_dir/runs."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    runs = tf.io.gfile.join(run.model_dir, "runs")
    tf.io.gfile.makedirs(runs)
    path = tf.io.gfile.join(runs, f"{stamp}-{run.command}.json")
    write_atomically(path, run.record(tf.__version__) + "\n")
    print(f"tpurun {run.command}: model_dir {run.model_dir}", file=sys.stderr)
    return path
