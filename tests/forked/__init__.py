"""`python -m tpurun ...` in a process of its own, without importing TensorFlow again.

Every tpurun process spends about 8 CPU-seconds importing TensorFlow, Keras and tpurun
before its first line of work; the suite starts dozens (the killed runs, the workers of
a cluster, the sidecars). `Popen` and `run` here take the same arguments as
subprocess's for a `[sys.executable, ...]` command (`-m module`, `-c code` or a script)
and give a real process of its own: a fork of a server (`server.py`, one per test
process, started on first use) that imported all of that once and ran no TensorFlow op,
so the child still sets up its devices as a fresh process does. It has its own pid
(signals reach it there), its own session if asked, the environment and working
directory given, and ends as a `python` process ends; its exit status comes back from
the server, which reaped it.

What it is not: a fresh interpreter. A test whose subject is what happens before or
while TensorFlow is imported (start-up signals, what start-up prints, the checks that
run before TensorFlow loads, environment variables read at import) keeps
`subprocess`.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT
_SERVER = Path(__file__).with_name("server.py")
_lock = threading.Lock()
_server: tuple[subprocess.Popen, str] | None = None


def _server_socket() -> str:
    """The socket of this test process's server, started (once) on first use."""
    global _server
    with _lock:
        if _server is None or _server[0].poll() is not None:
            directory = tempfile.mkdtemp(prefix="tpurun-forked-")
            path = os.path.join(directory, "socket")
            process = subprocess.Popen(
                [sys.executable, str(_SERVER), path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert process.stdout is not None
            ready = process.stdout.readline()
            if ready.strip() != "ready":
                process.kill()
                process.wait()
                raise RuntimeError(f"tests/forked/server.py did not start: {ready!r}")
            _server = (process, path)
            atexit.register(_stop, process, directory)
        return _server[1]


def server_pid() -> int | None:
    """The server's pid, once started (a session process, not a test's leftover)."""
    return _server[0].pid if _server is not None else None


def _stop(process: subprocess.Popen, directory: str) -> None:
    process.kill()
    process.wait()
    try:
        os.unlink(os.path.join(directory, "socket"))
        os.rmdir(directory)
    except OSError:
        pass


def _parse(args: list[str]) -> tuple[str, str, list[str]]:
    """(mode, target, arguments) of `[python, options..., -m X | -c CODE | script, args...]`."""
    rest = [str(a) for a in args[1:]]
    while rest and rest[0] in ("-u", "-B", "-E"):
        rest = rest[1:]
    if rest[0] in ("-m", "-c"):
        return rest[0], rest[1], rest[2:]
    return "script", rest[0], rest[1:]


class Popen:
    """subprocess.Popen's interface for a forked `[sys.executable, ...]` command."""

    def __init__(
        self,
        args,
        *,
        stdin=None,
        stdout=None,
        stderr=None,
        env=None,
        cwd=None,
        text=False,
        universal_newlines=None,
        start_new_session=False,
        bufsize=-1,
    ):
        self.args = args
        self.returncode: int | None = None
        text = text or bool(universal_newlines)
        mine: list[int] = []  # the child's ends, closed once sent
        self.stdin = self.stdout = self.stderr = None

        def child_end(spec, index: int) -> int:
            if spec is None:
                return index
            if spec == DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                mine.append(fd)
                return fd
            if spec == PIPE:
                read, write = os.pipe()
                ours, theirs = (write, read) if index == 0 else (read, write)
                mine.append(theirs)
                mode = ("w" if index == 0 else "r") + ("" if text else "b")
                stream = open(ours, mode, buffering=-1 if text or index else 0)  # noqa: SIM115
                setattr(self, ("stdin", "stdout", "stderr")[index], stream)
                return theirs
            return spec if isinstance(spec, int) else spec.fileno()

        fds = [child_end(stdin, 0), child_end(stdout, 1)]
        fds.append(fds[1] if stderr == STDOUT else child_end(stderr, 2))
        request = {
            "argv": _parse(list(args)),
            "env": dict(os.environ if env is None else env),
            "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()),
            "new_session": bool(start_new_session),
        }
        data = json.dumps(request).encode()
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._socket.connect(_server_socket())
            socket.send_fds(self._socket, [struct.pack("!Q", len(data))], fds)
            self._socket.sendall(data)
        finally:
            for fd in mine:
                os.close(fd)
        self._answers = self._socket.makefile("rb")
        self.pid = json.loads(self._answers.readline())["pid"]

    # --- the child's end ----------------------------------------------------------

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._socket], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._socket], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        line = self._answers.readline()
        if not line:
            raise RuntimeError("tests/forked/server.py went away before its child ended")
        status = json.loads(line)["status"]
        self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        self._answers.close()
        self._socket.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def communicate(self, input=None, timeout: float | None = None):  # noqa: A002
        """Popen.communicate: writes `input`, reads stdout and stderr to their ends, waits."""
        if not hasattr(self, "_read"):
            self._read: dict[str, list] = {}
            self._readers = []
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                if stream is not None:
                    chunks: list = []
                    self._read[name] = chunks
                    reader = threading.Thread(
                        target=lambda s=stream, c=chunks: c.append(s.read()), daemon=True
                    )
                    reader.start()
                    self._readers.append(reader)
            if self.stdin is not None:
                try:
                    if input:
                        self.stdin.write(input)
                    self.stdin.close()
                except BrokenPipeError:
                    pass
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None:
                stream.close()
        return tuple(
            (self._read[name][0] if self._read.get(name) else None) for name in ("stdout", "stderr")
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for stream in (self.stdin, self.stdout, self.stderr):
            if isinstance(stream, io.IOBase) and not stream.closed:
                stream.close()
        self.wait()


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **popen):  # noqa: A002
    """subprocess.run for a forked `[sys.executable, ...]` command."""
    if capture_output:
        popen["stdout"] = popen["stderr"] = PIPE
    if input is not None:
        popen["stdin"] = PIPE
    process = Popen(args, **popen)
    try:
        stdout, stderr = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    result = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result
