"""The failures a user can see, and their exit codes: usage (2), run (1), unavailable (69),
preempted (75), hung (3).

Everything a user can get wrong ends in one of these, raised with a message that names
the fix; `tpurun.cli` prints the message on one line and exits with the code, without a
traceback.
"""

from __future__ import annotations


class TpurunError(Exception):
    """Base class: a failure with a message meant for the user."""

    exit_code = 1


class UsageError(TpurunError):
    """The command line or the config is wrong (exit code 2)."""

    exit_code = 2


class RunError(TpurunError):
    """The job could not run: missing data, no checkpoint, unwritable dir (exit code 1)."""

    exit_code = 1


class CheckpointMismatch(RunError):
    """A checkpoint does not fit the model built to read it (exit code 1; 2 when the command
    line's overrides built that model: `tpurun.run_config.keys.trained_keys.conflict`).

    `reason`: what did not fit, on one line (TensorFlow's words, shortened)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class Unavailable(TpurunError):
    """A failure that passes by itself: a lost TPU worker or cluster peer, storage that stayed
    unreachable past its retries (exit code 69). Rerun (or `--max_restarts`) to resume."""

    exit_code = 69  # EX_UNAVAILABLE: a service is unavailable


class Preempted(TpurunError):
    """SIGTERM (a TPU VM's preemption notice): a checkpoint was saved; rerun to continue."""

    exit_code = 75  # EX_TEMPFAIL: temporary failure, try again


# Documented in docs/errors.md: a supervisor may restart a run that exits with EXIT_PREEMPTED.
EXIT_OK = 0
EXIT_PREEMPTED = Preempted.exit_code
EXIT_RUN_FAILURE = RunError.exit_code
EXIT_USAGE = UsageError.exit_code
EXIT_UNAVAILABLE = Unavailable.exit_code
# `train` made no progress for --hang_timeout seconds (a stuck infeed or TPU) and was
# ended by its watchdog (tpurun.actions.watchdog), not by an exception: the main thread is
# blocked inside TensorFlow. The latest checkpoint is intact; rerun to resume from it.
EXIT_HUNG = 3


# How much of a value of the user's (a data cell, a config value) an error line quotes.
EXCERPT = 60


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """`text` whole when short, else its start and its length: an error line stays a line
    whatever it quotes (a CSV cell of 200,000 characters)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
