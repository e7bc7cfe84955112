"""Every private Keras and TensorFlow detail `tpurun check` relies on, behind small adapters.

* which Keras layer opened a TF name scope while tracing (`LayerScopes`: Keras's
  TF-backend `name_scope` class), for findings that name the user's layer;
* Keras's automatic layer-name counters (`KerasNames`), so each of check's builds
  names its layers as a real run does;
* every layer of a model, nested models and layers kept as attributes of a custom
  layer included (`all_layers`: Keras's `_flatten_layers`);
* whether an op type has an XLA kernel (TensorFlow's kernel registry);
* the function graphs an op calls (a FuncGraph's `_get_function`);
* XLA's `HloProto` message, in which a compiled step's buffer assignment is read
  (`hlo_proto_class`: TensorFlow ships it as a private module).

Each falls back to a weaker answer when its private API moves (no layer names in
messages; unknown kernels left to the XLA compile; the message class looked up by
its proto name), and `missing()` names the ones
that fell back: tests/test_tf_internals.py asserts it is empty, so a Keras or
TensorFlow upgrade that moves them fails CI instead of silently weakening check.
"""

from __future__ import annotations

import collections
import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

try:  # Keras's TF-backend name scope: where a layer's ops get their scope.
    from keras.src.backend.tensorflow import core as _keras_tf_core
except ImportError:  # pragma: no cover - only when Keras moved it
    _keras_tf_core = None  # type: ignore[assignment]
try:  # Keras's global state, which holds the automatic layer-name counters.
    from keras.src.backend.common import global_state as _global_state
except ImportError:  # pragma: no cover
    _global_state = None  # type: ignore[assignment]
try:  # TensorFlow's kernel registry: which devices have a kernel for an op.
    from tensorflow.python.framework import kernels as _kernels
except ImportError:  # pragma: no cover
    _kernels = None  # type: ignore[assignment]

try:  # XLA's HloProto (optimized HLO and its buffer assignment), generated privately in TF.
    from tensorflow.compiler.xla.service import hlo_pb2 as _hlo_pb2
except ImportError:  # pragma: no cover
    _hlo_pb2 = None  # type: ignore[assignment]

_REPLICA_PREFIX = re.compile(r"(^|/)replica_\d+/")


def missing() -> list[str]:
    """The adapters whose private API this Keras/TensorFlow lacks (each then falls back)."""
    absent = []
    if _keras_name_scope_class() is None:
        absent.append("Keras's TF name_scope class (layer names in findings)")
    if _global_state is None or not hasattr(_global_state, "get_global_attribute"):
        absent.append("Keras's global state (layer-name counters)")
    if _kernels is None or not hasattr(_kernels, "get_registered_kernels_for_op"):
        absent.append("TensorFlow's kernel registry (ops without an XLA kernel)")
    if not hasattr(keras.layers.Layer, "_flatten_layers"):
        absent.append("Keras's Layer._flatten_layers (layers inside custom layers)")
    if not hasattr(tf.Graph(), "_get_function"):
        absent.append("Graph._get_function (ops inside nested functions)")
    if getattr(_hlo_pb2, "HloProto", None) is None:
        absent.append("XLA's hlo_pb2.HloProto (the memory estimate of --target)")
    return absent


# --- Layer names ---------------------------------------------------------------------


class LayerScopes:
    """Maps the TF name scopes Keras opens while tracing to the layers that opened them.

    TF makes scope names unique (a layer `dense` may trace as `dense_1`), so the
    layer of an op cannot be read off its name reliably; this records it instead.
    """

    def __init__(self) -> None:
        self.layers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._depth = 0
        self._original: Any = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        scope_class = _keras_name_scope_class()
        if scope_class is None:
            yield
            return
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self.layers.clear()  # one traced graph at a time
                self._original = scope_class.__enter__
                original, layers = self._original, self.layers

                def enter(scope: Any) -> Any:
                    result = original(scope)
                    caller = getattr(scope, "caller", None)
                    if getattr(scope, "_pop_on_exit", False) and isinstance(
                        caller, keras.layers.Layer
                    ):
                        current = tf.get_current_name_scope()
                        if current:
                            layers[current] = caller.name
                    return result

                scope_class.__enter__ = enter
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    scope_class.__enter__ = self._original

    def layer_of(self, op_name: str) -> str | None:
        """The innermost Keras layer whose scope contains `op_name`, if any."""
        name = _REPLICA_PREFIX.sub(r"\1", op_name)
        parts = name.split("/")
        candidates = [parts]
        if parts[0] in ("gradient_tape", "gradients"):
            candidates.append(parts[1:])
        for parts in candidates:
            for end in range(len(parts) - 1, 0, -1):
                layer = self.layers.get("/".join(parts[:end]))
                if layer is not None:
                    return layer
        return None


def _keras_name_scope_class() -> Any:
    scope = getattr(_keras_tf_core, "name_scope", None)
    return scope if isinstance(scope, type) and hasattr(scope, "__enter__") else None


class KerasNames:
    """Resets Keras's automatic layer-name counters before each build.

    `check` builds the model six times (train, eval and predict, on the replicas and
    for the XLA compile); with the counters reset, each build names its layers as a
    real run does (dense, dense_1, ...), so findings name the layers the user knows.
    Keras keeps the counters in private state; without it, only names in messages change.
    """

    _KEY = "object_name_uids"  # keras.src.utils.naming

    def __init__(self) -> None:
        uids = _global_state.get_global_attribute(self._KEY) if _global_state else None
        self._initial = dict(uids) if isinstance(uids, dict) else {}

    def reset(self) -> None:
        if _global_state is not None:
            _global_state.set_global_attribute(
                self._KEY, collections.defaultdict(int, self._initial)
            )


def all_layers(model: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer of `model` (itself included), nested models and the layers a custom
    layer keeps as attributes included, each once.

    Keras's own walk (`_flatten_layers`, what `Model.summary` uses) sees the layers a
    layer tracks; without it, `Model.layers`, recursively, sees those of (nested)
    models only.
    """
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    found: list[keras.layers.Layer] = []
    pending = [model]
    while pending:
        layer = pending.pop(0)
        if any(layer is seen for seen in found):
            continue
        found.append(layer)
        pending.extend(getattr(layer, "layers", None) or [])
    return found


# --- Kernels and nested functions -------------------------------------------------------

_XLA_DEVICE = "XLA_CPU_JIT"
_kernel_cache: dict[str, bool] = {}


def has_xla_kernel(op_type: str) -> bool:
    """Whether XLA can compile `op_type` (True when unknown: the XLA compile then decides)."""
    if op_type not in _kernel_cache:
        try:
            registered = _kernels.get_registered_kernels_for_op(op_type).kernel
            _kernel_cache[op_type] = any(k.device_type == _XLA_DEVICE for k in registered)
        except Exception:  # noqa: BLE001 - unknown: let the XLA compile decide
            _kernel_cache[op_type] = True
    return _kernel_cache[op_type]


_stateful_cache: dict[str, bool] = {}


def is_stateful(op: tf.Operation) -> bool:
    """Whether the op has side effects or randomness (its OpDef says so), by op type."""
    if op.type not in _stateful_cache:
        _stateful_cache[op.type] = op.op_def.is_stateful
    return _stateful_cache[op.type]


def nested_graphs(op: tf.Operation) -> Iterator[tf.Graph]:
    """The FuncGraphs an op calls: while cond/body, cond branches, inner tf.functions."""
    seen = set()
    for attr in op.node_def.attr.values():
        names = [attr.func.name] if attr.HasField("func") else []
        if attr.HasField("list"):
            names += [f.name for f in attr.list.func]
        for name in names:
            if not name or name in seen:
                continue
            seen.add(name)
            graph = _function_graph(op.graph, name)
            if graph is not None:
                yield graph


def _function_graph(graph: tf.Graph, name: str) -> tf.Graph | None:
    """The graph of function `name`, looked up from `graph` outwards (private `_get_function`)."""
    while graph is not None:
        get = getattr(graph, "_get_function", None)
        function = get(name) if get else None
        if function is not None:
            return getattr(function, "graph", None)
        graph = getattr(graph, "outer_graph", None)
    return None


# --- XLA's compiled programs -------------------------------------------------------------


def hlo_proto_class() -> Any:
    """XLA's HloProto message class, or None when this TensorFlow has none to find.

    TF 2.20/2.21 generate it as tensorflow.compiler.xla.service.hlo_pb2. If that
    module moves, the message may still be registered under its proto name,
    "xla.HloProto", by TensorFlow's other protos.
    """
    proto = getattr(_hlo_pb2, "HloProto", None)
    if proto is not None:
        return proto
    try:
        from google.protobuf import descriptor_pool, message_factory

        descriptor = descriptor_pool.Default().FindMessageTypeByName("xla.HloProto")
        return message_factory.GetMessageClass(descriptor)
    except (KeyError, ImportError, AttributeError):
        return None


def hlo_module_proto_class() -> Any:
    """XLA's HloModuleProto message class (a step's unoptimized program), or None."""
    proto = getattr(_hlo_pb2, "HloModuleProto", None)
    if proto is not None:
        return proto
    try:
        from google.protobuf import descriptor_pool, message_factory

        descriptor = descriptor_pool.Default().FindMessageTypeByName("xla.HloModuleProto")
        return message_factory.GetMessageClass(descriptor)
    except (KeyError, ImportError, AttributeError):
        return None
