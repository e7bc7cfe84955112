"""`tpurun data-service dispatcher|worker`: a tf.data service's servers, one per process.

What a user starts on CPU VMs beside a TPU slice (docs/data-service.md). Each server
is TensorFlow's own (`tf.data.experimental.service.DispatchServer`, `WorkerServer`),
in a process of its own, and says each change of its state in one line on stdout:
serving, a worker joined or lost (the dispatcher), registered, the dispatcher lost or
back, the tasks it serves (a worker), stopping, stopped. The state is asked over gRPC
(`tpurun.data_service.state`) every POLL_SECONDS.

* The dispatcher is fault-tolerant when given a --work_dir: it journals its datasets
  and jobs there, and a dispatcher restarted on the same port and work_dir carries on
  with them. Without one, a restart forgets every job: the trainers reading from it
  end at their deadline (exit 69) and resume under new jobs.
* A worker's server is made once its dispatcher answers: TensorFlow's WorkerServer
  does not return until the dispatcher has registered it, and holds the interpreter's
  lock meanwhile (TensorFlow 2.21: no other thread runs, SIGTERM's handler neither).
  It registers under --worker_address (default: this machine's fully qualified name),
  the address trainers on other machines dial; TensorFlow's own default, localhost,
  would send them to themselves.

SIGTERM (or Ctrl-C) stops the server, prints its last line and ends the process with
os._exit: TensorFlow 2.21's DispatchServer can segfault while the interpreter tears
it down after a clean stop (tensorflow/tensorflow#113163), so nothing of TensorFlow is
torn down after the last line. The exit code is tpurun's for SIGTERM, 75 (130 for
Ctrl-C); a server that cannot start (its port taken) exits 1 with one line.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import socket
import sys
import time
from typing import Any

from tpurun import errors
from tpurun.data_service import state
from tpurun.data_service.rpc import Servers, Unanswered
from tpurun.errors import RunError

POLL_SECONDS = 1.0
# How often a worker tells the dispatcher it lives, and learns of new tasks (TensorFlow's
# default is 30 s: a restarted dispatcher would wait that long to know its workers).
HEARTBEAT_MS = 2000
EXIT_INTERRUPTED = 130
# What the dispatcher says of a change of its workers (`tpurun.data_service.state`).
WORKER_CHANGES = {
    state.WORKER_JOINED: "joined",
    state.WORKER_LOST: "lost: it does not answer",
    state.WORKER_BACK: "answers again",
}
STOP_SECONDS = 30.0  # the dispatcher's stop: its calls are short (no waits for elements)


def say(role: str, text: str) -> None:
    """One line of the server's log on stdout: `<UTC time> tpurun data-service <role>: <text>`."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    print(f"{now} tpurun data-service {role}: {text}", flush=True)


def serve(role: str, port: int, work_dir: str = "", dispatcher: str = "", address: str = "") -> int:
    """Runs one server until SIGTERM or Ctrl-C; its exit code (the process ends with it)."""
    try:
        if role == "dispatcher":
            _dispatch(port, work_dir)
        else:
            _work(port, dispatcher, address or socket.getfqdn())
    except errors.TpurunError:
        raise  # the server could not start: one line from the CLI, nothing to tear down
    except BaseException as e:  # noqa: BLE001 - a server ran: every end goes through _end
        # SIGTERM's StoppedBySigterm, or what C code (gRPC's wait) made of it.
        if errors.caused_by_sigterm(e) or errors.sigterm_seen():
            _end(role, "stopped (SIGTERM)", errors.EXIT_PREEMPTED)
        if isinstance(e, KeyboardInterrupt):
            _end(role, "stopped (Ctrl-C)", EXIT_INTERRUPTED)
        _end(role, f"failed: {type(e).__name__}: {' '.join(str(e).split())}", 1)
    raise AssertionError("a server returns only through _end")  # pragma: no cover


def _end(role: str, line: str, code: int) -> None:
    say(role, line)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)  # not the interpreter's teardown of the server: tensorflow#113163


def _started(role: str, port: int, make: Any) -> Any:
    """The server `make()` returns, or RunError with TensorFlow's reason in one line."""
    import tensorflow as tf

    try:
        return make()
    except (tf.errors.OpError, RuntimeError, ValueError) as e:
        reason = " ".join(str(getattr(e, "message", e)).split())
        raise RunError(
            f"the {role} could not start on port {port}: {reason} (another process may hold "
            "the port: choose another with --port)"
        ) from None


def _dispatch(port: int, work_dir: str) -> None:
    import tensorflow as tf

    config = tf.data.experimental.service.DispatcherConfig(
        port=port, work_dir=work_dir or None, fault_tolerant_mode=bool(work_dir)
    )
    server = _started(
        "dispatcher", port, lambda: tf.data.experimental.service.DispatchServer(config)
    )
    durable = (
        f"fault-tolerant: its datasets and jobs are journaled in {work_dir} and a restart on "
        "this port and work_dir carries on with them"
        if work_dir
        else "not fault-tolerant: a restart forgets its jobs (--work_dir keeps them)"
    )
    say(
        "dispatcher",
        f"serving on port {port} ({durable}); trainers set "
        f"--config.data.service=grpc://{socket.getfqdn()}:{port}",
    )
    servers = Servers(f"localhost:{port}")
    before: state.Look | None = None
    try:
        while True:
            _sleep()
            now = state.look(servers, before)
            for change in state.changes(before, now, f"localhost:{port}"):
                if change.what in WORKER_CHANGES:
                    what = WORKER_CHANGES[change.what]
                    say(
                        "dispatcher", f"worker {change.address} {what} ({change.answering} serving)"
                    )
            before = now
    finally:
        servers.close()
        _stop("dispatcher", server)


def _work(port: int, dispatcher: str, host: str) -> None:
    import tensorflow as tf

    address = f"{host}:{port}"
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=dispatcher,
        worker_address=f"{host}:%port%",
        port=port,
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    say("worker", f"starting on port {port} as {address}, for the dispatcher at {dispatcher}")
    servers = Servers(dispatcher)
    server = None
    silent: str | None = None
    tasks = 0
    try:
        while True:
            try:
                servers.workers()
                now_silent = None
            except Unanswered as e:
                now_silent = str(e)
            if now_silent and not silent:
                say("worker", f"the dispatcher at {dispatcher} does not answer ({now_silent})")
            elif silent and not now_silent and server is not None:
                say("worker", f"the dispatcher at {dispatcher} answers again")
            silent = now_silent
            if server is None and not silent:
                # Only now: TensorFlow's WorkerServer registers before it returns, holding
                # the interpreter's lock, so that while its dispatcher is silent nothing
                # else of this process runs, not even SIGTERM's handler.
                server = _started(
                    "worker", port, lambda: tf.data.experimental.service.WorkerServer(config)
                )
                say(
                    "worker",
                    f"registered with the dispatcher at {dispatcher}: serving as {address}",
                )
            serving = _tasks(servers, f"localhost:{port}") if server is not None else None
            if serving is not None and serving != tasks:
                say("worker", f"serving {serving} task(s) (a task: one job's share of its input)")
                tasks = serving
            _sleep()
    finally:
        servers.close()
        # No server.stop(): TensorFlow 2.21's WorkerServer.stop holds the interpreter's lock
        # while gRPC waits for the trainers' calls under way (a GetElement waits for its
        # element), unbounded: found here as a worker that outlived SIGTERM by a minute.
        # The process's end closes the port all the same, and the dispatcher learns of it
        # by the missing heartbeats, as of any lost worker.
        say("worker", "stopping" if server is not None else "stopping (never registered)")


def _sleep() -> None:
    """POLL_SECONDS; then StoppedBySigterm if a SIGTERM came that C code (gRPC's wait for an
    answer) swallowed: it set the flag before raising, and the server must still stop."""
    time.sleep(POLL_SECONDS)
    if errors.sigterm_seen():
        raise errors.StoppedBySigterm()


def _stop(role: str, server: Any) -> None:
    """Stops the server. TensorFlow's stop holds the interpreter's lock while it runs, so no
    Python timer can bound it: faulthandler's watchdog, a thread of C, ends the process
    (exit 1, the stack on stderr) if the stop takes over STOP_SECONDS."""
    say(role, "stopping")
    faulthandler.dump_traceback_later(STOP_SECONDS, exit=True)
    server.stop()
    faulthandler.cancel_dump_traceback_later()


def _tasks(servers: Servers, address: str) -> int | None:
    """The tasks this worker (at `address`) serves; None if it did not answer."""
    try:
        return servers.worker_tasks(address)
    except Unanswered:
        return None
