"""Turns an unexpected exception into the one line a user sees, and an exit code."""

from __future__ import annotations

import sys

from tpurun.errors import EXIT_RUN_FAILURE


def describe(error: BaseException) -> tuple[str, int]:
    first_line = (str(error).strip().splitlines() or [""])[0]
    if "tensorflow" in sys.modules:  # only look at TF's errors if TF is loaded
        import tensorflow as tf

        if isinstance(error, tf.errors.OpError):
            # OpError messages carry the failing node and a graph trace after the first line.
            return f"{type(error).__name__}: {error.message.strip().splitlines()[0]}", (
                EXIT_RUN_FAILURE
            )
    return f"unexpected {type(error).__name__}: {first_line}", EXIT_RUN_FAILURE
