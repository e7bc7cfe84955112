"""A clean terminal: TensorFlow's known start-up lines and its Python INFO logs hidden.

Where the lines come from (TensorFlow 2.21 from PyPI on a CPU machine; found with
`strace -f -e trace=openat,write`, one process, no subprocess involved):

* `import tensorflow` loads libtensorflow_framework.so.2, whose static
  initialisers log through absl (C++) before anything configured it: absl's own
  "All log messages before absl::InitializeLog() ..." notice, then oneDNN's
  notice (port.cc) and "Could not find cuda drivers" (cudart_stub.cc); with
  TF_CPP_MIN_LOG_LEVEL=0 also the two lines of cpu_feature_guard.cc.
* The same import then loads tensorflow/python/profiler/internal/
  _pywrap_profiler_plugin.so (for tf.profiler.experimental.client): a 90 MB
  library that links its own copies of absl, port.cc and the CUDA stub, so their
  initialisers print the same three lines a second time. That is the "twice".
* The first device listing (tf.config.list_physical_devices, or the first op)
  probes for a GPU: "failed call to cuInit" (cuda_platform.cc), an ERROR line.

TF_CPP_MIN_LOG_LEVEL=2 (cli.py's default) cannot hide them: the initialisers'
lines are written before TensorFlow reads it, by an absl that writes everything
to stderr until InitializeLog() is called (TensorFlow never calls it), so even
level 3 shows them; the cuInit line is an error, which level 2 shows and level 3
would hide together with every real error. They are written with write(2, ...)
straight to file descriptor 2, past Python's sys.stderr: only fd 2 can filter them.

How: `quiet_tensorflow` imports TensorFlow and lists the GPUs (which cluster.py
does first anyway; 1 ms) with fd 2 turned into a pipe, then restores fd 2. All
the known lines are printed in that window, and only there. A child process
(this file run as a script) reads the pipe, drops the lines that match
KNOWN_LINES and copies everything else, in order, to the real stderr.

* A window, not the whole process: after it, fd 2 is the real stderr again, so
  nothing can be held back in a pipe when the process ends with os._exit
  (watchdog.exit_hung), tqdm's progress line writes to the terminal itself, and
  the run pays nothing per line.
* A process, not a thread: if TensorFlow aborts during its import (e.g. "The
  TensorFlow library was compiled to use AVX instructions" on a CPU without
  them), a thread dies with the process and that last line dies in the pipe;
  the child gets end-of-file and still prints it (tried: with a reader
  thread, a fatal line written just before abort() or os._exit was lost every
  time). The child starts in tens of milliseconds, in parallel with the 2-5 s
  import; opening and closing the window cost the run a few milliseconds.
* Known lines only: anything else written during the window (a Python warning,
  another C++ error, a crash message) goes through unchanged.

TensorFlow's Python log lines reach absl's handler (installed by cli.py on the
root logger) through two loggers: TensorFlow's own ("tensorflow": e.g.
MirroredStrategy's device list, cross_device_ops' "Reduce to ...") and absl's,
which some TensorFlow modules use like tpurun does (functional_saver.py's
"Sharding callback duration" after every save). So a filter on that handler
picks them by the file that logged them, not by logger: a line below WARNING
from TensorFlow's or Keras's code is hidden, and so is a deprecation notice
about a call made by TensorFlow or Keras itself (no user can act on it).
Warnings and errors, and every line of tpurun or of a model, still show.

`--verbosity=1` (verbose=True) shows everything, unfiltered. Only the first call
in a process imports TensorFlow; every call switches the log filter on or off,
so `cli.main` can run several times in a process, with different verbosities.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator

# absl's C++ line prefix: severity and date ("I0000 00:00:1795452628.968456"
# before InitializeLog), thread id, then the source file (maybe with its path).
_ABSL = rb"[IWEF]\d{4} [\d:.]+ +\d+ (?:\S*/)?"

# TensorFlow's known start-up lines (see the docstring for when each is printed).
KNOWN_LINES = [
    # absl, before its first line, until InitializeLog() is called (never, by TF).
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    # oneDNN is on by default; TF_ENABLE_ONEDNN_OPTS=0 would also turn its speed-up off.
    _ABSL + rb"port\.cc:\d+\] oneDNN custom operations are on\.",
    # No CUDA driver on this machine, so TensorFlow runs on the CPU.
    _ABSL + rb"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not "
    rb"be used\.$",
    # The GPU probe without a driver (303: the stub found no libcuda) or without a GPU.
    _ABSL + rb"cuda_platform\.cc:\d+\] failed call to cuInit: .*"
    rb"(?:UNKNOWN ERROR \(303\)|CUDA_ERROR_NO_DEVICE)",
    # CPU instructions the build uses only in its hot loops (at TF_CPP_MIN_LOG_LEVEL=0)...
    _ABSL + rb"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available "
    rb"CPU instructions in performance-critical operations\.$",
    # ...and that message's second line.
    rb"To enable the following instructions: [\w ]+, in other operations, rebuild TensorFlow "
    rb"with the appropriate compiler flags\.$",
]
_KNOWN = re.compile(b"|".join(b"(?:" + pattern + b")" for pattern in KNOWN_LINES))

# How long closing the window waits for the child to copy what is left in the pipe.
_DRAIN_TIMEOUT = 10.0  # seconds; it normally takes a few milliseconds


def quiet_tensorflow(verbose: bool) -> None:
    """Unless `verbose`: imports TensorFlow and finds its devices without their known
    start-up lines, and hides TensorFlow's Python log lines below WARNING.

    Call after absl's log handler is installed and before TensorFlow is imported;
    a later call in the same process only switches the log filter on or off.
    """
    # Not imported at the top: the filter's child process runs without site-packages.
    from absl import logging as absl_logging

    handler = absl_logging.get_absl_handler()
    if verbose:
        handler.removeFilter(_hide_tensorflow_logs)
        return
    handler.addFilter(_hide_tensorflow_logs)  # once: adding it again changes nothing
    if "tensorflow" in sys.modules:
        return  # a second run in this process, or TensorFlow imported by the caller
    with known_lines_hidden():
        import tensorflow as tf

        # The GPU probe prints its line once per process, at the first listing.
        tf.config.list_physical_devices("GPU")


@contextlib.contextmanager
def known_lines_hidden() -> Iterator[None]:
    """Within this block, lines written to file descriptor 2 that match KNOWN_LINES are dropped.

    Everything else reaches the real stderr in order, at the latest when the block
    ends (or, if the process dies inside it, when it has died).
    """
    child = _start_filter()
    if child is None:
        yield  # no filter (no stderr, no Python to run it): unfiltered, not broken
        return
    process, real_stderr = child
    try:
        yield
    finally:
        _flush_python_streams()
        os.dup2(real_stderr, 2)  # closes the pipe's last write end: the child reads EOF
        os.close(real_stderr)
        try:
            process.wait(_DRAIN_TIMEOUT)
        except subprocess.TimeoutExpired:
            # Something started in the window still holds the pipe; the child keeps
            # copying its output until it closes it. Do not wait for that.
            pass


def _start_filter() -> tuple[subprocess.Popen, int] | None:
    """Points fd 2 at a pipe read by a child that filters it; returns it and the real fd 2."""
    script = os.path.abspath(__file__)
    if not sys.executable or not script.endswith(".py"):
        return None
    _flush_python_streams()
    try:
        real_stderr = os.dup(2)
    except OSError:
        return None  # no fd 2 at all
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            # -I -S: no site-packages or user paths (nor their start-up cost).
            [sys.executable, "-I", "-S", script],
            stdin=read_end,
            stdout=real_stderr,
            stderr=real_stderr,
            # Its own session: Ctrl-C at the terminal interrupts tpurun, not the filter,
            # which then still prints what the interrupted import wrote.
            start_new_session=True,
        )
    except OSError:
        os.close(write_end)
        os.close(real_stderr)
        return None
    finally:
        os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    return process, real_stderr


def _flush_python_streams() -> None:
    """Writes out what Python buffered for fd 2, before fd 2 changes under it."""
    for stream in (sys.stderr, sys.__stderr__):
        if stream is not None:
            with contextlib.suppress(Exception):  # a closed or odd replacement stream
                stream.flush()


def filter_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The bytes of `chunks` (as read from a pipe) without the known lines.

    Yields complete lines as they come, and a last line without a newline at the
    end; nothing is reordered.
    """
    pending = b""
    for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        kept = b"".join(line + b"\n" for line in lines if not _KNOWN.match(line))
        if kept:
            yield kept
    if pending and not _KNOWN.match(pending):
        yield pending


def _copy_filtered(source: int, sink: int) -> None:
    """Copies fd `source` to fd `sink` through filter_lines until end of file."""
    for data in filter_lines(iter(lambda: os.read(source, 65536), b"")):
        view = memoryview(data)
        while view:
            view = view[os.write(sink, view) :]


class _HideTensorFlowLogs(logging.Filter):
    """Drops what TensorFlow's (and Keras's) own Python code logs below WARNING, through
    any logger (functional_saver.py logs through absl's, like tpurun), and their
    deprecation notices about calls made by TensorFlow or Keras itself.

    A notice reads "From <file>:<line>: <name> (from <module>) is deprecated ...",
    <file> being the caller's. When that is TensorFlow's dispatch wrapper (most
    public ops, e.g. tf.compat.v1.to_float), the real caller is unknown and may be
    the user's code: such a notice is kept, as is one whose <file> is not a library's.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        libraries = _library_dirs()
        if not record.pathname.startswith(libraries):
            return True  # tpurun's, a model's, any other library's
        if record.levelno < logging.WARNING:
            return False
        if record.module == "deprecation" and isinstance(record.args, tuple) and record.args:
            caller = str(record.args[0]).rpartition(":")[0]  # "<file>:<line>"
            return not caller.startswith(libraries) or caller.endswith(_DISPATCH)
        return True


# TensorFlow's wrapper around its ops: the deprecation notices' "From" when it is in between.
_DISPATCH = os.path.join("tensorflow", "python", "util", "dispatch.py")


def _library_dirs() -> tuple[str, ...]:
    """The directories of TensorFlow and Keras, as imported, each ending in a separator."""
    dirs = []
    for name in ("tensorflow", "keras"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(path) + os.sep)
    return tuple(dirs)


_hide_tensorflow_logs = _HideTensorFlowLogs()

if __name__ == "__main__":
    # The child of known_lines_hidden: stdin is the pipe, stdout the real stderr.
    _copy_filtered(0, 1)
    os._exit(0)
