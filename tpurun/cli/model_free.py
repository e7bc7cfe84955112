"""The commands that run no model: `tpurun list`, `tpurun report` (no TensorFlow) and
`tpurun data-service` (a tf.data service's server: TensorFlow loads once its flags hold).

Each is the function its row of the command table names; `report` and `data-service`
read the flags `tpurun.cli` parsed into their handles, and `data-service` is called with
its role, the word its command line takes first.
"""

from __future__ import annotations

import os
import re

from absl import flags

from tpurun.cli import handles, terminal
from tpurun.errors import UsageError
from tpurun.run_config import config_files
from tpurun.run_config.keys.service_keys import DISPATCHER_PORT, WORKER_PORT

# Each server's port unless --port says another (`tpurun.data_service.sizing`'s too).
# A worker's --dispatcher: a host name or IPv4 address, or an IPv6 one in brackets; a port.
_DISPATCHER = re.compile(r"[\w.\-]+:\d{1,5}|\[[\w:.]+\]:\d{1,5}")


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


def serve_data(role: str) -> int:
    """`tpurun data-service dispatcher|worker`: a tf.data service's server, run until SIGTERM
    (its exit code); UsageError for a worker without its dispatcher's address."""
    dispatcher = (handles.value("dispatcher") or "").removeprefix("grpc://")
    if role == "worker" and not _DISPATCHER.fullmatch(dispatcher):
        raise UsageError(
            f"tpurun data-service worker needs --dispatcher=HOST:PORT, the dispatcher's address "
            f"(got {dispatcher or 'none'!r}), e.g. --dispatcher=10.128.0.5:5050"
        )
    verbose = flags.FLAGS.verbosity >= 1
    if not verbose:  # TensorFlow's C++ lines: a worker's log would be its retries
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    terminal.quiet_tensorflow(verbose=verbose)
    from tpurun.data_service import servers

    return servers.serve(
        role,
        handles.value("port") or (DISPATCHER_PORT if role == "dispatcher" else WORKER_PORT),
        work_dir=handles.value("work_dir") or "",
        dispatcher=dispatcher,
        address=handles.value("worker_address") or "",
    )
