"""tpurun.errors.tf_errors: the one line a user sees of an error, from TensorFlow's long messages."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from tpurun.errors.tf_errors import describe, first_line, one_line, op_error_line, user_code_line

# Real messages of errors raised inside a tf.function (TensorFlow 2.21).
GRAPH_ERRORS = {
    "in_a_dataset_function": (
        "Graph execution error:\n\nDetected at node ParseExample/ParseExampleV2 defined at "
        "(most recent call last):\n<stack traces unavailable>\nError in user-defined function "
        "passed to ParallelMapDatasetV2:3 transformation with iterator: "
        "Iterator::Root::Prefetch::ParallelMapV2: Name: <unknown>, Key: label, Index: 3.  Data "
        "types don't match. Data type: float but expected type: int64\n\t [[{{node "
        "ParseExample/ParseExampleV2}}]]\n\t [[while/body/_1/while/IteratorGetNextAsOptional]] "
        "[Op:__inference_loop_157]",
        "Name: <unknown>, Key: label, Index: 3.  Data types don't match. Data type: float but "
        "expected type: int64",
    ),
    "with_a_python_trace": (
        "Graph execution error:\n\nDetected at node while/IteratorGetNextAsOptional defined at "
        '(most recent call last):\n  File "/tmp/run.py", line 19, in <module>\n\n  File '
        '"/tmp/run.py", line 13, in loop\n\ntruncated record at 16929\' failed with Read less '
        "bytes than requested\n\t [[{{node while/IteratorGetNextAsOptional}}]] "
        "[Op:__inference_loop_628]",
        "truncated record at 16929' failed with Read less bytes than requested",
    ),
    "eager": ("No such file or directory: /x\nmore", "No such file or directory: /x"),
    "eager_in_a_function_node": (
        "{{function_node __wrapped__CollectiveBcastRecv_device_/job:worker/replica:0/task:1/"
        "device:CPU:0}} Collective ops is aborted by: Failed to send RPC to coordination "
        "service.\nAdditional GRPC error information",
        "Collective ops is aborted by: Failed to send RPC to coordination service.",
    ),
    # A tf.debugging.Assert of one text reads as the text; of several values, as written.
    "an_assertion_of_one_text": (
        "assertion failed: [the input yields a batch of 6 rows]\n\t [[{{node Assert}}]]",
        "the input yields a batch of 6 rows",
    ),
    "an_assertion_of_several_values": (
        "assertion failed: [x <= y did not hold] [x = ] [6]\n\t [[{{node Assert}}]]",
        "assertion failed: [x <= y did not hold] [x = ] [6]",
    ),
}


@pytest.mark.parametrize(
    "message, line", list(GRAPH_ERRORS.values()), ids=list(GRAPH_ERRORS.keys())
)
def test_an_undiagnosed_tensorflow_error_shows_its_meaningful_line(message, line):
    """Not "InvalidArgumentError: Graph execution error:", which says nothing."""
    assert op_error_line(message) == line


# An error autograph raised while tracing a user's layer (Keras 3, TensorFlow 2.21).
IN_USER_CODE = (
    "in user code:\n\n"
    '    File "/tmp/my_model.py", line 12, in call  *\n'
    "        return tf.boolean_mask(x, x > 0)\n\n"
    "    ValueError: Exception encountered when calling Culprit.call().\n\n"
    "\x1b[1mShapes (None,) and (4,) are incompatible\x1b[0m\n\n"
    "Arguments received by Culprit.call():\n  \u2022 x=tf.Tensor(shape=(8, 4), dtype=float32)"
)


@pytest.mark.parametrize(
    "message, line",
    [
        (
            IN_USER_CODE,
            "ValueError: Exception encountered when calling Culprit.call(). Shapes (None,) "
            "and (4,) are incompatible",
        ),
        (
            'in user code:\n\n    File "/tmp/m.py", line 3, in step *\n'
            "    TypeError: unsupported operand type(s) for +: 'int' and 'str'\n",
            "TypeError: unsupported operand type(s) for +: 'int' and 'str'",
        ),
        (
            "Dimensions must be equal, but are 3 and 4\n  more",
            "Dimensions must be equal, but are 3 and 4",
        ),
        ("", "ValueError"),
    ],
    ids=["keras_layer", "plain_error", "not_from_autograph", "empty"],
)
def test_user_code_line_is_the_error_the_users_code_raised(message, line):
    assert user_code_line(ValueError(message)) == line


def test_user_code_line_reads_a_tensorflow_errors_own_message():
    error = tf.errors.InvalidArgumentError(None, None, "in user code:\n\n    ValueError: bad\n")
    assert user_code_line(error) == "ValueError: bad"


@pytest.mark.parametrize(
    "error, limit, line",
    [
        (ValueError("two\n  lines,   spaced"), None, "two lines, spaced"),
        (ValueError("a long message"), 6, "a long"),
        (tf.errors.NotFoundError(None, None, "/x: No such file"), None, "/x: No such file"),
    ],
    ids=["joined", "cut", "op_error_message"],
)
def test_one_line(error, limit, line):
    assert one_line(error, limit) == line


@pytest.mark.parametrize(
    "value, line",
    [("  first  line \nsecond", "first line"), (ValueError("only"), "only"), ("", "")],
    ids=["text", "error", "empty"],
)
def test_first_line(value, line):
    assert first_line(value) == line


@pytest.mark.parametrize(
    "error, message",
    [
        (
            tf.errors.InvalidArgumentError(None, None, GRAPH_ERRORS["eager"][0]),
            "InvalidArgumentError: No such file or directory: /x",
        ),
        (KeyError("model"), "unexpected KeyError: 'model'"),
        (RuntimeError("first\nsecond"), "unexpected RuntimeError: first"),
    ],
    ids=["op_error", "key_error", "multi_line"],
)
def test_describe_gives_one_line_and_exit_1(error, message):
    assert describe(error) == (message, 1)


# --- an op without a deterministic kernel, under op determinism ---------------------------


@pytest.fixture
def op_determinism():
    """TensorFlow's op determinism on, as config.train.deterministic sets it, then off again."""
    from tpurun import tf_internals

    tf_internals.set_op_determinism(True)
    yield
    tf_internals.set_op_determinism(False)


def test_an_op_that_op_determinism_refuses_is_named_with_where_it_was_made_and_the_fix(
    op_determinism,
):
    """tf.timestamp in a user's step, run in a loop: TensorFlow's FailedPreconditionError."""
    counter = tf.Variable(0.0)

    @tf.function
    def loop():
        for _ in tf.range(2):
            counter.assign_add(tf.cast(tf.timestamp(), tf.float32) * 0.0)  # the user's op

    with pytest.raises(tf.errors.FailedPreconditionError) as raised:
        loop()
    line, code = describe(raised.value)
    made = f"{os.path.relpath(__file__)}:{loop.python_function.__code__.co_firstlineno + 3}"
    assert (
        line
        == (
            f"FailedPreconditionError: Timestamp (made at {made}) has no deterministic "
            "kernel: Timestamp cannot be called when determinism is enabled. TensorFlow's op "
            "determinism is on (config.train.deterministic: true, or 'auto' on a CPU; or "
            "TF_DETERMINISTIC_OPS=1): replace the op (a tf.timestamp: time it from the host), or "
            "train with --config.train.deterministic=false, whose resumes may differ in the last bits"
        )
        and code == 1
    )


def test_an_op_that_needs_a_seed_under_op_determinism_says_so_and_why(op_determinism):
    """Raised while tracing the user's code: TensorFlow's own fix, and what turned it on."""

    @tf.function
    def crop():
        return tf.image.sample_distorted_bounding_box(
            [8, 8, 3], tf.zeros([1, 0, 4]), use_image_if_no_bounding_boxes=True
        )

    with pytest.raises(ValueError) as raised:
        crop()
    line, _ = describe(raised.value)
    assert "tf.image.sample_distorted_bounding_box requires a non-zero seed" in line, line
    assert line.endswith(
        "(TensorFlow's op determinism is on (config.train.deterministic: true, or 'auto' on a "
        "CPU; or TF_DETERMINISTIC_OPS=1))"
    ), line
