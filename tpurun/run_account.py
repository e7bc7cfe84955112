"""The end of a finished train's time account: the step's FLOPs and the device's peak,
the report's closing line and TensorBoard's goodput scalars (issue 30's `tpurun report`,
docs/restarts.md). Run after the last step, never on a step's time.
"""

from __future__ import annotations

import os
import sys

import tensorflow as tf
from absl import logging

from tpurun import check, report, storage
from tpurun.actions.goodput import GoodputRecord
from tpurun.cluster import Cluster
from tpurun.errors import Preempted, caused_by_sigterm
from tpurun.errors.tf_errors import one_line
from tpurun.layout.time_account import ERROR, FINISHED, INTERRUPTED, PREEMPTED
from tpurun.model import Model
from tpurun.run_config import RunConfig


def end_quietly(account: GoodputRecord, error: BaseException) -> None:
    """The account's end for a run that failed: preempted (SIGTERM), interrupted, or error."""
    reasons = {Preempted: PREEMPTED, KeyboardInterrupt: INTERRUPTED}
    # StoppedBySigterm, or the SystemError it comes back as from C code, is a preemption too.
    reason = PREEMPTED if caused_by_sigterm(error) else reasons.get(type(error), ERROR)
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
    if account.trained and os.environ.get(COUNT_FLOPS_ENV, "1") == "0":
        account.step_costs(peak_why=f"{COUNT_FLOPS_ENV}=0: the FLOPs of the step were not counted")
    elif account.trained:
        flops = None
        try:
            flops = check.train_step_flops(run, cluster, model)
        except Exception as e:  # noqa: BLE001 - a report without FLOPs is still a report
            logging.warning("Could not count the FLOPs of the train step: %s", one_line(e, 300))
        peak, why = check.peak_flops(cluster)
        account.step_costs(flops, peak, why or None)
    try:
        if account.trained:
            mine = storage.basename(account.path)
            accounts = report.run_records.time_accounts(run.model_dir)
            for line in accounts.skipped:
                logging.warning("Not in the time account: %s.", line)
            others = [goodput for name, goodput in accounts.found if name != mine]
            summary = report.account([*others, account.ended(FINISHED)])
            print(f"tpurun train: {report.summary_line(summary)}", file=sys.stderr)
            _write_scalars(run.model_dir, summary)
        account.finish(FINISHED)
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
