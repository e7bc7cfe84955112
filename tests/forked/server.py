"""The forking server behind `forked.Popen`: TensorFlow and tpurun imported once, then a
fork of this process for each `python -m tpurun ...` (or script, or -c) a test starts.

Run as `python server.py SOCKET`. It imports what every tpurun process imports (about
8 CPU-seconds of TensorFlow, Keras and tpurun's modules), checks that the imports ran
no TensorFlow op (a child must still be able to split its CPU into logical devices, as
a fresh process can), prints "ready", and serves one request per connection on the
Unix socket SOCKET:

    request:  8 bytes (the length of the JSON that follows) sent with three file
              descriptors (the child's stdin, stdout, stderr), then the JSON
              {"argv", "env", "cwd", "new_session"}
    answers:  a line {"pid": N} once forked, a line {"status": S} (os.waitpid's) once
              the child has ended and been reaped

The child is the process the test talks to: it gets signals at its pid, its own
session when asked (new_session, as Popen's start_new_session), the request's
environment and working directory, and it ends as a `python` process ends (atexit,
non-daemon threads, flushed streams), with the exit code `python` would give.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import socket
import struct
import sys
import tempfile
import threading
import traceback


def preload() -> None:
    import tensorflow as tf  # noqa: F401
    from tensorflow.python.eager import context

    import tpurun  # noqa: F401 - first: it keeps jax out, as in every tpurun process
    import tpurun.cli  # noqa: F401
    import tpurun.commands  # noqa: F401
    from tpurun.run_config.command_table import COMMANDS

    for command in COMMANDS:  # every command's modules
        command.function()

    if context.context()._context_handle is not None:  # noqa: SLF001 - the one check there is
        sys.exit(
            "forked/server.py: the imports initialised TensorFlow; a child could not split its CPU"
        )


def run_child(request: dict, fds: list[int]) -> int:
    """In the forked child: becomes the requested `python ...` and runs it; its exit code."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from TMPDIR, as a new interpreter does
    # As a new interpreter's: line-buffered on a terminal, block-buffered otherwise.
    sys.stdout.reconfigure(line_buffering=os.isatty(1))
    mode, target, args = request["argv"]
    try:
        if mode == "-m":
            sys.argv = ["-m", *args]
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif mode == "-c":
            sys.argv = ["-c", *args]
            sys.path[0] = ""
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
        else:
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        return exit_code(e)
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit 1
        traceback.print_exc()
        return 1
    return 0


def exit_code(stop: SystemExit) -> int:
    """The exit code the interpreter gives for `stop` (printing a message, as it does)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code & 0xFF
    print(stop.code, file=sys.stderr)
    return 1


def answer_when_reaped(connection: socket.socket, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    try:
        connection.sendall(json.dumps({"status": status}).encode() + b"\n")
    except OSError:
        pass  # the test went away
    finally:
        connection.close()


def receive(connection: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(connection, 8, 3)
    (length,) = struct.unpack("!Q", header)
    data = b""
    while len(data) < length:
        chunk = connection.recv(length - len(data))
        if not chunk:
            raise ConnectionError("the request ended early")
        data += chunk
    return json.loads(data), fds


def serve(path: str) -> int | None:
    """Serves until the test process (the parent) is gone; in a child, its exit code."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    print("ready", flush=True)
    open_connections: set[socket.socket] = set()
    while os.getppid() == parent:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        connection.settimeout(None)
        try:
            request, fds = receive(connection)
        except (OSError, ValueError):
            connection.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in (*open_connections, connection):
                other.close()
            return run_child(request, fds)
        for fd in fds:
            os.close(fd)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        open_connections.add(connection)
        threading.Thread(
            target=lambda c=connection, p=pid: (
                answer_when_reaped(c, p),
                open_connections.discard(c),
            ),
            daemon=True,
        ).start()
    return None


if __name__ == "__main__":
    preload()
    # What the imports made is kept out of the children's garbage collections: a full
    # collection walks and writes every object's header, so each forked child paid for
    # TensorFlow's ~350,000 objects again, in scans and in copy-on-write page copies.
    # A forked Iris training took 4.1-5.2 CPU-s without this, 2.4-3.6 with it.
    gc.collect()
    gc.freeze()
    code = serve(sys.argv[1])
    if code is not None:
        sys.exit(code)
