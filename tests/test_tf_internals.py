"""The private TensorFlow and Keras API tpurun uses is still where it expects it.

Each adapter (tpurun.tf_internals for the launcher, tpurun.check.rules.introspection for
`tpurun check`, tpurun.optimization for the recipes' Keras internals) falls back to a weaker behaviour when its private API moves; these
tests fail instead, so a TensorFlow or Keras upgrade that moves one shows up in CI
rather than as a slower all-reduce, a multi-worker start without a deadline, or
findings without layer names.
"""

from __future__ import annotations

import tensorflow as tf

from tpurun import optimization, tf_internals
from tpurun.check.rules import introspection
from tpurun.cluster import packed_reduction


def test_no_launcher_adapter_falls_back():
    assert tf_internals.missing() == []


def test_no_check_adapter_falls_back():
    assert introspection.missing() == []


def test_the_keras_optimizer_internals_the_recipes_extend_are_there():
    assert optimization.missing() == []


def test_packed_reduction_is_used_when_its_private_api_is_there():
    assert isinstance(
        packed_reduction.cross_device_ops(), packed_reduction.PackedReductionToOneDevice
    )


def test_distributed_values_round_trip():
    parts = [tf.constant([1.0, 2.0]), tf.constant([1.0, 2.0])]
    assert tf_internals.is_per_replica(tf_internals.per_replica(parts))
    assert not tf_internals.is_per_replica(parts[0])
    assert [v.numpy().tolist() for v in tf_internals.mirrored(parts).values] == [[1, 2], [1, 2]]


def test_an_op_knows_whether_it_is_stateful():
    graph = (
        tf.function(lambda x: (x + 1.0, tf.random.uniform([2])))
        .get_concrete_function(tf.TensorSpec([2]))
        .graph
    )
    ops = {op.type: op for op in graph.get_operations()}
    assert not introspection.is_stateful(ops["AddV2"])
    assert introspection.is_stateful(ops["RandomUniform"])


def test_kernel_registry_knows_xla_kernels():
    from tpurun.check.rules.xla import populate_xla_registry

    populate_xla_registry()
    assert introspection.has_xla_kernel("MatMul")
    assert not introspection.has_xla_kernel("EagerPyFunc")


def test_nested_graphs_are_found():
    def loop(x):
        return tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0), [0, x])[1]

    graph = tf.function(loop).get_concrete_function(tf.TensorSpec([2])).graph
    (while_op,) = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    assert len(list(introspection.nested_graphs(while_op))) == 2  # cond and body


def test_a_moved_private_api_is_named_and_falls_back(monkeypatch):
    monkeypatch.setattr(tf_internals, "_values", None)
    assert tf_internals.missing() == [
        "PerReplica/Mirrored values and regroup (the packed all-reduce)"
    ]
    assert type(packed_reduction.cross_device_ops()) is tf.distribute.ReductionToOneDevice
    monkeypatch.setattr(introspection, "_kernels", None)
    assert introspection.missing() == ["TensorFlow's kernel registry (ops without an XLA kernel)"]
    assert introspection.has_xla_kernel("SomeOpNeverCached")  # unknown: the compile decides


def test_the_hlo_proto_is_found_and_falls_back_to_its_proto_name(monkeypatch):
    proto = introspection.hlo_proto_class()
    assert proto is not None and proto.DESCRIPTOR.full_name == "xla.HloProto"
    monkeypatch.setattr(introspection, "_hlo_pb2", None)
    assert introspection.missing() == ["XLA's hlo_pb2.HloProto (the memory estimate of --target)"]
    # Registered under its proto name once imported: the fallback finds the same message.
    assert introspection.hlo_proto_class().DESCRIPTOR.full_name == "xla.HloProto"


def test_autograph_maps_an_error_back_to_the_users_source():
    """tpurun.errors.user_code reads AutoGraph's `ag_error_metadata.translated_stack` to name
    the user's file:line of an error in a traced step (else the traceback's temporary files)."""
    from test_user_code import traced_error

    stack = traced_error().ag_error_metadata.translated_stack
    assert any(frame.filename.endswith("test_user_code.py") for frame in stack)
    assert all(isinstance(frame.lineno, int) for frame in stack)
