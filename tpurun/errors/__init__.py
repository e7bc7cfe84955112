"""The failures a user can see, their exit codes, and others' errors turned into one line.

Everything a user can get wrong ends in one of these, raised with a message that names
the fix; `tpurun.cli` prints the message on one line and exits with the code.

* `failures`: the errors (`UsageError`: 2, `RunError`: 1, `Unavailable`: 69, `Preempted`:
  75) and the exit codes (`EXIT_HUNG`: 3); `excerpt`, a quoted value kept short;
* `sigterm`: SIGTERM outside the training loop, a preemption's exit 75 (`stop_at_sigterm`);
* `tf_errors`: TensorFlow's errors as one line and an exit code;
* `storage_errors`: a failed Cloud Storage request, its cause and its fix;
* `user_code`: where in the user's own code an error happened.
"""

from tpurun.errors.failures import (
    EXCERPT,
    EXIT_HUNG,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_RUN_FAILURE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CheckpointMismatch,
    Preempted,
    RunError,
    TpurunError,
    Unavailable,
    UsageError,
    excerpt,
)
from tpurun.errors.sigterm import (
    StoppedBySigterm,
    caused_by_sigterm,
    sigterm_seen,
    stop_at_sigterm,
)

__all__ = [
    "EXCERPT",
    "EXIT_HUNG",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "EXIT_RUN_FAILURE",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "CheckpointMismatch",
    "Preempted",
    "RunError",
    "StoppedBySigterm",
    "TpurunError",
    "Unavailable",
    "UsageError",
    "caused_by_sigterm",
    "excerpt",
    "sigterm_seen",
    "stop_at_sigterm",
]
