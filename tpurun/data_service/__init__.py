"""Input past one host: a run's training input made by a tf.data service (docs/data-service.md).

Opt-in (`config.data.service = grpc://HOST:PORT`); without it the input is made here
and a resumed run continues it exactly. With it:

* `probe.wait_until_serving`: before the strategy (the TPU) is built, the dispatcher
  answers and lists a worker that answers, within config.data.service_timeout; else
  exit 69 (`train --max_restarts` restarts on it);
* `training.ServiceInput`: the model's unchanged input_fn(TRAIN), checked for Python
  (`pipeline`), moved to the service under a job of this attempt's own, started where
  a resumed run's input restarts (`job`): the start of its epoch, said in the log and
  the run record (its `data_service` field, `tpurun.layout.served_input`), never
  pretended exact;
* `watch`: a thread that says a worker lost (training goes on) or the dispatcher silent,
  and ends the run with exit 69 when the input's sources stay silent past the timeout;
* `servers`: `tpurun data-service dispatcher|worker`, the servers themselves;
* `sizing`: how many service workers `tpurun check --target` would add where one host's
  CPUs do not keep the chips fed.

Eval and predict never go through the service: they read here, exact and padded.
`rpc`, `state`, `probe`, `job` and `sizing` import no TensorFlow (setup.cfg's contract).
"""

from __future__ import annotations

from tpurun.data_service import sizing
from tpurun.data_service.pipeline import checked_refusal, python_calls, refusal
from tpurun.data_service.probe import wait_until_serving
from tpurun.data_service.training import ServiceInput
from tpurun.data_service.watch import ServiceWatch, input_errors
from tpurun.run_config.keys.service_keys import Service, service

__all__ = [
    "Service",
    "ServiceInput",
    "ServiceWatch",
    "checked_refusal",
    "input_errors",
    "python_calls",
    "refusal",
    "service",
    "sizing",
    "wait_until_serving",
]
