"""`tpurun report`: where a model_dir's training time went, from its run records alone.

* `run_records`: the train run records read back (local or gs://), without TensorFlow,
  each checked by `tpurun.layout.time_account.check` (one that does not hold is
  skipped, with its line);
* `goodput`: the arithmetic: goodput and badput by category, disruptions, restarts,
  FLOPs per step, achieved FLOP/s and MFU (`account` -> `Report`);
* `render`: `main`, the command (a table, or JSON); `summary_line`, the one line
  `train` ends with.
"""

from __future__ import annotations

from tpurun.report.goodput import CATEGORIES, Report, account
from tpurun.report.render import main, read, summary_line, table

__all__ = ["CATEGORIES", "Report", "account", "main", "read", "summary_line", "table"]
