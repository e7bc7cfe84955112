"""The launcher's only uses of private TensorFlow API, each behind one small adapter.

Some things tpurun needs have no public TensorFlow API: the values a
`tf.distribute.CrossDeviceOps` takes and returns (for the packed all-reduce of
`tpurun.cluster.packed_reduction`), a registration deadline for the workers of a
MultiWorkerMirroredStrategy, the proto of the `checkpoint` state file (public
only through a deprecated helper), and a checkpoint's values copied to host memory
to be written by another thread (the background save). Each adapter falls back to
TensorFlow's stock behaviour when the private API moves (a slower all-reduce;
workers that wait as long as TensorFlow waits; a deprecation notice; saves the
loop waits for), and `missing()` names the ones that fell back:
tests/test_tf_internals.py asserts it is empty, so a TensorFlow upgrade that
moves them fails CI instead of silently degrading a run.

`tpurun.check.rules.introspection` does the same for `tpurun check`'s graph introspection.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import tensorflow as tf

try:  # PerReplica / Mirrored values and regroup: tf.distribute has no public constructor.
    from tensorflow.python.distribute import distribute_utils as _distribute_utils
    from tensorflow.python.distribute import values as _values
except ImportError:  # pragma: no cover - only when TensorFlow moved them
    _distribute_utils = _values = None  # type: ignore[assignment]

try:  # The `checkpoint` state file's proto (public only through a deprecated helper).
    from tensorflow.python.training import checkpoint_state_pb2 as _checkpoint_state
except ImportError:  # pragma: no cover
    _checkpoint_state = None  # type: ignore[assignment]

try:  # An object-based checkpoint's object graph, read from a reader already open.
    from tensorflow.core.protobuf import trackable_object_graph_pb2 as _object_graph
except ImportError:  # pragma: no cover
    _object_graph = None  # type: ignore[assignment]

try:  # A checkpoint's values in host memory, written by another thread (the background save).
    from tensorflow.python.checkpoint import checkpoint as _checkpoint
    from tensorflow.python.checkpoint import functional_saver as _functional_saver
    from tensorflow.python.training.saving import saveable_object as _saveable_object
except ImportError:  # pragma: no cover
    _checkpoint = _functional_saver = _saveable_object = None  # type: ignore[assignment]

try:  # A tf.data dataset's graph (no public API serializes it).
    from tensorflow.core.framework import graph_pb2 as _graph_pb2
except ImportError:  # pragma: no cover
    _graph_pb2 = None  # type: ignore[assignment]

try:  # The coordination service's configuration, set before MultiWorkerMirroredStrategy.
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2 as _coordination
    from tensorflow.python.distribute import multi_worker_util as _multi_worker_util
    from tensorflow.python.eager import context as _context
except ImportError:  # pragma: no cover
    _coordination = _multi_worker_util = _context = None  # type: ignore[assignment]

try:  # Whether op determinism is on: TensorFlow exports only the switch, not its state.
    from tensorflow.python.framework import config as _framework_config
except ImportError:  # pragma: no cover
    _framework_config = None  # type: ignore[assignment]


def missing() -> list[str]:
    """The adapters whose private API this TensorFlow lacks (each then falls back)."""
    absent = []
    if not distributed_values_available():
        absent.append("PerReplica/Mirrored values and regroup (the packed all-reduce)")
    if not coordination_service_available():
        absent.append("the coordination service's configuration (the bounded multi-worker start)")
    if _object_graph is None:
        absent.append("an object-based checkpoint's object graph (tpurun.foreign: read twice)")
    if not hasattr(_checkpoint_state, "CheckpointState"):
        absent.append("the CheckpointState proto (the state file's format)")
    if not host_copy_available():
        absent.append("a checkpoint's values gathered for another thread (the background save)")
    if not dataset_graph_available():
        absent.append("a tf.data dataset's graph (the tf.data service's pipeline check)")
    if not hasattr(_framework_config, "is_op_determinism_enabled"):
        absent.append("whether op determinism is on (read from TF_DETERMINISTIC_OPS instead)")
    return absent


def checkpoint_state_proto() -> Any:
    """An empty CheckpointState: the format of a model_dir's `checkpoint` state file.

    Fallback: the same class from TensorFlow's deprecated public helper (which then
    prints its deprecation notice once).
    """
    if hasattr(_checkpoint_state, "CheckpointState"):
        return _checkpoint_state.CheckpointState()
    proto = tf.compat.v1.train.generate_checkpoint_state_proto("/", "/ckpt-0")
    proto.Clear()
    return proto


class ObjectGraph(NamedTuple):
    """An object-based checkpoint's object graph: each node's children by name, the
    checkpoint keys of each node's values (a variable's: one), and the name each value was
    saved as (its `full_name`: a Keras variable's path), by key."""

    children: dict[int, dict[str, int]]
    keys: dict[int, list[str]]
    full_names: dict[str, str]


def object_graph(reader: Any, prefix: str) -> ObjectGraph:
    """The object graph of the checkpoint `prefix`, from the proto in the reader tpurun.foreign
    has open. Fallback: the public tf.train.CheckpointView (which reads the checkpoint's
    index again), each value's key made as TensorFlow makes it, from the node's first
    path from the root; no full names.
    """
    if _object_graph is not None:
        graph = _object_graph.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
        nodes = list(enumerate(graph.nodes))
        return ObjectGraph(
            children={i: {c.local_name: c.node_id for c in n.children} for i, n in nodes},
            keys={i: [a.checkpoint_key for a in n.attributes] for i, n in nodes},
            full_names={a.checkpoint_key: a.full_name for _, n in nodes for a in n.attributes},
        )
    view = tf.train.CheckpointView(prefix)
    children, paths, queue = {}, {0: ""}, [0]
    while queue:
        node = queue.pop(0)
        children[node] = dict(view.children(node))
        for name, child in children[node].items():
            if child not in paths:
                escaped = name.replace(".", ".S").replace("/", "..")
                paths[child] = f"{paths[node]}/{escaped}" if paths[node] else escaped
                queue.append(child)
    keys = {node: [f"{path}/.ATTRIBUTES/VARIABLE_VALUE"] for node, path in paths.items()}
    return ObjectGraph(children, keys, {})


def op_determinism_enabled() -> bool:
    """Whether TensorFlow's op determinism is on in this process: by
    `tf.config.experimental.enable_op_determinism()`, or by TF_DETERMINISTIC_OPS at import.

    Fallback: the environment variable alone, as TensorFlow reads it ("1" or "true"),
    which misses a call of the switch by the user's own code.
    """
    if hasattr(_framework_config, "is_op_determinism_enabled"):
        return bool(_framework_config.is_op_determinism_enabled())
    return os.environ.get("TF_DETERMINISTIC_OPS", "").strip().lower() in ("1", "true")


def set_op_determinism(enabled: bool) -> None:
    """Turns TensorFlow's op determinism on or off (off has no public API either; the
    fallback can only turn it on)."""
    if enabled:
        tf.config.experimental.enable_op_determinism()
    elif hasattr(_framework_config, "disable_op_determinism"):
        _framework_config.disable_op_determinism()


# --- Distributed values, for the packed all-reduce ----------------------------------


def distributed_values_available() -> bool:
    return (
        hasattr(_values, "PerReplica")
        and hasattr(_values, "Mirrored")
        and hasattr(_distribute_utils, "regroup")
    )


def is_per_replica(value: Any) -> bool:
    return _values is not None and isinstance(value, _values.PerReplica)


def per_replica(parts: list[tf.Tensor]) -> Any:
    """A PerReplica value of one tensor per replica, in replica order."""
    return _values.PerReplica(parts)


def mirrored(parts: list[tf.Tensor]) -> Any:
    """A Mirrored value of one (equal) tensor per replica, in replica order."""
    return _distribute_utils.regroup(parts, wrap_class=_values.Mirrored)


# --- The coordination service of a multi-worker cluster -----------------------------


def coordination_service_available() -> bool:
    return (
        hasattr(_coordination, "CoordinatedJob")
        and hasattr(_multi_worker_util, "coordination_leader")
        and hasattr(_context, "context")
        and hasattr(_context.context(), "configure_coordination_service")
    )


def bound_worker_registration(cluster_spec: tf.train.ClusterSpec, timeout_seconds: float) -> str:
    """Makes the workers of `cluster_spec` wait for each other at most `timeout_seconds`.

    By default TensorFlow waits for missing workers forever. MultiWorkerMirroredStrategy
    sets up the coordination service only when none is configured yet, so this
    configures the same one (its leader and jobs) with a registration deadline,
    and a registration barrier: without it the chief registers alone and then
    waits in its first collective, which has no deadline. Returns "" on success,
    else why it could not (the caller warns; workers then wait as TensorFlow does).
    """
    if not coordination_service_available():
        return "this TensorFlow has no coordination-service configuration"
    try:
        jobs = [
            _coordination.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker")
            if job in cluster_spec.jobs
        ]
        _context.context().configure_coordination_service(
            service_type="standalone",
            service_leader=_multi_worker_util.coordination_leader(cluster_spec),
            coordinated_jobs=jobs,
            cluster_register_timeout_in_ms=int(timeout_seconds * 1000),
        )
        _context.context().coordination_service.cluster_register_with_barrier = True
    except (AttributeError, TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return ""


# --- A checkpoint copied to host memory, written by another thread --------------------


def host_copy_available() -> bool:
    return (
        hasattr(getattr(_checkpoint, "TrackableSaver", None), "_gather_serialized_tensors")
        and hasattr(_functional_saver, "MultiDeviceSaver")
        and hasattr(_saveable_object, "SaveSpec")
    )


def host_copy(checkpoint: tf.train.Checkpoint) -> Any | None:
    """What `checkpoint.write` would save, read now into host memory: for `write_host_copy`.

    TensorFlow's save gathers every object's tensors (a variable's as a read
    still to be made), then writes them. Here the reads are made at once: a
    variable on a TPU is copied to the host, one on the CPU keeps the buffer it has
    now (an update after this copies it first, as TensorFlow does for any buffer
    still read). None when this TensorFlow lacks the private API, or an object
    saves itself (a registered saver): then the checkpoint is written as usual.
    """
    saver = getattr(checkpoint, "_saver", None)
    if not host_copy_available() or saver is None:
        return None
    tensors, _, registered_savers, _ = saver._gather_serialized_tensors(None)
    if registered_savers:
        return None
    for values in tensors.values():
        for key, value in values.items():
            if isinstance(value, dict):  # {slice_spec: tensor} of a partitioned value
                values[key] = {spec: _read(part) for spec, part in value.items()}
            else:
                values[key] = _read(value)
    if _context is not None:
        _context.async_wait()  # the copies are made before training goes on
    return tensors


def _read(value: Any) -> Any:
    """A tensor to save: a SaveSpec's (a variable's value, read now), or the value itself."""
    return value.tensor if isinstance(value, _saveable_object.SaveSpec) else value


def host_copy_devices(copy: Any) -> set[str]:
    """The devices a `host_copy`'s tensors are on (where their save would run)."""
    devices = set()
    for values in copy.values():
        for value in values.values():
            for tensor in value.values() if isinstance(value, dict) else [value]:
                devices.add(getattr(tensor, "device", "") or "")
    return devices


def write_host_copy(copy: Any, prefix: str) -> None:
    """Writes a `host_copy` as the checkpoint `prefix`, from any thread, as `Checkpoint.write`
    does: the tensors into `<prefix>_temp/`, then merged into `<prefix>.index` and `.data-*`."""
    _functional_saver.MultiDeviceSaver(copy).save(prefix)


# --- A tf.data dataset's graph, for the tf.data service ------------------------------


def dataset_graph_available() -> bool:
    return hasattr(tf.data.Dataset, "_as_serialized_graph") and hasattr(_graph_pb2, "GraphDef")


def dataset_ops(dataset: tf.data.Dataset) -> set[str] | None:
    """The op types of `dataset`'s graph, every function of its library included (the
    functions of its maps, interleaves and generators): what a tf.data service worker
    would run. None when this TensorFlow cannot serialize it (then nothing is checked)."""
    if not dataset_graph_available() or not tf.executing_eagerly():
        return None
    ignore = tf.data.experimental.ExternalStatePolicy.IGNORE  # stateful ops are what we look for
    serialized = dataset._as_serialized_graph(external_state_policy=ignore)
    graph = _graph_pb2.GraphDef.FromString(serialized.numpy())
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops
