"""Turns an exception into the one line a user sees, and an exit code."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

from tpurun.errors import user_code
from tpurun.errors.failures import EXIT_RUN_FAILURE, EXIT_UNAVAILABLE
from tpurun.errors.user_code import unescaped

if TYPE_CHECKING:  # tpurun's errors are described without importing TensorFlow
    import tensorflow as tf

# What TensorFlow puts around the message of an error raised inside a tf.function
# ("Graph execution error:", the node and its Python trace, "[[{{node ...}}]]"), and
# before the message of one raised inside a tf.data function.
_GRAPH_NOISE = ("Graph execution error:", "Detected at node", "File ", "<stack traces", "[[")
_DATASET_PREFIX = re.compile(r"^Error in user-defined function passed to .*? with iterator: \S+: ")
# Before the message of an error an eager op raised: "{{function_node __wrapped__<op>...}} ".
_FUNCTION_NODE = re.compile(r"^\{\{function_node [^}]*\}\}\s*")
# A failed tf.debugging.Assert whose data is one text: "assertion failed: [<text>]" (not one
# of several values, "[a] [b]", which stays as TensorFlow wrote it).
_ASSERTION = re.compile(r"^assertion failed: \[([^\[\]]*)\]$")


# TensorFlow's words (2.21) for an op that has no deterministic kernel, or that op
# determinism forbids outright (tf.timestamp; a random op without a seed).
_NO_DETERMINISTIC_KERNEL = re.compile(
    r"when determinism is enabled|deterministic (?:GPU |XLA )?implementation|"
    r"Determinism is not yet supported|run-to-run determinism is required"
)
# Where such a message names the op, and else the node that failed ("while/Timestamp").
_OP_IN_MESSAGE = (
    re.compile(r"^(\w+) cannot be called when determinism"),
    re.compile(r"^(tf\.[\w.]+) requires a non-zero seed"),
    re.compile(r"implementation of (\w+)"),
    re.compile(r"supported (?:in GPU implementation of|for) (\w+)"),
    re.compile(r"\{\{node ([^}]+)\}\}"),
    re.compile(r"__wrapped__(\w+?)_device_"),
)
DETERMINISM_ON = (
    "TensorFlow's op determinism is on (config.train.deterministic: true, or 'auto' on a "
    "CPU; or TF_DETERMINISTIC_OPS=1)"
)

# TensorFlow's errors for what passes by itself (a lost TPU worker or peer, a deadline, an
# aborted collective): exit EXIT_UNAVAILABLE, which `train --max_restarts` restarts.
TRANSIENT = ("UnavailableError", "DeadlineExceededError", "AbortedError")


def describe(error: BaseException) -> tuple[str, int]:
    """The line for an exception no tpurun code turned into a TpurunError, and its exit code.

    A TensorFlow error says what failed; an error raised in the user's code (a
    model, a config) says so, with the user's message and file:line; only what is
    left, tpurun's own bugs, is "unexpected".
    """
    if "tensorflow" in sys.modules:  # only look at TF's errors if TF is loaded
        import tensorflow as tf

        if isinstance(error, tf.errors.OpError):
            code = EXIT_UNAVAILABLE if type(error).__name__ in TRANSIENT else EXIT_RUN_FAILURE
            line = nondeterministic_op_line(error.message) or op_error_line(error.message)
            return f"{type(error).__name__}: {line}", code
    where = user_code.raised_at(error)
    if where is not None:
        kind = type(error).__name__
        message = user_code_line(error).removeprefix(f"{kind}: ")
        if _NO_DETERMINISTIC_KERNEL.search(message):  # a seed it asks for: TensorFlow's fix
            message += f" ({DETERMINISM_ON})"
        return f"{kind} in your code at {where}: {message}", EXIT_RUN_FAILURE
    first = (str(error).strip().splitlines() or [""])[0]
    return f"unexpected {type(error).__name__}: {first}", EXIT_RUN_FAILURE


def one_line(error: BaseException, limit: int | None = None) -> str:
    """An exception's message on one line, cut at `limit` characters.

    A TensorFlow error's own message (str() of one can add the failing op's
    definition), else str(error).
    """
    return " ".join(str(getattr(error, "message", None) or error).split())[:limit]


def first_line(value: object) -> str:
    """The first line of a text (or of an error's str()), its whitespace collapsed."""
    lines = str(value).strip().splitlines()
    return " ".join(lines[0].split()) if lines else ""


def user_code_line(error: BaseException) -> str:
    """The informative line of an error raised while TensorFlow traced the user's code.

    Autograph wraps such an error as "in user code:", the user's frames, then the
    error's own "ValueError: ..." line: that last one is what went wrong.
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(getattr(error, "message", None) or error))
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].startswith("in user code"):
        raised = [i for i, line in enumerate(lines) if re.match(r"\w+(Error|Exception): ", line)]
        if raised:
            lines = lines[raised[-1] :]
    # Keras puts a layer's own message on the line after "Exception encountered when
    # calling <layer>.call().", and the arguments it received after that.
    if "Exception encountered when calling" in lines[0] and len(lines) > 1:
        message = lines[1]
        # While building a functional model it adds its own sentence first.
        if message.endswith("Error encountered:") and len(lines) > 2:
            message = lines[2]
        return f"{lines[0]} {unescaped(message)}"
    return unescaped(lines[0])


def op_error_line(message: str) -> str:
    """The line of an OpError's message that says what went wrong.

    An error from a tf.function starts "Graph execution error:", then the failing
    node and a trace; the line that matters is the last one that is none of those.
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()] or [""]
    if lines[0] != "Graph execution error:":
        line = _FUNCTION_NODE.sub("", lines[0])
    else:
        meaningful = [line for line in lines if not line.startswith(_GRAPH_NOISE)]
        line = _DATASET_PREFIX.sub("", meaningful[-1]) if meaningful else lines[0]
    return _ASSERTION.sub(r"\1", line)


def nondeterministic_op_line(message: str) -> str | None:
    """The line of an op that op determinism forbids or has no deterministic kernel for: the
    op, where the user's code made it, TensorFlow's words and the fix; None for another error."""
    said = op_error_line(message)
    if not _NO_DETERMINISTIC_KERNEL.search(said):
        return None
    named = (pattern.search(text) for pattern in _OP_IN_MESSAGE for text in (said, message))
    op = next((found.group(1) for found in named if found), "an op")
    where = user_code.in_text(message)
    made = f" (made at {where})" if where else ""
    return (
        f"{op}{made} has no deterministic kernel: {said}. {DETERMINISM_ON}: replace the op "
        "(a tf.timestamp: time it from the host), or train with "
        "--config.train.deterministic=false, whose resumes may differ in the last bits"
    )


def lost_worker_reason(error: tf.errors.UnavailableError) -> str | None:
    """Why a collective with the other workers was aborted; None if the error is not that.

    Unavailable storage (a GCS outage) raises the same error type, and must not be
    reported as a lost worker.
    """
    message = error.message
    if "Collective ops is aborted" not in message and "/job:" not in message:
        return None
    aborted = re.search(r"Collective ops is aborted by: ([^\n]*)", message)
    return (aborted.group(1) if aborted else op_error_line(message)).strip()[:200]
