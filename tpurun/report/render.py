"""The report as a person or a machine reads it: `main` (the command: a table, or JSON, with
the runs whose input a tf.data service made), `read`, and `summary_line`, the one line
`train` ends with."""

from __future__ import annotations

import json
import sys

from tpurun.errors import RunError
from tpurun.layout import served_input
from tpurun.layout.names import RUNS_DIR
from tpurun.layout.served_input import ServedInput
from tpurun.report.goodput import CATEGORIES, Report, account
from tpurun.report.run_records import time_accounts


def read(model_dir: str) -> Report:
    """The report of model_dir's train run records (those that hold)."""
    return account([goodput for _, goodput in time_accounts(model_dir).found])


def main(model_dir: str, as_json: bool = False) -> str:
    """The report, as a table or JSON; a record that does not hold is skipped with one line
    on stderr naming its file and field (and listed in the JSON's `skipped_records`)."""
    accounts = time_accounts(model_dir)
    for line in accounts.skipped:
        print(f"tpurun report: skipped {line}", file=sys.stderr)
    report = account([goodput for _, goodput in accounts.found])
    if not report.processes:
        skipped = f" ({len(accounts.skipped)} skipped: see above)" if accounts.skipped else ""
        raise RunError(
            f"no train run record with a time account in {model_dir}/{RUNS_DIR}{skipped}: "
            "train there "
            "with tpurun 0.2 or later first (tpurun train --model_dir=...)"
        )
    if as_json:
        shown = {**report.as_json(), "skipped_records": accounts.skipped}
        if accounts.served:  # runs whose input a tf.data service made: how, and where each resumed
            shown[served_input.KEY] = [
                {"record": name, **served_input.as_json(served)} for name, served in accounts.served
            ]
        return json.dumps(shown, indent=2)
    return "\n".join([table(report), *served_lines(accounts.served)])


def _seconds(value: float) -> str:
    if abs(value) >= 3600:
        return f"{value / 3600:.2f} h"
    if abs(value) >= 60:
        return f"{value / 60:.1f} min"
    if 0 < abs(value) < 0.01:
        return f"{value * 1e6:.0f} us" if abs(value) < 1e-3 else f"{value * 1e3:.2f} ms"
    return f"{value:.2f} s"


def _flops(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} FLOP"


def table(report: Report) -> str:
    """The report as a person reads it: each category's time and share of the wall time."""
    wall = report.wall_s or 1.0
    lines = [
        f"wall time      {_seconds(report.wall_s):>10}  {report.processes} train process(es), "
        f"{report.disruptions} disruption(s), {report.restarts} restart(s), "
        f"{report.steps:,} steps kept",
        f"goodput        {_seconds(report.goodput_s):>10}  {report.goodput_s / wall:6.1%}",
        "badput:",
    ]
    for name in CATEGORIES:
        value = report.badput_s[name]
        lines.append(f"  {name:<13}{_seconds(value):>10}  {value / wall:6.1%}")
    step = f" ({_seconds(report.step_seconds)} a step)" if report.step_seconds else ""
    lines.append(f"model FLOPs    {_flops(report.model_flops_per_step)} per step{step}")
    achieved = report.achieved_flops_per_s
    lines.append(f"achieved       {_flops(achieved)}/s" if achieved else "achieved       n/a")
    lines.append(
        f"MFU            {report.mfu:.1%}"
        if report.mfu is not None
        else f"MFU            n/a ({report.mfu_why})"
    )
    if report.resume:
        lines.append(f"resumes        {report.resume}")
    return "\n".join(lines)


def served_lines(served: list[tuple[str, ServedInput]]) -> list[str]:
    """The runs whose input a tf.data service made (by their record's name), and where each
    resumed one restarted it: not where the run before stopped (docs/data-service.md)."""
    if not served:
        return []
    lines = [f"input          a tf.data service made the input of {len(served)} run(s):"]
    for record, run in served:
        starts = run.input_starts_at
        where = (
            f"the start of epoch {starts.epoch} (step {starts.step})"
            if starts is not None
            else "the start of its stream"
        )
        resumed = (
            f"resumed at step {run.started_at_step}, input restarted at {where}: not exact"
            if run.started_at_step
            else "from step 0"
        )
        lines.append(
            f"  {record}: {run.service} ({run.processing_mode}), job {run.job_name}, {resumed}"
        )
    return lines


def summary_line(report: Report) -> str:
    """What `train` ends with: the goodput share, the largest badput, MFU."""
    name, value = report.largest_badput()
    wall = report.wall_s or 1.0
    mfu = f"MFU {report.mfu:.1%}" if report.mfu is not None else "MFU n/a"
    if report.mfu is None and report.achieved_flops_per_s:
        mfu += f" ({_flops(report.achieved_flops_per_s)}/s achieved; {report.mfu_why})"
    return (
        f"goodput {report.goodput_share:.1%} of {_seconds(report.wall_s)}; largest badput "
        f"{name} {_seconds(value)} ({value / wall:.1%}); {mfu} (tpurun report "
        "--model_dir=... for all)"
    )
