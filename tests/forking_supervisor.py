"""`tpurun train --max_restarts=N` whose trainers are forks of it, not fresh interpreters.

    python tests/forking_supervisor.py BACKOFF train FLAG...

Started by tests/test_supervisor.py through `forked.Popen` (a fork of a process that has
TensorFlow, Keras and tpurun imported and ran no TensorFlow op), this is tpurun's own CLI
and Supervisor with its first backoff (tpurun.supervisor.restarts.BACKOFF) set to BACKOFF seconds,
and one change: each trainer the supervisor starts (`[python, -m, tpurun, train, ...]`,
`tpurun.supervisor.restarts.child_argv`'s command) is a fork of this process that runs that command
as `python -m tpurun` would, instead of a new interpreter that spends ~5 CPU-s importing
TensorFlow again. The rest is what subprocess.Popen gives the supervisor: the trainer is
its child (its pid, its exit status from waitpid, -N for a signal), in a session of its
own, with the environment given, the supervisor's preexec_fn run (SIGTERM when the
supervisor dies) and the progress pipe (pass_fds) kept open. Its SIGTERM and SIGINT
handlers are a fresh interpreter's, not the supervisor's.

What it is not: a trainer that imports TensorFlow after it was started (a kill during
that import is tests/test_supervisor.py's named-TPU test's, which keeps fresh
interpreters).
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import warnings

from forked.server import exit_code  # the interpreter's, as a forked child's

import tpurun.supervisor.restarts


class ForkedTrainer:
    """The part of subprocess.Popen the supervisor uses, for a forked `python -m tpurun ...`."""

    def __init__(
        self,
        args,
        *,
        env,
        start_new_session=False,
        preexec_fn=None,
        pass_fds=(),
    ):
        assert list(args[:3]) == [sys.executable, "-m", "tpurun"], args
        del pass_fds  # a fork keeps every descriptor the supervisor has open, the pipe too
        self.args = args
        self.returncode: int | None = None
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # a fork with threads running
            pid = os.fork()
        if pid == 0:
            os._exit(_trainer(list(args[3:]), env, start_new_session, preexec_fn))
        self.pid = pid

    def _ended(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by a wait() this poll interrupted
                return self.returncode
            if pid:
                self._ended(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        assert timeout is None
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:  # reaped by a poll() from a signal handler meanwhile
                if self.returncode is None:
                    raise
                break
            self._ended(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def _trainer(args: list[str], env: dict, new_session: bool, preexec_fn) -> int:
    """In the forked child: `python -m tpurun ARGS` to its end, then as an interpreter
    ends (non-daemon threads joined, atexit run, streams flushed); its exit code."""
    code = 1
    try:
        tpurun.supervisor.restarts.subprocess = (
            subprocess  # the supervisor's own again, unused here
        )
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if new_session:
            os.setsid()
        if preexec_fn is not None:
            preexec_fn()
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # found again from TMPDIR, as a new interpreter does
        sys.argv = ["-m", *args]
        sys.modules.pop("tpurun.__main__", None)  # this supervisor's, imported as a module
        try:
            runpy.run_module("tpurun", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = exit_code(e)
        except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit 1
            traceback.print_exc()
        threading._shutdown()  # noqa: SLF001 - the interpreter's join of non-daemon threads
        atexit._run_exitfuncs()  # noqa: SLF001
    except BaseException:  # noqa: BLE001 - never back into the supervisor's stack
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed stream: nothing to flush
                pass
    return code


if __name__ == "__main__":
    tpurun.supervisor.restarts.BACKOFF = float(sys.argv.pop(1))
    tpurun.supervisor.restarts.subprocess = type(
        "ForkingSubprocess", (), {"Popen": ForkedTrainer}
    )  # only the supervisor's module: nothing else in this process forks this way
    sys.argv[0] = "tpurun"
    from tpurun.__main__ import main

    try:
        main()
        code = 0
    except SystemExit as e:
        code = exit_code(e)
    # Ends as the real supervisor, which has no TensorFlow to tear down, ends: at once (a
    # finalisation of this process's imports takes seconds, not the run's).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
