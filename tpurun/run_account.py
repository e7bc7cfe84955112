"""A train's time account: its start (the cluster, the devices, whether a resume is
bit-identical), and the end of a finished one: the step's FLOPs and the device's peak,
the report's closing line and TensorBoard's goodput scalars (issue 30's `tpurun report`,
docs/restarts.md), run after the last step, never on a step's time.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import check, report, storage
from tpurun.actions.goodput import GoodputRecord
from tpurun.cluster import Cluster
from tpurun.errors import Preempted, caused_by_sigterm
from tpurun.errors.tf_errors import one_line
from tpurun.model import Model
from tpurun.run_config import RunConfig
from tpurun.run_config.determinism import Determinism


def start(
    path: str,
    record: dict[str, Any],
    cluster: Cluster,
    cluster_ready: float,
    kernels: Determinism | None,
) -> GoodputRecord:
    """The account of the train whose run record `record` was written to `path`: when its
    cluster was ready, its devices, and whether a resume of the run is bit-identical."""
    account = GoodputRecord(path, record)
    account.account["cluster_ready"] = cluster_ready
    account.account["device"] = {
        "kind": cluster.device_kind or "CPU",
        "replicas": cluster.num_replicas,
    }
    if kernels is not None:
        account.account["resume"] = kernels.as_record()
    return account


def end_quietly(account: GoodputRecord, error: BaseException) -> None:
    """The account's end for a run that failed: preempted (SIGTERM), interrupted, or error."""
    reasons = {Preempted: "preempted", KeyboardInterrupt: "interrupted"}
    # StoppedBySigterm, or the SystemError it comes back as from C code, is a preemption too.
    reason = "preempted" if caused_by_sigterm(error) else reasons.get(type(error), "error")
    try:
        account.finish(reason)
    except Exception as e:  # noqa: BLE001 - the run's own error is the one to report
        logging.warning("Could not write the end of the run record: %s", e)


# The FLOPs of the step are counted at the end of every train (1-3 s of XLA compile on a CPU
# for Iris); the test suite, which trains hundreds of times, sets this to 0.
COUNT_FLOPS_ENV = "TPURUN_COUNT_FLOPS"


def finish(run: RunConfig, cluster: Cluster, model: Model, account: GoodputRecord) -> None:
    """A finished train: the step's FLOPs and the device's peak into the account (counted now,
    after training: never on a step's time), the report's line and TensorBoard scalars, then
    the account's end. Never raises: the training succeeded."""
    fields: dict[str, Any] = {}
    trained = "training_start" in account.account  # not "already at step N"
    if trained and os.environ.get(COUNT_FLOPS_ENV, "1") == "0":
        fields["peak_why"] = f"{COUNT_FLOPS_ENV}=0: the FLOPs of the step were not counted"
    elif trained:
        try:
            fields["model_flops_per_step"] = check.train_step_flops(run, cluster, model)
        except Exception as e:  # noqa: BLE001 - a report without FLOPs is still a report
            logging.warning("Could not count the FLOPs of the train step: %s", one_line(e, 300))
        peak, why = check.peak_flops(cluster)
        fields["peak_flops_per_s"] = peak
        if why:
            fields["peak_why"] = why
    try:
        if trained:
            mine = storage.basename(account.path)
            accounts = report.run_records.time_accounts(run.model_dir)
            for line in accounts.skipped:
                logging.warning("Not in the time account: %s.", line)
            others = [goodput for name, goodput in accounts.found if name != mine]
            summary = report.account([*others, account.ended("finished", **fields)])
            print(f"tpurun train: {report.summary_line(summary)}", file=sys.stderr)
            _write_scalars(run.model_dir, summary)
        account.finish("finished", **fields)
    except Exception as e:  # noqa: BLE001
        logging.warning("Could not write the run's time account: %s", one_line(e, 300))


def _write_scalars(model_dir: str, summary: report.Report) -> None:
    """goodput/* and mfu for TensorBoard, at the run's last step."""
    with tf.summary.create_file_writer(model_dir).as_default(step=summary.steps):
        tf.summary.scalar("goodput/goodput_share", summary.goodput_share)
        tf.summary.scalar("goodput/goodput_s", summary.goodput_s)
        for name, seconds in summary.badput_s.items():
            tf.summary.scalar(f"goodput/{name}_s", seconds)
        if summary.mfu is not None:
            tf.summary.scalar("mfu", summary.mfu)
        if summary.achieved_flops_per_s:
            tf.summary.scalar("achieved_flops_per_s", summary.achieved_flops_per_s)
