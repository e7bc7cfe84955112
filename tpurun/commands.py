"""What each subcommand does, from a RunConfig: the pieces of a run, put together.

`run` prepares model_dir, builds the strategy and the model, writes the run
record and calls the command's function; on failure it leaves nothing behind
that the run made. `tpurun check` has its own package (`tpurun.check`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import actions, check, datasets, inputs, precision, run_account, storage
from tpurun import model as model_lib
from tpurun.actions.evaluation import EvaluateCheckpoint, ReportEval
from tpurun.actions.goodput import GoodputRecord, initial_account, writing_through
from tpurun.actions.lease_renewal import RenewLease
from tpurun.actions.progress import ResumeCost
from tpurun.cluster import Cluster, determinism, is_chief_process, strategy
from tpurun.errors import RunError, Unavailable, UsageError, storage_errors, tf_errors
from tpurun.errors.tf_errors import one_line
from tpurun.model import Mode, Model, TrainArrays
from tpurun.report.run_records import record_name
from tpurun.run_config import FLOAT16_ON_TPU, RunConfig, refuse_local_paths_on_a_tpu_node, splits
from tpurun.run_config.trained_keys import Difference, conflicts
from tpurun.runners import sidecar
from tpurun.runners.controller import Controller
from tpurun.runners.evaluate import Evaluator, eval_metrics
from tpurun.runners.export import export
from tpurun.runners.forward_graph import forward_graph
from tpurun.runners.predict import Predictor, output_target, write_rows
from tpurun.runners.train import Trainer
from tpurun.storage import background, best, checkpoints, lease, train_config
from tpurun.storage.eval_results import summary_line, write_json


def run(run: RunConfig) -> None:
    try:
        _run(run)
    except tf.errors.OpError as e:
        # A failed gs:// request, wherever TensorFlow made it (a save, a read in the
        # input pipeline): the cause and its fix on one line, instead of TensorFlow's.
        explained = storage_errors.explain(e.message, type(e).__name__)
        if explained is None:
            raise
        if storage_errors.is_transient(e.message, type(e).__name__):
            raise Unavailable(explained) from None  # exit 69: --max_restarts restarts it
        raise RunError(explained) from None


def _run(run: RunConfig) -> None:
    if run.command == "check":
        # Traces the steps on the CPU only: no model_dir, checkpoint or run record.
        check.main(run)
        return
    refuse_local_paths_on_a_tpu_node(run)
    created_dir = False
    held: lease.Lease | None = None
    # eval, predict, export: the model keys the command line changed from the trained ones.
    overridden: tuple[Difference, ...] = ()
    if run.command == "train":
        created_dir = prepare_model_dir(run)
        if is_chief_process():  # the cluster's lease: its chief's
            held = lease.acquire(run.model_dir, run.hang_timeout, run.force_takeover)
    else:
        if run.command == "eval" and run.continuous:
            # A sidecar may start before the trainer: it waits for the first checkpoint
            # instead, writing nothing (not even model_dir) until there is one.
            sidecar.wait_for_checkpoint(run)
        else:
            # Before anything is written: eval/predict/export of nothing is an error, as
            # is an --output tpurun may not write (checked again when it writes).
            require_checkpoint(run)
            if run.command == "predict" and run.config.predict.output:
                output_target(run.config.predict.output, run.model_dir)
        # The model its checkpoints hold, whatever the config file says now.
        run, overridden = train_config.for_serving(run)
    outputs_before = _outputs(run)
    record = None
    account: GoodputRecord | None = None
    settings = contextlib.ExitStack()  # TensorFlow's settings for the run, put back at its end
    try:
        # The strategy first: splitting the CPU must happen before TensorFlow runs an op.
        cluster = strategy.build(run) if run.command != "export" else None
        cluster_ready = time.time()
        kernels = settings.enter_context(determinism.for_train(run, cluster))  # before an op
        if cluster is not None:
            cluster.check_batch_sizes(run)
            if cluster.is_tpu and run.config.precision == "mixed_float16":
                raise UsageError(FLOAT16_ON_TPU)
        model = model_lib.create(run.config)
        model_lib.check_model_config(model)  # before the record: a config it cannot run
        if run.command in ("train", "eval"):
            splits.resolve(type(model), run.config)  # a bad split name fails before the record
        run, arrays = count_examples(run, model)
        # The model builds its optimizer from its config: the one with the steps the epochs
        # made (a cosine schedule ends at them) and the recipe's epochs in steps.
        model.config = run.config
        if cluster is None or cluster.is_chief:  # one record per run, not per worker
            record, written = write_record(run)
            if run.command == "train" and cluster is not None:
                account = run_account.start(record, written, cluster, cluster_ready, kernels)
        tf.keras.utils.set_random_seed(run.seed)
        # A checkpoint that does not fit the model the command line's overrides built: exit 2.
        with precision.policy(run.config.precision), conflicts(run.model_dir, overridden):
            run_command(run, cluster, model, held, arrays, account)
            if account is not None and cluster is not None:
                run_account.finish(run, cluster, model, account)
            if record is not None and cluster is not None:
                # Under the run's policy: the estimate builds the model as the run did.
                check.record_memory(record, run, cluster, model)
    except BaseException as e:
        if account is not None and "end" not in account.account:
            run_account.end_quietly(account, e)
        # Nothing half-written left behind: unless a train saved a checkpoint (or a
        # sidecar evaluated one), a run that fails (no TPU, bad data, bad config,
        # Ctrl-C) removes the model_dir it created, or else its run record: no
        # model_dir records a run that made nothing.
        if held is not None:
            held.release()
            held = None
        if _outputs(run) == outputs_before and is_chief_process():
            _undo(run.model_dir if created_dir else None, record)
        raise
    finally:
        settings.close()
    if held is not None:
        held.release()


def require_checkpoint(run: RunConfig) -> None:
    """Fails unless there is a checkpoint to read (the latest, or the one --best or
    --checkpoint chose)."""
    checkpoints.require_latest(run)
    if run.best:
        best.require(run)
    elif run.checkpoint is not None:
        checkpoints.require_step(run, run.checkpoint)


def chosen_checkpoint(run: RunConfig) -> str:
    """What eval, predict and export read: --best's, --checkpoint=N's, else the latest."""
    if run.best:
        chosen = best.require(run)
        logging.info(
            "The best checkpoint: step %d, %s=%.4f%s (%s).",
            chosen.step,
            chosen.metric,
            chosen.value,
            f" on {chosen.split}" if chosen.split else "",
            chosen.path,
        )
        return chosen.path
    if run.checkpoint is not None:
        return checkpoints.require_step(run, run.checkpoint)
    return checkpoints.require_latest(run)


def _outputs(run: RunConfig) -> object:
    """What a run keeps even when it fails later: train's checkpoints, a sidecar's results."""
    if run.command == "train":
        return checkpoints.latest(run.model_dir)
    if run.command == "eval" and run.continuous:
        found = []
        # eval/<split>/results-*, and eval/results-* of the default split.
        for pattern in ("results-*.json", "*/results-*.json"):
            try:
                found += tf.io.gfile.glob(storage.join(run.model_dir, "eval", pattern))
            except tf.errors.NotFoundError:
                pass
        return sorted(found)
    return None  # eval/predict/export write their one output last


# What a bad record raises inside the compiled loops (a feature of the wrong type or
# size, a truncated or corrupt file): TensorFlow's message names an op, not the file.
DATA_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.DataLossError)


def count_examples(run: RunConfig, model: Model) -> tuple[RunConfig, TrainArrays | None]:
    """The run with its training examples counted (and its steps, when it counts in
    epochs), where it trains or waits for the final step; the arrays it read, if any."""
    train = run.command == "train" and run.needs_examples
    sidecar = run.command == "eval" and run.continuous and bool(run.config.train.epochs)
    if not (train or sidecar):
        return run, None
    arrays = inputs.train_arrays(model)
    # In-memory arrays count themselves; a TFDS dataset's record counts its train split.
    examples = arrays.num_examples if arrays else datasets.train_examples(run.config)
    counted = train_config.resolve_length(run, examples)
    return counted, arrays


def run_command(
    run: RunConfig,
    cluster: Cluster | None,
    model: Model,
    held: lease.Lease | None = None,
    arrays: TrainArrays | None = None,
    account: GoodputRecord | None = None,
) -> None:
    """Runs the command; a data error becomes the model's diagnosis when it has one.

    `arrays`: the model's training arrays when they were read already (`count_examples`)."""
    try:
        if run.command == "export":
            export_command(run, model)  # serving has no replicas: no strategy
        elif run.command == "train":
            assert cluster is not None
            train(run, cluster, model, held, arrays, account)
        else:
            assert cluster is not None
            {"eval": evaluate, "predict": predict}[run.command](run, cluster, model)
    except tf.errors.UnavailableError as error:
        reason = (
            tf_errors.lost_worker_reason(error)
            if cluster is not None and cluster.num_workers > 1
            else None
        )
        if reason is None:
            raise
        # TensorFlow's own words ("Restart your program to reset") do not say that
        # another worker is gone, nor that every worker must be restarted.
        raise Unavailable(
            f"lost contact with another worker of the cluster ({reason}); one failed or "
            "was preempted (its own log says why): restart every worker with the same "
            "command, which resumes from the last checkpoint"
        ) from error
    except tf.errors.ResourceExhaustedError as error:
        # The TPU's page of allocations becomes what `tpurun check --target` would say.
        advice = check.out_of_memory(run, cluster, model, error) if cluster is not None else None
        if advice is None:
            raise
        raise RunError(advice) from error
    except DATA_ERRORS as error:
        diagnosis = diagnose_data(run, model, error)
        if diagnosis is None:
            raise
        raise RunError(diagnosis) from error


def diagnose_data(run: RunConfig, model: Model, error: Exception) -> str | None:
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
            storage.remove_tree(created_dir)
        elif record and tf.io.gfile.exists(record):
            tf.io.gfile.remove(record)
    except (tf.errors.OpError, OSError) as e:
        logging.warning("Could not clean up after the failed run: %s", e)


# --- The commands -------------------------------------------------------------------


def train(
    run: RunConfig,
    cluster: Cluster,
    model: Model,
    held: lease.Lease | None = None,
    arrays: TrainArrays | None = None,
    account: GoodputRecord | None = None,
) -> None:
    logging.info(
        "Global batch %d split over %d replica(s): %d examples per replica.",
        run.train_batch_size,
        cluster.num_replicas,
        run.train_batch_size // cluster.num_replicas,
    )
    evaluate_checkpoint = None
    model_splits = splits.resolve(type(model), run.config)  # before training: a bad name fails
    if run.config.train.eval_every:
        best.check_metric(run, eval_metrics(model))  # before training, not at the first eval
        evaluate_checkpoint = EvaluateCheckpoint(
            lambda: Evaluator(run, cluster, model).evaluate,
            ReportEval(run, cluster.is_chief, model_splits),
            model_splits.every_eval(),
        )
    trainer = Trainer(run, cluster, model, arrays)
    # What `tpurun check` warns of (rule batch-norm), said once where the run's log begins.
    replicas_differ = check.batch_norm_warning(
        trainer.state.models.values(), cluster.num_replicas, run.train_batch_size
    )
    if replicas_differ:
        logging.warning(replicas_differ)
    # The run's one thread for storage: checkpoints written in the background, events
    # uploaded. Closed (everything handed to it written) before the lease is released.
    with background.Writer() as writer, writing_through(account, writer):
        watching = actions.for_training(
            run,
            is_chief=cluster.is_chief,
            model_name=type(model).__name__,
            input_seeks=model.input_fn_seeks or model_lib.has_train_arrays(model),
            graph=lambda: forward_graph(trainer),
            writer=writer,
        )
        Controller(
            run,
            cluster,
            trainer,
            # ResumeCost: made just before the restore it times.
            actions=[
                # The account first: the supervisor hears of a step before it is logged.
                *([account] if account else []),
                *watching,
                *([RenewLease(held, writer)] if held else []),
                ResumeCost(),
            ],
            evaluate_checkpoint=evaluate_checkpoint,
            writer=writer,
        ).train()


def evaluate(run: RunConfig, cluster: Cluster, model: Model) -> None:
    if run.continuous and cluster.num_workers > 1:
        # The workers would each watch model_dir and could pick different checkpoints.
        raise UsageError(
            "tpurun eval --continuous runs on one machine: unset TF_CONFIG (it describes "
            f"{cluster.num_workers} workers) and run it once"
        )
    model_splits = splits.resolve(type(model), run.config)
    split = model_splits.chosen
    evaluator = Evaluator(run, cluster, model)
    best.check_metric(run, evaluator.metrics)
    report = ReportEval(run, cluster.is_chief, model_splits)
    if run.continuous:
        line = sidecar.evaluate_continuously(
            run,
            lambda path: evaluator.evaluate(path, split),
            lambda path, results: report(path, split, results),
            model_splits,
        )
        print(line, flush=True)
        return
    path = chosen_checkpoint(run)
    if run.best:
        evaluate_best(run, cluster, split, evaluator.evaluate(path, split))
        return
    report(path, split, evaluator.evaluate(path, split))


def evaluate_best(run: RunConfig, cluster: Cluster, split: str, results: dict[str, float]) -> None:
    """`eval --best`: the results are recorded beside the best (best/results-<split>.json).

    The best is a copy kept apart from model_dir's checkpoints, and its evaluation
    cannot improve it: neither eval/<split>/ nor best.json is touched.
    """
    if cluster.is_chief:
        logging.info("Wrote %s.", write_json(best.results_path(run.model_dir, split), results))
    print(summary_line(results, split) + " (the best checkpoint)", flush=True)


def predict(run: RunConfig, cluster: Cluster, model: Model) -> None:
    if cluster.num_workers > 1:
        # Each worker would predict only its own shard of the rows.
        raise UsageError(
            "tpurun predict runs on one machine: unset TF_CONFIG (it describes "
            f"{cluster.num_workers} workers) and run it once"
        )
    output = run.config.predict.output
    target = output_target(output, run.model_dir) if output else None
    predictor = Predictor(run, cluster, model)
    if target is not None:  # before predicting, not after
        predictor.check_output(output)
    rows = list(predictor.predict(chosen_checkpoint(run), output))
    if target is not None:
        line = write_rows(target, rows)  # JSON lines, .npz or a .png grid, by its extension
        # Beside the predictions when they went to stdout: on stderr, out of their way.
        print(line, file=sys.stderr if target.to_stdout else sys.stdout)
        return
    for line in model.format_predictions(rows):
        print(line)


def export_command(run: RunConfig, model: Model) -> None:
    print(export(run, model, chosen_checkpoint(run)))


# --- model_dir and the run record ----------------------------------------------------


def prepare_model_dir(run: RunConfig) -> bool:
    """Creates model_dir, or fails with a message if it cannot be written.

    Returns whether it created the directory (then a failed run removes it again).
    The chief also removes what tpurun processes that died left there.
    """
    try:
        created = not storage.isdir(run.model_dir)
        storage.make_dir(run.model_dir, run.model_dir)
        # A name of its own: every worker of a cluster probes the same model_dir at
        # once, and one removing another's probe made that one fail.
        storage.probe_writable(run.model_dir)
        if not created and is_chief_process():
            storage.remove_leftovers(run.model_dir)
    except (tf.errors.OpError, OSError) as e:
        # On gs:// what failed and its fix (a bucket, credentials, a role), else the message.
        message = str(getattr(e, "message", None) or e)
        explained = storage_errors.explain(message, type(e).__name__)
        transient = explained and storage_errors.is_transient(message, type(e).__name__)
        raise (Unavailable if transient else RunError)(
            f"cannot write to --model_dir={run.model_dir}: {explained}"
            if explained
            else f"cannot write to --model_dir={run.model_dir} ({one_line(e)}); "
            "choose a directory you can write"
        ) from None
    return created


def write_record(run: RunConfig) -> tuple[str, dict[str, Any]]:
    """The run record: run config and versions, one JSON file per run under model_dir/runs
    (a train's also the start of its time account: `actions.goodput`). Its path and content."""
    runs = storage.make_dir(run.model_dir, storage.join(run.model_dir, "runs"))
    path = storage.join(runs, record_name(run.command))
    record = json.loads(run.record(tf.__version__))
    if run.command == "train":
        record["goodput"] = initial_account()
    storage.write_atomically(path, json.dumps(record, indent=2, default=str) + "\n")
    print(f"tpurun {run.command}: model_dir {run.model_dir}", file=sys.stderr)
    return path, record
