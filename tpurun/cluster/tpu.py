"""The Cloud TPU path: find the TPU, check it is usable, connect, initialise, build a TPUStrategy.

`--tpu` (else TPU_NAME) names the TPU in one of three ways:

* a name, with --tpu_zone and --gcp_project: tpurun first reads the node from the
  Cloud TPU API itself, so a TPU that does not exist, is not READY or cannot be read
  fails at once with its state and the fix; TPUClusterResolver (cloud-tpu-client)
  then turns the name into the grpc:// addresses of its workers.
* grpc://HOST:PORT: a TPU worker's address, used as is (no API call).
* local: the TPU chips of this TPU VM.

Zone and project are never guessed: cloud-tpu-client would ask the GCE metadata
server, which off GCE means waiting on an address that never answers. Connecting
to an unreachable worker blocks forever in TF 2.21, so the API lookup, connecting
and initialising share one deadline, --tpu_init_timeout.

The Cloud TPU API itself (and its environment variables) is `tpurun.cluster.tpu_api`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import tensorflow as tf
from absl import logging

from tpurun.cluster import tpu_api
from tpurun.cluster.machines import Cluster, tpu_vm_detected
from tpurun.errors import RunError, UsageError
from tpurun.errors.tf_errors import first_line, one_line
from tpurun.run_config import RunConfig, refuse_local_paths_on_a_tpu_node
from tpurun.tpu_vm import installed
from tpurun.tpu_vm.devices import tpu_device_files

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class _Target:
    """What `connect` knows about the TPU, for its log line and its error messages."""

    where: str  # "the TPU 'x' (v3-8, grpc://10.0.0.2:8470)", for messages
    kind: str  # "name", "grpc" or "local"
    version_note: str | None = None  # set when the TPU's TensorFlow is not ours
    health_note: str | None = None  # set when a READY node reports bad health
    accelerator: str | None = None


def connect(run: RunConfig) -> Cluster:
    """Finds, connects to and initialises the TPU of `run`; returns its TPUStrategy.

    Every failure is a RunError (UsageError for a bad --tpu) naming what was tried
    and what to do; nothing waits longer than --tpu_init_timeout in total.
    """
    deadline = time.monotonic() + run.tpu_init_timeout
    resolver, target = _resolve(run, deadline)
    if target.kind == "name":
        refuse_local_paths_on_a_tpu_node(run, resolver.master())

    _step(run, target, deadline, "connecting to", lambda: _connect(resolver))
    if target.kind != "local":
        # What experimental_connect_to_cluster does by default, but in this thread:
        # ops outside the strategy run on the first TPU worker's host.
        tf.device(f"/job:{resolver.task_type}/replica:0/task:{resolver.task_id}").__enter__()
    _step(
        run,
        target,
        deadline,
        "initialising",
        lambda: tf.tpu.experimental.initialize_tpu_system(resolver),
    )
    try:
        strategy = tf.distribute.TPUStrategy(resolver)
    except Exception as e:  # noqa: BLE001 - mapped to one message with the fix
        raise _failure(run, "creating the TPUStrategy for", target, e) from None
    kind = f"{target.accelerator}, " if target.accelerator else ""
    description = (
        f"TPU {run.tpu or 'local'} ({kind}{strategy.num_replicas_in_sync} cores, TPUStrategy)"
    )
    logging.info("Running on %s.", description)
    return Cluster(strategy, description, is_tpu=True)


def _connect(resolver: tf.distribute.cluster_resolver.TPUClusterResolver) -> None:
    # make_master_device_default=False: by default TF enters the master's device
    # scope, which is thread-local and would end with this thread; connect()
    # enters it in its own. The connection itself is lazy: it is made (or hangs,
    # for an unreachable worker) when the eager context initialises, so that
    # happens here too, under the timeout.
    tf.config.experimental_connect_to_cluster(resolver, make_master_device_default=False)
    tf.config.list_logical_devices()


def resolve(run: RunConfig) -> tf.distribute.cluster_resolver.TPUClusterResolver:
    """The TPUClusterResolver for `run`'s TPU; for a name, only once the node is READY.

    Waits at most --tpu_init_timeout for the Cloud TPU API; does not connect.
    """
    return _resolve(run, time.monotonic() + run.tpu_init_timeout)[0]


def _resolve(
    run: RunConfig, deadline: float
) -> tuple[tf.distribute.cluster_resolver.TPUClusterResolver, _Target]:
    name = run.tpu
    if not name:
        if not tpu_vm_detected():
            raise RunError(
                "--use_tpu=true but no TPU is configured or detected: pass --tpu=NAME with "
                "--tpu_zone and --gcp_project, --tpu=grpc://HOST:8470, or --tpu=local on a "
                "TPU VM (or set TPU_NAME); --use_tpu=false runs locally"
            )
        name = "local"
    TPUClusterResolver = tf.distribute.cluster_resolver.TPUClusterResolver
    if name == "local":
        return TPUClusterResolver(tpu="local"), _Target("the TPU of this TPU VM", "local")
    if name.startswith("grpc://"):
        if not re.fullmatch(r"grpc://[^/:\s]+(:\d+)?", name):
            raise UsageError(
                f"--tpu={name} is not a grpc://HOST:PORT address, e.g. grpc://10.0.0.2:8470"
            )
        return TPUClusterResolver(tpu=name), _Target(f"the TPU worker at {name}", "grpc")
    if not (run.tpu_zone and run.gcp_project):
        raise UsageError(
            f"--tpu={name} is a TPU name: pass --tpu_zone and --gcp_project too "
            "(tpurun does not wait on the metadata server to guess them)"
        )
    return _resolve_named(run, name, deadline)


def _resolve_named(
    run: RunConfig, name: str, deadline: float
) -> tuple[tf.distribute.cluster_resolver.TPUClusterResolver, _Target]:
    """A TPU by its name: found in the Cloud TPU API, READY, with its workers' addresses."""
    discovery_url = os.environ.get(tpu_api.DISCOVERY_URL_ENV) or None
    credentials = tpu_api.credentials(run)
    node = _within(
        deadline,
        lambda: tpu_api.get_node(run, credentials, discovery_url),
        timeout=lambda: RunError(
            f"gave up after --tpu_init_timeout={run.tpu_init_timeout:g}s looking up the TPU "
            f"{name!r} in the Cloud TPU API ({tpu_api.api_host(discovery_url)}): check this "
            "machine's network access to it"
        ),
    )
    state = node.get("state") or "STATE_UNSPECIFIED"
    if state != "READY":
        raise RunError(tpu_api.state_message(run, state, node.get("healthDescription")))
    endpoints = tpu_api.endpoints(node)
    if not endpoints:
        raise RunError(
            f"the TPU {name!r} (project {run.gcp_project}, zone {run.tpu_zone}) is READY but "
            "the Cloud TPU API lists no worker addresses for it; if it is a TPU VM, run tpurun "
            "on the TPU VM itself with --tpu=local"
        )
    target = _named_target(run, name, node, endpoints)
    for note in (target.version_note, target.health_note):
        if note:
            logging.warning("%s", note)
    logging.info(
        "Found %s: READY%s.", target.where, f", {node['health']}" if node.get("health") else ""
    )
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=name,
        zone=run.tpu_zone,
        project=run.gcp_project,
        credentials=credentials,
        discovery_url=discovery_url,
    )
    return resolver, target


def _named_target(run: RunConfig, name: str, node: dict, endpoints: list[str]) -> _Target:
    """What a TPU found by name is (its type, TensorFlow, addresses), as lines name it."""
    accelerator = node.get("acceleratorType")
    address = f"grpc://{endpoints[0]}" + (
        f" +{len(endpoints) - 1} workers" if len(endpoints) > 1 else ""
    )
    details = ", ".join(
        x
        for x in (
            accelerator,
            f"TensorFlow {node.get('tensorflowVersion')}"
            if node.get("tensorflowVersion")
            else None,
            address,
        )
        if x
    )
    return _Target(
        where=f"the TPU {name!r} ({details})",
        kind="name",
        version_note=tpu_api.version_note(node.get("tensorflowVersion"), run),
        health_note=tpu_api.health_note(node),
        accelerator=accelerator,
    )


# --- Connecting and initialising ----------------------------------------------------


def _step(
    run: RunConfig, target: _Target, deadline: float, step: str, action: Callable[[], object]
) -> None:
    """One step of reaching the TPU; its hang or failure becomes a RunError."""

    def timed_out() -> RunError:
        return RunError(
            f"gave up after --tpu_init_timeout={run.tpu_init_timeout:g}s {step} "
            f"{target.where}: {_hint(target, waited=True)}"
        )

    try:
        _within(deadline, action, timeout=timed_out)
    except RunError:
        raise
    except Exception as e:  # noqa: BLE001 - mapped to one message with the fix
        raise _failure(run, step, target, e) from None


def _failure(run: RunConfig, step: str, target: _Target, e: BaseException) -> RunError:
    text = one_line(e)
    # cloud-tpu-client reads the node again on every cluster_spec(): it may have
    # changed state, or vanished, since _resolve looked.
    not_ready = re.search(r'is not yet ready; state: "(\w+)"', text)
    if not_ready:
        return RunError(tpu_api.state_message(run, not_ready.group(1), None))
    if isinstance(e, ValueError) and "Could not lookup TPU metadata" in text:
        cause = e.__context__
        if cause is not None and hasattr(cause, "resp") and hasattr(cause, "content"):
            return RunError(tpu_api.http_error_message(run, cause))  # a googleapiclient HttpError
        return RunError(
            tpu_api.api_unreachable(run, os.environ.get(tpu_api.DISCOVERY_URL_ENV), cause or e)
        )
    if target.kind == "local" and "ConfigureDistributedTPU" in text and "No OpKernel" in text:
        detail = "this TensorFlow has no TPU support (no TPU kernels are registered)"
    else:
        detail = f"{type(e).__name__}: {first_line(text)}"
    return RunError(f"{step} {target.where} failed ({detail}): {_hint(target, waited=False)}")


def _hint(target: _Target, waited: bool) -> str:
    """What to check, most likely cause first."""
    if target.kind == "local":
        return _local_hint()
    notes = [n for n in (target.version_note, target.health_note) if n]
    checks = []
    if waited:
        checks.append(
            "check that this VM can reach the TPU's workers on port 8470 (same VPC network, "
            "firewall)"
        )
    if target.kind == "grpc":
        checks.append(
            "check the address, that the TPU is READY (`gcloud compute tpus list`) and that it "
            f"runs TensorFlow {tf.__version__} like this machine"
        )
    elif not notes:
        checks.append(f"check that the TPU runs TensorFlow {tf.__version__} like this machine")
    if waited:
        checks.append("a large pod may need a longer --tpu_init_timeout")
    return "; ".join(notes + checks)


def _local_hint() -> str:
    if not tpu_device_files():
        return (
            "this machine has no TPU chips (no /dev/accel* or /dev/vfio/*): --tpu=local works "
            "only on a Cloud TPU VM; use --tpu=NAME for a TPU node, or --use_tpu=false"
        )
    libtpu = installed.version("libtpu") or installed.version("libtpu-nightly") or "not installed"
    return (
        f"TensorFlow {tf.__version__} and libtpu ({libtpu}) must be a matched pair: install "
        f"the pair tpurun is tested with (`{installed.install_line()}`); if another process "
        "holds the TPU, stop it (`sudo lsof -w /dev/accel* /dev/vfio/*`)"
    )


def _within(deadline: float, action: Callable[[], _T], timeout: Callable[[], RunError]) -> _T:
    """Runs `action` in a daemon thread until `deadline`: its result, its exception, or timeout().

    A daemon thread, because a hung gRPC connect cannot be cancelled: the process
    exits without it. Checked with TF 2.21: a process whose connect is still hung
    exits as promptly as after any other error, so no os._exit is needed.
    """
    result: list[_T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(action())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(e)

    thread = threading.Thread(target=target, daemon=True, name="tpurun-tpu-init")
    thread.start()
    remaining = deadline - time.monotonic()
    thread.join(max(0.0, remaining) if remaining != float("inf") else None)
    if thread.is_alive():
        raise timeout()
    if failure:
        raise failure[0]
    return result[0]
