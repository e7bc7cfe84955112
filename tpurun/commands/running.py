"""`run`: a command's run put together from its row of the command table.

It prepares model_dir (or what the command reads), builds the strategy and the model,
resolves the run's length, writes the run record and calls the command's function with
what it prepared; on failure it leaves nothing behind that the run made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import check, data_service, inputs, precision, run_account, storage
from tpurun import model as model_lib
from tpurun.actions.goodput import GoodputRecord
from tpurun.cluster import Cluster, determinism, is_chief_process, strategy
from tpurun.commands.model_dir import (
    outputs,
    prepare_model_dir,
    require_checkpoint,
    undo,
    write_record,
)
from tpurun.datasets import train_count
from tpurun.errors import RunError, Unavailable, UsageError, storage_errors, tf_errors
from tpurun.foreign import outside
from tpurun.model import Mode, Model, TrainArrays
from tpurun.run_config import (
    FLOAT16_ON_TPU,
    RunConfig,
    epochs,
    refuse_local_paths_on_a_tpu_node,
    splits,
)
from tpurun.run_config.command_table import COMMAND, Command, ModelDir
from tpurun.run_config.flag_table import COMMAND_FLAGS
from tpurun.run_config.keys.determinism import Determinism
from tpurun.run_config.keys.trained_keys import Difference, conflicts
from tpurun.runners import sidecar
from tpurun.runners.predict import output_target
from tpurun.storage import lease, train_config


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


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What `run` put together for a command of a model_dir, before calling its function."""

    cluster: Cluster | None  # the strategy's replicas; None for a command without (export)
    model: Model
    lease: lease.Lease | None = None  # train: model_dir's trainer lease, held by the chief
    arrays: TrainArrays | None = None  # the training arrays, when counting read them
    account: GoodputRecord | None = None  # train: the time account (the chief's record)
    kernels: Determinism | None = None  # train: its kernels, set in TensorFlow while it runs

    @property
    def replicas(self) -> Cluster:
        """The cluster of a command that needs a strategy (its row's `needs_strategy`)."""
        assert self.cluster is not None
        return self.cluster


def _run(run: RunConfig) -> None:
    command = COMMAND[run.command]
    if command.model_dir is ModelDir.NONE:
        # check: traces the steps on the CPU only; no model_dir, checkpoint or run record.
        command.function()(run)
        return
    refuse_local_paths_on_a_tpu_node(run)
    created_dir = command.model_dir is ModelDir.WRITES and prepare_model_dir(run)
    held = None
    if command.takes_lease and is_chief_process():  # the cluster's lease: its chief's
        held = lease.acquire(run.model_dir, run.hang_timeout, run.force_takeover)
    # eval, predict, export: the model keys the command line changed from the trained ones.
    overridden: tuple[Difference, ...] = ()
    if command.model_dir is ModelDir.READS:
        run, overridden, created_dir = ready_to_read(run)
    outputs_before = outputs(run)
    record = None
    account: GoodputRecord | None = None
    settings = contextlib.ExitStack()  # TensorFlow's settings for the run, put back at its end
    try:
        run, prepared, cluster_ready = build(run, command, settings)
        cluster = prepared.cluster
        if cluster is None or cluster.is_chief:  # one record per run, not per worker
            record, written = write_record(run)
            if command.keeps_account and cluster is not None:
                account = start_account(record, written, cluster, cluster_ready)
                if prepared.kernels is not None:
                    account.resume(prepared.kernels.as_record())
        prepared = dataclasses.replace(prepared, lease=held, account=account)
        tf.keras.utils.set_random_seed(run.seed)
        # A checkpoint that does not fit the model the command line's overrides built: exit 2.
        with precision.policy(run.config.precision), conflicts(run.model_dir, overridden):
            run_command(run, prepared)
            if account is not None and cluster is not None:
                run_account.finish(run, cluster, prepared.model, account)
            if record is not None and cluster is not None:
                # Under the run's policy: the estimate builds the model as the run did.
                check.record_memory(record, run, cluster, prepared.model)
    except BaseException as e:
        if account is not None and not account.has_end:
            run_account.end_quietly(account, e)
        # Nothing half-written left behind: unless a train saved a checkpoint (or a
        # sidecar evaluated one), a run that fails (no TPU, bad data, bad config,
        # Ctrl-C) removes the model_dir it created, or else its run record: no
        # model_dir records a run that made nothing.
        if held is not None:
            held.release()
            held = None
        if outputs(run) == outputs_before and is_chief_process():
            undo(run.model_dir, created_dir, record)
        raise
    finally:
        settings.close()
    if held is not None:
        held.release()


def ready_to_read(run: RunConfig) -> tuple[RunConfig, tuple[Difference, ...], bool]:
    """eval, predict, export before anything is written: a checkpoint to read (a sidecar
    waits for the first instead, writing nothing, not even model_dir, until there is one)
    and an --output tpurun may write (checked again when it writes). The run with the model
    its checkpoints hold, whatever the config file says now, the model keys the command
    line changed from the trained ones, and whether the run will create model_dir (for
    the outputs of a checkpoint outside it alone: it goes again if the command fails)."""
    created_dir = False
    if run.continuous:
        sidecar.wait_for_checkpoint(run)
    else:
        run = outside.step_in_model_dir(run)
        if isinstance(run.checkpoint, str):
            outside.check_paths(run)  # --checkpoint=PATH: nothing written into it
            created_dir = not storage.isdir(run.model_dir)
        else:
            require_checkpoint(run)
        if "output" in COMMAND_FLAGS[run.command] and run.config.predict.output:
            output_target(run.config.predict.output, run.model_dir)
    run, overridden = outside.for_serving(run)
    return run, overridden, created_dir


def build(
    run: RunConfig, command: Command, settings: contextlib.ExitStack
) -> tuple[RunConfig, Prepared, float]:
    """The strategy, the model and the run's length, before anything is written: the run
    (its length resolved, where `command` resolves it), what is prepared of it, and when
    its cluster was ready. First, the tf.data service that will make its training input,
    if its config names one: it must answer (exit 69 otherwise, nothing initialised).
    TensorFlow's settings for the run's kernels go on `settings`, which the caller closes."""
    service = data_service.service(run.config) if command.service_input else None
    if service is not None:  # before the TPU: a service that does not serve is exit 69
        data_service.wait_until_serving(service)
    # The strategy first: splitting the CPU must happen before TensorFlow runs an op.
    cluster = strategy.build(run) if command.needs_strategy else None
    cluster_ready = time.time()
    kernels = None
    if command.sets_kernels and cluster is not None:  # before TensorFlow builds a function
        # Seeded first: op determinism refuses a random op without a seed, and the model's
        # creation (its arrays, its config check) may draw one.
        tf.keras.utils.set_random_seed(run.seed)
        kernels = settings.enter_context(determinism.applied(determinism.of_run(run, cluster)))
    if cluster is not None:
        cluster.check_batch_sizes(run)
        if cluster.is_tpu and run.config.precision == "mixed_float16":
            raise UsageError(FLOAT16_ON_TPU)
    model = model_lib.create(run.config)
    model_lib.check_model_config(model)  # before the record: a config it cannot run
    if command.checks_splits:
        splits.resolve(type(model), run.config)  # a bad split name fails before the record
    arrays = None
    if command.resolves_length(run):
        run, arrays = resolve_length(run, model)
    # The model builds its optimizer from its config: the one with the steps the epochs
    # made (a cosine schedule ends at them) and the recipe's epochs in steps.
    model.config = run.config
    return run, Prepared(cluster, model, arrays=arrays, kernels=kernels), cluster_ready


def start_account(
    record: str, written: dict[str, Any], cluster: Cluster, cluster_ready: float
) -> GoodputRecord:
    """The time account of a train's run record, from when its cluster was ready."""
    account = GoodputRecord(record, written)
    account.cluster_ready(cluster_ready, cluster.replica_kind, cluster.num_replicas)
    return account


# What a bad record raises inside the compiled loops (a feature of the wrong type or
# size, a truncated or corrupt file): TensorFlow's message names an op, not the file.
DATA_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.DataLossError)


def resolve_length(run: RunConfig, model: Model) -> tuple[RunConfig, TrainArrays | None]:
    """The run with its steps resolved: its training examples counted where it says a
    length in epochs (its steps from them), a warmup longer than the run warned of; the
    training arrays it read, if any."""
    if not run.needs_examples:
        return epochs.resolve_length(run), None
    arrays = inputs.train_arrays(model)
    counted = train_count.counted(model, arrays)
    return epochs.resolve_length(run, counted, train_config.recorded_examples(run)), arrays


def run_command(run: RunConfig, prepared: Prepared) -> None:
    """Runs the command's function; a data error becomes the model's diagnosis when it has one."""
    cluster, model = prepared.cluster, prepared.model
    try:
        COMMAND[run.command].function()(run, prepared)
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
    if not COMMAND[run.command].reads_data:
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
