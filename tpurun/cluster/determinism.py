"""config.train.deterministic applied to TensorFlow for one train run (`tpurun.run_config.keys.determinism`
decides it and says what it means for a resume).

Deterministic kernels are two process-wide switches: TensorFlow's op determinism
(`tf.config.experimental.enable_op_determinism`: deterministic GPU kernels, tf.data's
order and its stateful maps run serially, random ops that need a seed) and Grappler's
arithmetic optimizer turned off (it rewrote the optimizer's updates differently from one
process to the next: docs/checkpoints.md). Both act on what TensorFlow builds after them,
so they are set once the platform is known and before the run builds its first function;
both are put back as they were when the run ends (an in-process run, a test, leaves the
process as it found it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf
from absl import logging

from tpurun import tf_internals
from tpurun.cluster import Cluster, tpu_vm_detected
from tpurun.run_config import RunConfig
from tpurun.run_config.keys.determinism import CPU, GPU, TPU, Determinism, decide
from tpurun.run_config.keys.service_keys import service

# The Grappler pass a deterministic run turns off (tf.config.optimizer's option name).
ARITHMETIC = "arithmetic_optimization"


def platform(cluster: Cluster) -> str:
    """TPU, GPU or CPU: what a train run's replicas run on."""
    return TPU if cluster.is_tpu else cluster.replica_kind


def of_run(run: RunConfig, cluster: Cluster) -> Determinism:
    """The kernels `run` trains with on `cluster` (nothing is set yet)."""
    already = tf_internals.op_determinism_enabled()
    served = service(run.config) is not None
    return decide(run.config.train.deterministic, platform(cluster), already, served)


def check_lines(run: RunConfig) -> list[str]:
    """What `tpurun check` says of a resume of `run`'s training, as `tpurun train` says it at
    its start: on a TPU, and on this machine when it trains on its GPU or CPU."""
    choice, served = run.config.train.deterministic, service(run.config) is not None
    lines = [decide(choice, TPU, served_input=served).line("on a TPU")]
    if not tpu_vm_detected():
        here = GPU if tf.config.list_physical_devices("GPU") else CPU
        local = decide(choice, here, tf_internals.op_determinism_enabled(), served)
        lines.append(local.line(f"on this machine's {here}"))
    return lines


@contextlib.contextmanager
def applied(kernels: Determinism) -> Iterator[Determinism]:
    """TensorFlow set up for `kernels` while the run lasts, its start line logged."""
    was_on = tf_internals.op_determinism_enabled()
    options = tf.config.optimizer.get_experimental_options()
    if kernels.deterministic:
        tf_internals.set_op_determinism(True)
        tf.config.optimizer.set_experimental_options({ARITHMETIC: False})
    logging.info("%s", kernels.line())
    if kernels.platform == TPU and kernels.op_determinism:
        logging.warning(
            "TensorFlow's op determinism is on for a TPU run, which needs none (XLA's TPU "
            "programs are deterministic): the input wait is then timed by this machine's "
            "clock, a round trip from a TPU node's host every step; set "
            "config.train.deterministic to 'auto' or false (and unset TF_DETERMINISTIC_OPS)"
        )
    try:
        yield kernels
    finally:
        if kernels.deterministic:
            tf_internals.set_op_determinism(was_on)
            # Absent: Grappler's default, which runs it.
            tf.config.optimizer.set_experimental_options(
                {ARITHMETIC: options.get(ARITHMETIC, True)}
            )
