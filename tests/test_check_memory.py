"""tpurun.check.sizing.memory: a training step's buffers by category, and TPU padding.

The steps are written as the Trainer's `_replica_step`: a GradientTape, the
optimizer built beforehand, `apply_gradients` inside a tf.function.
"""

from __future__ import annotations

import resource

import keras
import pytest
import tensorflow as tf
from conftest import needs_xla_cpu
from tpurun.models.flops import MatmulChain

from tpurun.check.sizing import buffers
from tpurun.check.sizing import memory as me

F32 = 4


pytestmark = needs_xla_cpu  # each estimate is XLA's compile for the CPU


def train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss_fn):
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            loss = tf.nn.compute_average_loss(loss_fn(labels, outputs), global_batch_size=64)
        variables = model.trainable_variables
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return loss

    return step


def squared_error(labels, outputs):
    return tf.reduce_mean(tf.square(outputs - labels), axis=-1)


def cross_entropy(labels, logits):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def mlp(hidden: int = 512) -> keras.Model:
    inputs = keras.Input((784,))
    hidden_layer = keras.layers.Dense(hidden, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(10)(hidden_layer))


def mlp_estimate(model, optimizer, batch: int) -> me.MemoryEstimate:
    step = train_step(model, optimizer, cross_entropy)
    specs = (tf.TensorSpec([batch, 784], tf.float32), tf.TensorSpec([batch], tf.int32))
    return me.estimate(
        step, specs, weights=model.variables, optimizer_variables=optimizer.variables
    )


@pytest.fixture(scope="module")
def adam_mlp():
    """An MLP and its Adam, shared: an estimate builds neither anew (`optimizer.build` of a
    built optimizer keeps its slots), and each test compiles its own steps."""
    model = mlp()
    return model, keras.optimizers.Adam(
        name="adam"
    )  # named: Keras numbers unnamed ones per process


@pytest.fixture(scope="module")
def adam_mlp_32(adam_mlp) -> me.MemoryEstimate:
    """The estimate at a batch of 32, compiled once for the tests that read it."""
    return mlp_estimate(*adam_mlp, batch=32)


def test_sgd_on_one_n_by_n_kernel_is_the_kernel_and_no_optimizer_state():
    n = 1024
    inputs = keras.Input((n,))
    model = keras.Model(inputs, MatmulChain(n, matmuls=2)(inputs))
    optimizer = keras.optimizers.SGD(0.01)
    step = train_step(model, optimizer, squared_error)
    specs = (tf.TensorSpec([32, n]), tf.TensorSpec([32, n]))
    estimate = me.estimate(
        step, specs, weights=model.variables, optimizer_variables=optimizer.variables
    )
    assert estimate.bytes(me.WEIGHTS) == pytest.approx(F32 * n * n, rel=0.01)
    assert estimate.padded_bytes(me.WEIGHTS) == F32 * n * n  # 1024 fills whole tiles
    assert estimate.bytes(me.OPTIMIZER) <= 16  # iteration counter and learning rate
    assert estimate.bytes(me.INPUT) == 2 * 32 * n * F32


def test_adam_keeps_two_slots_per_weight(adam_mlp, adam_mlp_32):
    model, _ = adam_mlp
    estimate = adam_mlp_32
    parameter_bytes = F32 * model.count_params()
    assert estimate.bytes(me.WEIGHTS) == parameter_bytes
    # Momentum and velocity per weight, plus the iteration counter (int64) and the
    # learning rate (float32).
    assert estimate.bytes(me.OPTIMIZER) == 2 * parameter_bytes + 8 + 4
    names = {a.name for a in estimate.arrays if a.category == me.OPTIMIZER}
    assert {"adam/iteration", "adam/learning_rate"} <= names


def test_temporaries_grow_with_the_batch_and_the_rest_does_not(adam_mlp, adam_mlp_32):
    model, optimizer = adam_mlp
    small = adam_mlp_32
    large = mlp_estimate(model, optimizer, batch=2048)
    for category in (me.WEIGHTS, me.OPTIMIZER):
        assert large.bytes(category) == small.bytes(category)
    assert large.bytes(me.INPUT) == 64 * small.bytes(me.INPUT)
    # At least the [batch, 512] activations and their gradient.
    assert large.bytes(me.OTHER) - small.bytes(me.OTHER) >= 2 * (2048 - 32) * 512 * F32
    assert large.total_bytes > small.total_bytes


def test_a_small_weight_is_padded_to_tpu_tiles():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(5)(inputs))  # kernel [3, 5], bias [5]
    optimizer = keras.optimizers.SGD(0.1)
    step = train_step(model, optimizer, squared_error)
    estimate = me.estimate(
        step,
        (tf.TensorSpec([8, 3]), tf.TensorSpec([8, 5])),
        weights=model.variables,
        optimizer_variables=optimizer.variables,
    )
    kernel = next(a for a in estimate.arrays if a.shape == (3, 5))
    assert (kernel.category, kernel.dtype, kernel.bytes) == (me.WEIGHTS, "float32", 60)
    assert kernel.padded_bytes == 4 * 128 * F32  # one (4, 128) small tile
    bias = next(a for a in estimate.arrays if a.shape == (5,))
    assert bias.padded_bytes == 128 * F32
    assert estimate.padded_bytes(me.WEIGHTS) == 4 * 128 * F32 + 128 * F32
    assert estimate.padded_total_bytes > estimate.total_bytes


@pytest.mark.parametrize(
    "shape, dtype, padded",
    [
        ((), tf.float32, 4),
        ((10,), tf.float32, 128 * 4),  # vectors: whole 128-lane rows
        ((129,), tf.int32, 256 * 4),
        ((3, 5), tf.float32, 4 * 128 * 4),  # 3-4 rows: (4, 128) small tiles
        ((1, 300), tf.float32, 2 * 384 * 4),  # 1-2 rows: (2, 128)
        ((20, 5), tf.float32, 24 * 128 * 4),  # (8, 128) tiles
        ((8, 128), tf.float32, 8 * 128 * 4),  # exactly one tile
        ((2, 3, 20, 130), tf.float32, 6 * 24 * 256 * 4),  # major dimensions unpadded
        ((20, 5), tf.bfloat16, 24 * 128 * 2),  # 16-bit: 8 rows, packed in pairs
        ((20, 5), tf.int8, 32 * 128 * 1),  # 8-bit: 32 rows
        ((8, 128), tf.bool, 8 * 128 * 4),  # a bool takes 4 bytes
    ],
)
def test_tpu_padded_bytes(shape, dtype, padded):
    assert me.tpu_padded_bytes(shape, dtype) == padded


def test_other_tile_rows_can_be_given():
    # TPU7x tiles 16-bit types by 16 rows.
    assert me.tpu_padded_bytes((20, 5), tf.bfloat16, {16: 16}) == 32 * 128 * 2


def test_nothing_is_allocated_a_batch_beyond_this_machine_can_be_sized():
    inputs = keras.Input((2048,))
    model = keras.Model(inputs, keras.layers.Dense(8)(inputs))
    optimizer = keras.optimizers.SGD(0.1)
    step = train_step(model, optimizer, squared_error)
    batch = 1 << 23  # the input alone is 64 GiB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    estimate = me.estimate(
        step,
        (tf.TensorSpec([batch, 2048]), tf.TensorSpec([batch, 8])),
        weights=model.variables,
        optimizer_variables=optimizer.variables,
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert estimate.bytes(me.INPUT) == batch * (2048 + 8) * F32
    assert grown_kib < 1 << 20  # less than 1 GiB


def test_mixed_bfloat16_keeps_float32_weights_and_slots(adam_mlp_32):
    float32 = adam_mlp_32  # weights and slots do not depend on the batch
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = mlp()
        mixed = mlp_estimate(model, keras.optimizers.Adam(), batch=32)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # Keras keeps float32 variables and computes in bfloat16: the variables'
    # memory is that of float32; only activations could shrink.
    assert {a.dtype for a in mixed.arrays if a.category == me.WEIGHTS} == {"float32"}
    assert mixed.bytes(me.WEIGHTS) == float32.bytes(me.WEIGHTS)
    assert mixed.bytes(me.OPTIMIZER) == float32.bytes(me.OPTIMIZER)


def test_inputs_are_named_by_their_place_in_the_arguments():
    inputs = {"a": keras.Input((4,), name="a"), "b": keras.Input((4,), name="b")}
    model = keras.Model(
        inputs, keras.layers.Dense(1)(keras.layers.Concatenate()(list(inputs.values())))
    )
    optimizer = keras.optimizers.SGD(0.1)
    step = train_step(model, optimizer, squared_error)
    specs = ({"b": tf.TensorSpec([8, 4]), "a": tf.TensorSpec([8, 4])}, tf.TensorSpec([8, 1]))
    estimate = me.estimate(
        step, specs, weights=model.variables, optimizer_variables=optimizer.variables
    )
    names = [a.name for a in estimate.arrays if a.category == me.INPUT]
    assert names == ["args[0]['a']", "args[0]['b']", "args[1]"]


def test_a_variable_in_no_list_counts_as_other():
    model = mlp(hidden=16)
    optimizer = keras.optimizers.SGD(0.1)
    step = train_step(model, optimizer, cross_entropy)
    specs = (tf.TensorSpec([8, 784], tf.float32), tf.TensorSpec([8], tf.int32))
    estimate = me.estimate(step, specs, weights=model.variables[:2])  # the first layer
    shapes = {c: sorted(a.shape for a in estimate.arrays if a.category == c) for c in me.CATEGORIES}
    assert shapes[me.WEIGHTS] == [(16,), (784, 16)]
    assert shapes[me.OPTIMIZER] == []
    # The second layer, the iteration counter and the learning rate.
    assert shapes[me.OTHER] == [(), (), (10,), (16, 10)]


def test_a_dynamic_shape_is_refused():
    with pytest.raises(ValueError, match=r"args\[0\] is .*fully defined shape"):
        me.estimate(lambda x: x, (tf.TensorSpec([None, 4]),), weights=[])


def test_a_step_xla_cannot_compile_is_an_estimate_error():
    def step(x):
        return tf.strings.length(tf.strings.as_string(x))

    with pytest.raises(me.EstimateError, match="does not compile with XLA"):
        me.estimate(step, (tf.TensorSpec([4]),), weights=[])


def test_parameters_out_of_order_fail_loudly(monkeypatch, adam_mlp):
    expected_parameters = buffers.expected_parameters

    def reversed_captures(*args):
        expected = expected_parameters(*args)
        return expected[:2] + expected[2:][::-1]

    monkeypatch.setattr(buffers, "expected_parameters", reversed_captures)
    with pytest.raises(me.EstimateError, match="no longer orders parameters"):
        mlp_estimate(*adam_mlp, batch=32)


def test_summary_names_every_category_and_says_it_is_an_estimate(adam_mlp_32):
    summary = adam_mlp_32.summary()
    for category in me.CATEGORIES:
        assert f"{category} " in summary
    assert "per replica in TPU tiles" in summary
    assert "an estimate" in summary


def test_a_step_that_does_not_trace_says_why_on_one_line():
    def step(x):
        return x + tf.constant(1, tf.int32)

    with pytest.raises(me.EstimateError) as raised:
        me.estimate(step, (tf.TensorSpec([4], tf.float32),), weights=[])
    message = str(raised.value)
    assert message.startswith("the step could not be traced: ")
    assert "\n" not in message and "in user code" not in message
