"""`tpurun train`: the Trainer, its actions and evaluator, run by the Controller."""

from __future__ import annotations

from absl import logging

from tpurun import actions, check, data_service
from tpurun import model as model_lib
from tpurun.actions.evaluation import EvaluateCheckpoint, ReportEval
from tpurun.actions.goodput import writing_through
from tpurun.actions.lease_renewal import RenewLease
from tpurun.actions.progress import ResumeCost
from tpurun.commands.running import Prepared
from tpurun.run_config import (
    RunConfig,
    splits,
)
from tpurun.runners.controller import Controller
from tpurun.runners.evaluate import Evaluator, eval_metrics
from tpurun.runners.train import Trainer, forward_graph
from tpurun.storage import background, best

# --- The commands -------------------------------------------------------------------


def train(run: RunConfig, prepared: Prepared) -> None:
    # config.data.service: a job the service lost is exit 69, not a failure.
    with data_service.input_errors(data_service.service(run.config)):
        _train(run, prepared)


def _train(run: RunConfig, prepared: Prepared) -> None:
    cluster, model, account = prepared.replicas, prepared.model, prepared.account
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
    trainer = Trainer(run, cluster, model, prepared.arrays)
    # What `tpurun check` warns of (rule batch-norm), said once where the run's log begins.
    replicas_differ = check.batch_norm_warning(
        trainer.state.models.values(), cluster.num_replicas, run.train_batch_size
    )
    if replicas_differ:
        logging.warning(replicas_differ)
    # config.data.service: its start line and record field, its lost servers, its deadline.
    serving = (
        [
            data_service.ServiceWatch(
                lambda: trainer.service_input, account.set_field if account else None
            )
        ]
        if data_service.service(run.config)
        else []
    )
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
                # The service's record field first: in the account's first write.
                *serving,
                # The account next: the supervisor hears of a step before it is logged.
                *([account] if account else []),
                *watching,
                *([RenewLease(prepared.lease, writer)] if prepared.lease else []),
                ResumeCost(),
            ],
            evaluate_checkpoint=evaluate_checkpoint,
            writer=writer,
        ).train()
