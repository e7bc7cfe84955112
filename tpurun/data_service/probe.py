"""Before the TPU: does the run's tf.data service answer, with a worker? (No TensorFlow.)

`tpurun train` asks before it builds its strategy (a TPU's initialisation takes
minutes and a slice is billed from then on): the dispatcher must answer and list a
worker that answers, within config.data.service_timeout. Servers started with the run
(a dispatcher still loading its journal, workers still registering) are waited for;
past the deadline the run ends with Unavailable (exit 69), the exit `train
--max_restarts` restarts on, having initialised and written nothing.
"""

from __future__ import annotations

import time

from absl import logging

from tpurun import errors
from tpurun.data_service import state
from tpurun.data_service.rpc import Servers
from tpurun.errors import EXIT_UNAVAILABLE, Unavailable
from tpurun.run_config.keys.service_keys import Service

POLL_SECONDS = 1.0


def wait_until_serving(service: Service, clock=time.monotonic, sleep=time.sleep) -> list[str]:
    """The workers that answer, once the dispatcher answers and lists one; Unavailable past
    `service.timeout`. A parallel_epochs service of several workers is warned of."""
    servers = Servers.of(service)
    deadline = clock() + service.timeout
    waiting = False
    try:
        while True:
            look = state.look(servers)
            if errors.sigterm_seen():  # one that gRPC's wait swallowed: the run stops, 75
                raise errors.StoppedBySigterm()
            if not look.silent and look.answering:
                _warn_of_copies(service, look.answering)
                return look.answering
            left = deadline - clock()
            if left <= 0:
                raise Unavailable(_not_serving(service, look))
            if not waiting:
                logging.info(
                    "Waiting up to %gs (config.data.service_timeout) for the tf.data service at "
                    "%s: %s.",
                    service.timeout,
                    service.target,
                    look.silent or "its dispatcher lists no worker that answers yet",
                )
                waiting = True
            sleep(min(POLL_SECONDS, left))
    finally:
        servers.close()


def _not_serving(service: Service, look: state.Look) -> str:
    waited = f"within {service.timeout:g}s (config.data.service_timeout)"
    if look.silent:
        problem = f"its dispatcher at {service.address} did not answer {waited} ({look.silent})"
        fix = (
            "start it (tpurun data-service dispatcher --port=PORT on the machine config.data."
            "service names) or correct config.data.service"
        )
    else:
        listed = (
            f"it lists {len(look.workers)}, none answering" if look.workers else "it lists none"
        )
        problem = (
            f"its dispatcher at {service.address} has no worker that answers {waited} ({listed})"
        )
        fix = f"start workers: tpurun data-service worker --dispatcher={service.address}"
    return (
        f"the tf.data service config.data.service={service.target} is not serving: {problem}; "
        f"{fix}. Nothing was started (exit {EXIT_UNAVAILABLE}: --max_restarts retries)"
    )


def _warn_of_copies(service: Service, answering: list[str]) -> None:
    if service.processing_mode != "parallel_epochs" or len(answering) < 2:
        return
    logging.warning(
        "config.data.service_processing_mode=parallel_epochs with %d workers: each runs the whole "
        "input_fn(train) with the same seed, so each batch comes %d times (in the order the "
        "workers answer) unless input_fn draws its randomness without params.seed; "
        "distributed_epoch shares each epoch between them instead.",
        len(answering),
        len(answering),
    )
