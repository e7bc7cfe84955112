"""SIGTERM outside the training loop (`stop_at_sigterm`): a run ends as a preemption must, exit 75.

Where the main thread is when it comes (TensorFlow's import, the restore, the input's
build) it raises StoppedBySigterm; raised inside C code it may come back as another
error (`caused_by_sigterm`), or be dropped where Python cannot raise it, unprinted.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from tpurun.errors.failures import EXIT_PREEMPTED


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


def _unraisable(unraisable: sys.UnraisableHookArgs) -> None:
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
