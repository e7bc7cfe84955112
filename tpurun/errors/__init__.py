"""The failures a user can see, and their exit codes: usage (2), run (1), unavailable (69),
preempted (75), hung (3).

Everything a user can get wrong ends in one of these, raised with a message that
names the fix; `tpurun.cli` prints the message on one line and exits with the
code, without a traceback. The rest of the package turns what others raise into
such a line: `tf_errors` (TensorFlow's errors), `storage_errors` (a failed Cloud
Storage request), `user_code` (where in the user's own code it happened). And SIGTERM
outside the training loop (`stop_at_sigterm`), which ends a run as a preemption must:
exit 75.
"""

import signal
import sys
import threading
from typing import Any


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
    line's overrides built that model: `tpurun.run_config.trained_keys.conflict`).

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


class StoppedBySigterm(BaseException):
    """SIGTERM while tpurun was not training (its start-up: the imports, the TPU, the model,
    the data; or after the last save): no step is lost (exit 75, as `Preempted`).

    A BaseException, as KeyboardInterrupt is: no `except Exception` of a library (or of
    tpurun) on the way may swallow it and carry on."""

    exit_code = EXIT_PREEMPTED

    def __init__(self) -> None:
        super().__init__(
            "SIGTERM while not training (before its first step or after its last save): no "
            "step is lost, nothing needed saving; rerun the same command (exit code "
            f"{EXIT_PREEMPTED} means: preempted, restart me)"
        )


_SIGTERM_SEEN = threading.Event()


def _stop(signum: int, frame: object) -> None:
    _SIGTERM_SEEN.set()
    raise StoppedBySigterm


def stop_at_sigterm() -> object:
    """From now on SIGTERM raises StoppedBySigterm where the main thread is (a preemption
    notice during TensorFlow's import, the restore, the input's build), until the training
    loop turns it into a save (`controller.sigterm_notice`). Only the main thread can;
    returns the handler it replaced (None elsewhere), for `signal.signal` to put back."""
    if threading.current_thread() is not threading.main_thread():
        return None
    global _previous_unraisable, _previous_excepthook
    if sys.unraisablehook is not _unraisable:
        _previous_unraisable, sys.unraisablehook = sys.unraisablehook, _unraisable
    if sys.excepthook is not _excepthook:
        _previous_excepthook, sys.excepthook = sys.excepthook, _excepthook
    return signal.signal(signal.SIGTERM, _stop)


# CPython's SystemError for C code that called into Python with an exception still set.
_LEFT_SET = "returned a result with an exception set"


def caused_by_sigterm(error: BaseException | None) -> bool:
    """Whether `error` is StoppedBySigterm or was raised because of it: raised while C code
    ran (an import, a TensorFlow call), it comes back as the SystemError that code raised,
    with StoppedBySigterm as its cause.

    Or, once a SIGTERM came, CPython's SystemError for an exception left set (`_LEFT_SET`):
    C code that swallowed the StoppedBySigterm may go on with its work half done and leave
    a later error set, which is not chained to the StoppedBySigterm. Seen in TensorFlow's
    nest.flatten: its C++ type checks import the type each time (ImportTypeFromModule) and
    drop a failed import through PyErr_WriteUnraisable(NULL), then PyErr_Clear. A SIGTERM
    inside one check (Python's ABC __instancecheck__) leaves StoppedBySigterm set; the next
    check's import drops it (hidden by `_unraisable`), the object is then walked as a
    sequence, which sets a TypeError, and the import after drops a SystemError chained to
    that TypeError only: printed as a traceback of one frame (`_tf_core_flatten`)."""
    for _ in range(20):  # a chain's length; a cycle ends here too
        if error is None:
            return False
        if isinstance(error, StoppedBySigterm):
            return True
        if isinstance(error, SystemError) and _LEFT_SET in str(error) and sigterm_seen():
            return True
        error = error.__cause__ or error.__context__
    return False


_previous_unraisable = sys.__unraisablehook__  # the hook `_unraisable` wraps


def _unraisable(unraisable: "sys.UnraisableHookArgs") -> None:
    """Where Python drops an exception it cannot raise (a `__del__`, a weakref callback, a
    finaliser the garbage collector ran), a StoppedBySigterm raised there is not printed as
    a traceback: it was seen (`sigterm_seen`), and the run stops before its restore
    (`controller.sigterm_notice`), having trained and saved nothing."""
    if caused_by_sigterm(unraisable.exc_value):
        return
    _previous_unraisable(unraisable)


_previous_excepthook = sys.__excepthook__  # the hook `_excepthook` wraps


def _excepthook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
    """C code that catches a Python error and goes on prints it through sys.excepthook
    (`PyErr_Print`; pybind11_protobuf's does): a StoppedBySigterm raised under it is not
    printed either, as in `_unraisable`. tpurun's own last line of defence (`cli`,
    `__main__`) catches before this hook would see an error that ends the process."""
    if caused_by_sigterm(error):
        return
    _previous_excepthook(kind, error, trace)


def sigterm_seen() -> bool:
    """Whether a SIGTERM came before (one whose StoppedBySigterm a handler swallowed)."""
    return _SIGTERM_SEEN.is_set()


# How much of a value of the user's (a data cell, a config value) an error line quotes.
EXCERPT = 60


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """`text` whole when short, else its start and its length: an error line stays a line
    whatever it quotes (a CSV cell of 200,000 characters)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
