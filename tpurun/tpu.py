"""The Cloud TPU path: resolve the TPU, connect, initialise, build a TPUStrategy."""

from __future__ import annotations

import threading
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from tpurun.cluster import Cluster, tpu_vm_detected
from tpurun.errors import RunError, UsageError
from tpurun.run_config import RunConfig

# Connecting to an unreachable grpc:// address blocks forever in TF 2.21.
INIT_TIMEOUT_SECS = 300


def connect(run: RunConfig) -> Cluster:
    name = run.tpu
    if not name:
        if not tpu_vm_detected():
            raise RunError(
                "--use_tpu=true but no TPU is configured or detected: pass --tpu=NAME with "
                "--tpu_zone and --gcp_project, --tpu=grpc://HOST:8470, or --tpu=local on a "
                "TPU VM (or set TPU_NAME); --use_tpu=false runs locally"
            )
        name = "local"
    is_name = name != "local" and not name.startswith("grpc://")
    if is_name and not (run.tpu_zone and run.gcp_project):
        raise UsageError(
            f"--tpu={name} is a TPU name: pass --tpu_zone and --gcp_project too "
            "(tpurun does not wait on the metadata server to guess them)"
        )
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=name, zone=run.tpu_zone, project=run.gcp_project
        )
    except Exception as e:  # noqa: BLE001 - the resolver raises many kinds; all mean "not found"
        raise RunError(f"cannot resolve the TPU {name!r}: {' '.join(str(e).split())}") from None
    _within(INIT_TIMEOUT_SECS, f"connecting to the TPU {name!r}",
            lambda: tf.config.experimental_connect_to_cluster(resolver))
    _within(INIT_TIMEOUT_SECS, f"initialising the TPU {name!r}",
            lambda: tf.tpu.experimental.initialize_tpu_system(resolver))
    strategy = tf.distribute.TPUStrategy(resolver)
    description = f"TPU {name} ({strategy.num_replicas_in_sync} cores, TPUStrategy)"
    logging.info("Running on %s.", description)
    return Cluster(strategy, description, is_tpu=True)


def _within(seconds: float, what: str, action: Callable[[], object]) -> None:
    """Runs `action` in a thread; a hang past `seconds` becomes a RunError."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            action()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(e)

    thread = threading.Thread(target=target, daemon=True, name=what)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise RunError(
            f"timed out after {seconds:.0f}s {what}: check that the TPU is READY "
            "(gcloud compute tpus list), that this VM can reach it, and the TF version matches"
        )
    if failure:
        raise RunError(f"failed {what}: {' '.join(str(failure[0]).split())}") from None
