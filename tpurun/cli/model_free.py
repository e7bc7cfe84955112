"""The commands that run no model: `tpurun list` and `tpurun report` (no TensorFlow).

Each is the function its row of the command table names; `report` reads the flags
`tpurun.cli` parsed into their handles.
"""

from __future__ import annotations

import os

from tpurun.cli import handles
from tpurun.errors import UsageError
from tpurun.run_config import config_files


def list_configs() -> int:
    """`tpurun list`: the registered configs, and the config files in this directory."""
    names = config_files.builtin_names()
    width = max(len(n) for n in names) if names else 0
    for name in names:
        path = os.path.join(config_files.builtin_dir(), name + ".py")
        print(f"{name:<{width}}  {config_files.summary(path)}")
    local = config_files.local_configs()
    if local:
        print("\nconfig files in this directory (pass --config=<path>):")
        width = max(len(path) for path, _ in local)
        for path, summary in local:
            print(f"  {path:<{width}}  {summary}")
    return 0


def show_report() -> int:
    """`tpurun report --model_dir=D [--json]`: the report of a model_dir's run records."""
    model_dir = handles.value("model_dir") or ""
    if not model_dir:  # a run's, not a parse's, need: the manual names the command
        raise UsageError("tpurun report needs --model_dir: the model_dir of a training run")
    from tpurun import report

    print(report.main(model_dir, as_json=bool(handles.value("json"))))
    return 0
