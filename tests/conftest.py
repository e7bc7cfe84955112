"""Shared test helpers: run the real CLI, in this process or in a subprocess, offline.

Two ways to run `tpurun ...`, with the same result type (a CompletedProcess):

* the `tpurun_cli` fixture (`tpurun_in_process` in fixtures of a wider scope)
  calls `tpurun.cli.main` in this process: the same code path as the console
  script, without the 3 seconds a subprocess spends importing TensorFlow. Use it
  for every CLI scenario that does not need a process of its own;
* `run_tpurun` runs `python -m tpurun` in a process of its own: for what needs one
  (signals, kills, the watchdog's os._exit, multi-worker clusters). By default it is
  forked from a server that imported TensorFlow and tpurun once (tests/forked, ~8
  CPU-seconds saved a process); `fresh=True` starts a new interpreter, for what a
  fresh process imports or prints at start-up. `forked.Popen` is subprocess.Popen's
  counterpart for the tests that watch or kill the process as it runs.

The CPU of this test process is split into IN_PROCESS_REPLICAS logical devices
before TensorFlow initialises, so in-process runs with `--num_shards` up to that
many work as in a fresh process.

Unit tests never wait on the wall clock (tests/fakes.py has a FakeClock), and no
test may leave a process it started running (`no_process_left_behind`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging as std_logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import tpurun  # noqa: F401 - first: it keeps jax out of this process, before TensorFlow loads

# Google libraries probe the metadata server and googleapis.com on their own: the
# same closed local port as the scripts' (one definition, in scripts/offline_env.py).
from scripts.offline_env import OFFLINE_ENV, free_local_ports  # noqa: F401 - for the tests

os.environ.update(OFFLINE_ENV)
os.environ.pop("TPU_NAME", None)
# Every process of the suite reads gs:// state fresh: TensorFlow's GCS file system
# otherwise answers a stat, exists or isdir from what it saw up to 5 seconds before
# (and a glob too where GCS_MATCHING_PATHS_CACHE_MAX_AGE is set), so a test that
# looks again at a path another process changed would pass or fail with the machine's
# speed. Read once, when TensorFlow is imported: here, before this process imports it,
# and inherited by every process a test starts. (tpurun sets the first itself, unless
# a user set it: docs/storage.md; the suite's value holds whatever the user's.)
FRESH_GCS_READS = {"GCS_STAT_CACHE_MAX_AGE": "0", "GCS_MATCHING_PATHS_CACHE_MAX_AGE": "0"}
os.environ.update(FRESH_GCS_READS)
# The FLOPs of a train's step are counted at its end (an XLA compile: a second or more);
# the suite trains hundreds of times, and only tests/test_supervisor.py asks for them.
os.environ["TPURUN_COUNT_FLOPS"] = "0"
# XLA's CPU compiles (check's XLA rules and memory estimate, the XLA host loop) with LLVM at
# -O0: the suite's programs run a few steps at most, and LLVM's optimisation is much of such
# a compile (12% of the CPU of test_check_preflight, test_device_data and test_check_memory
# together). The estimates they pin to the byte are the same at -O0. A user's XLA_FLAGS
# are kept, and every process a test starts inherits them.
os.environ["XLA_FLAGS"] = " ".join(
    filter(None, (os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"))
)

if TYPE_CHECKING:
    from fake_gcs.server import GcsServer

REPO = Path(__file__).resolve().parent.parent
IN_PROCESS_REPLICAS = 8


_EXIT_STATUS: list[int] = []

# The files that take longest (seconds of wall time each in a 3-worker run, measured with
# each test's wall time summed per file, idle, 2026-11-28), started first: `--dist loadfile` hands
# files to the workers in collection order, so a long file collected last (the alphabet
# puts test_user_gan there) keeps one worker busy while the others have ended. Longest
# first, the workers end nearly together. A file not listed keeps its place after these.
LONGEST_FILES = (
    "test_check_preflight.py",  # 146 s before its fashion_mnist run stopped sizing (-20)
    "test_check_tpu_compiler.py",  # 115
    "test_models_resnet50.py",  # 115
    "test_user_gan.py",  # 110
    "test_gcs_life.py",  # 96
    "test_device_data.py",  # 77
    "test_recipes.py",  # 66
    "test_models_wgan_gp.py",  # 64
    "test_multiworker.py",  # 59
    "test_supervisor.py",  # 59
    "test_data_service.py",  # 77 (most of it waiting on its servers and trainers)
    "test_gcs_failures.py",  # 58
    "test_resume.py",  # 56
    "test_check.py",  # 49
    "test_datasets.py",  # 45
    "test_terminal.py",  # 42
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The LONGEST_FILES first, longest first; the tests of a file keep their order."""
    rank = {name: n for n, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))


def pytest_sessionfinish(session, exitstatus) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(wrapper=True)
def pytest_unconfigure(config) -> Iterator[None]:
    """Ends the `pytest` process at once, once pytest has reported everything.

    Python's shutdown then tears down every TensorFlow object the in-process runs
    made (functions, graphs, datasets on 8 logical devices): minutes of a 2-core
    machine's time after a full run, for nothing. Not in an xdist worker (its
    controller waits for it to finish properly) nor when pytest.main() was called by
    another program (it gets control back).
    """
    # First, whatever ends the process: a garbage collection would walk every object the
    # session's runs left, for nothing: pytest's unraisable-exception plugin collects as it
    # ends (about 3 CPU-seconds at the end of an xdist worker, py-spy), and Python again
    # at exit. What a finaliser raises during a test is still reported with that test.
    gc.freeze()
    yield
    command = os.path.basename(sys.argv[0]) if sys.argv else ""
    invoked = command in ("pytest", "py.test") or sys.argv[0].endswith("pytest/__main__.py")
    if not invoked or hasattr(config, "workerinput") or not _EXIT_STATUS:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[-1])


def _split_cpu() -> None:
    import tensorflow as tf

    from tpurun.cluster import strategy

    strategy.split_cpu(IN_PROCESS_REPLICAS)  # before any TensorFlow op of the session
    # And TensorFlow initialised with it now: until then a later split (an in-process
    # `--num_shards=2` run first in the session) would silently replace this one.
    assert len(tf.config.list_logical_devices("CPU")) == IN_PROCESS_REPLICAS


@pytest.hookimpl(trylast=True)  # after xdist's, which registers the controller's dsession
def pytest_configure(config) -> None:
    """Splits the CPU in every process that runs tests, before their collection.

    Not in xdist's controller: it hands the tests to its workers and runs none, and
    TensorFlow's import there (7 CPU-seconds) delayed the workers' start by as much.
    """
    if not config.pluginmanager.has_plugin("dsession"):
        _split_cpu()


@functools.cache
def _xla_cpu_missing() -> str | None:
    from tpurun.check.rules import xla

    return xla.cpu_compiler_missing()


# Tests of what XLA compiles for the CPU (check's estimate, the compiled host loop, bit-for-bit
# twins): tensorflow-tpu 2.20 (`make test-tpu-wheel`) compiles XLA for the TPU only, and
# tpurun says so there instead (tests/test_tpu_vm_installed.py). Asked when such a test
# starts, not when this module is imported: xdist's controller never imports TensorFlow.
needs_xla_cpu = pytest.mark.needs_xla_cpu


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_xla_cpu") and (missing := _xla_cpu_missing()):
        pytest.skip(f"{missing}: tested by `make test`")


def _is_users_module(module) -> bool:
    """A module from a test's own files: not the standard library, a package, or tpurun's."""
    file = getattr(module, "__file__", None) or ""
    return bool(file) and not file.startswith((sys.prefix, sys.base_prefix, str(REPO)))


@contextlib.contextmanager
def _captured_output() -> Iterator[dict[str, str]]:
    """Captures stdout and stderr at the file descriptors (TensorFlow's C++ writes there too).

    Yields a dict that holds "out" and "err" once the block ends. Works at any
    fixture scope, under pytest's own capturing or without it (`-s`): the
    descriptors and sys.stdout/sys.stderr are put back as they were.
    """
    captured: dict[str, str] = {}
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved_fds = [os.dup(1), os.dup(2)]
        saved_streams = sys.stdout, sys.stderr
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        # Left open afterwards (they do not own the fds): a log handler made during the
        # run keeps writing through its stream to fd 1 or 2, as in a process of its own.
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        try:
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds, strict=True):
                os.dup2(saved, fd)
                os.close(saved)
            for name, file in (("out", out), ("err", err)):
                file.seek(0)
                captured[name] = file.read().decode(errors="replace")


def tpurun_in_process(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    """Runs `tpurun args...` through `tpurun.cli.main` in this process; a CompletedProcess.

    Each run starts as a new process would: in `cwd` (default: the current
    directory), with `env` added to the environment, a fresh Keras session (layer
    names, global policy), and stdout/stderr captured at the file descriptors
    (absl's log handler keeps the stream it was made with, so it is pointed at
    the captured one for the run). Afterwards the user's modules, models and
    sys.path entries its config brought, and the log levels it set, are gone again.
    Usable from fixtures of any scope; tests take it as the `tpurun_cli` fixture.
    """
    import keras
    from absl import logging as absl_logging

    from tpurun import cli
    from tpurun.model import registry

    # A user's model registered by this run, and the modules and sys.path entry its
    # config brought, end with it, as they would with its process.
    registered, path, modules = dict(registry._REGISTRY), list(sys.path), set(sys.modules)
    levels = std_logging.root.level, absl_logging.get_absl_logger().level
    with pytest.MonkeyPatch.context() as patch:
        if cwd is not None:
            patch.chdir(cwd)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        # Without its gc.collect(): 0.3 CPU-s a call once a worker holds a few models, and
        # Python's own collector frees the same.
        keras.backend.clear_session(free_memory=False)
        keras.mixed_precision.set_global_policy("float32")
        handler = absl_logging.get_absl_handler().python_handler
        stream = handler.stream
        with _captured_output() as captured:
            handler.setStream(sys.stderr)
            try:
                code = cli.main(["tpurun", *args])
            finally:
                handler.setStream(stream)
                sys.path[:] = path
                for name in set(sys.modules) - modules:
                    if _is_users_module(sys.modules[name]):
                        del sys.modules[name]
                for name, cls in list(registry._REGISTRY.items()):
                    if name not in registered and cls.__module__ not in sys.modules:
                        del registry._REGISTRY[name]
                std_logging.root.setLevel(levels[0])
                absl_logging.get_absl_logger().setLevel(levels[1])
    return subprocess.CompletedProcess(["tpurun", *args], code, captured["out"], captured["err"])


@pytest.fixture
def tpurun_cli():
    """`tpurun_cli(*args, cwd=..., env=...)`: `tpurun_in_process` (the CLI in this process)."""
    return tpurun_in_process


def _running_children() -> set[int]:
    """The processes this test process started that still run (a zombie has ended: only
    not reaped yet): its children, and the forked server's (tests/forked), which are the
    test's though the server is their parent."""
    import forked

    server = forked.server_pid()
    pids = _children("self") | (_children(str(server)) if server else set())
    if server:
        pids.discard(server)
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            running.add(pid)
    return running


def _children(process: str) -> set[int]:
    """The children of every thread of `process`, read before and after every test: with
    plain os calls, as pathlib's glob took 2.6x the CPU (2% of the xdist workers' time)."""
    pids: set[int] = set()
    tasks = f"/proc/{process}/task"
    try:
        threads = os.listdir(tasks)
    except OSError:  # the process ended meanwhile
        return pids
    for thread in threads:
        try:
            with open(f"{tasks}/{thread}/children", "rb") as children:
                pids.update(map(int, children.read().split()))
        except OSError:  # the thread ended meanwhile
            continue
    return pids


# Processes the session's fixtures keep running across tests (the GCS server): the
# first test to use such a fixture starts it, and it is not that test's leftover.
_SESSION_PROCESSES: set[int] = set()


def _tpu_compiler() -> set[int]:
    """The TPU compiler's process, which `tpurun check --target` keeps for the process's
    next checks (tpurun.check.sizing.tpu_compiler.client.shared): the session's, like a server."""
    client = sys.modules.get("tpurun.check.sizing.tpu_compiler.client")
    shared = getattr(client, "_SHARED", None)
    pid = shared.pid if shared is not None else None
    return {pid} if pid else set()


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Fails a test that leaves a process it started running (and kills that process)."""
    before = _running_children()
    yield
    left = _running_children() - before - _SESSION_PROCESSES - _tpu_compiler()
    if not left:
        return
    commands = {}
    for pid in left:
        try:
            commands[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # a forked server's child: its server reaps it
        except (OSError, ChildProcessError):
            pass
    pytest.fail(f"the test left processes running (now killed): {commands}")


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Scalar summaries by tag, read back as TensorBoard reads them: [(step, value)]."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0}
    ).Reload()
    return {
        tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]
        for tag in accumulator.Tags()["tensors"]
    }


def network_traced(log: Path) -> tuple[str, ...]:
    """strace, tracing a process's and its children's network calls into `log`, as the start
    of its command; skips the test where strace is not installed (CI's image has it)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed here")
    return (strace, "-f", "-qq", "-e", "trace=connect,sendto,sendmsg", "-o", str(log))


def assert_only_localhost(calls: str) -> None:
    """Every address in an strace log of `network_traced` is this machine's loopback."""
    addresses = re.findall(r'sin6?_addr=inet_(?:pton\(AF_INET6, )?(?:addr\()?"([^"]+)"', calls)
    assert all(a in ("127.0.0.1", "::1") for a in addresses), calls
    assert "AF_INET" not in calls.replace("AF_INET6", "") or addresses, calls


@contextlib.contextmanager
def metadata_server_watched() -> Iterator[tuple[dict[str, str], list[bool]]]:
    """A GCE metadata server on 127.0.0.1 that answers nobody and notes who called.

    Yields (env, asked): the environment that points Google's libraries at it (pass
    it to the run), and a list that holds, once the block ends, whether anything
    connected. "Fails without waiting on the metadata server" then holds on a
    machine of any speed: it never asked.
    """
    asked: list[bool] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        address = "{}:{}".format(*server.getsockname())
        yield {"GCE_METADATA_HOST": address, "GCE_METADATA_IP": address}, asked
        try:
            server.accept()[0].close()
            asked.append(True)
        except BlockingIOError:  # no connection waits to be accepted
            asked.append(False)


def capture_info_logs(caplog) -> None:
    """caplog gets INFO records, absl's too: absl's flag parsing can leave its logger at WARNING."""
    caplog.set_level(std_logging.INFO)
    caplog.set_level(std_logging.INFO, logger="absl")


def run_tpurun(
    *args: str,
    cwd: str | os.PathLike | None = None,
    env: dict | None = None,
    timeout: int = 300,
    console_script: bool = False,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """Runs `tpurun args...` in a process of its own; returns the finished process (never
    raises).

    The process is forked from a server that imported TensorFlow and tpurun once
    (tests/forked), unless `fresh`: a new interpreter, for a test whose subject is
    start-up itself (what it imports or prints, signals during it, environment
    variables read at import). `console_script`: the installed `tpurun` script (fresh)
    rather than `python -m tpurun`, which also puts the working directory on sys.path
    (a user's `tpurun` does not).
    """
    import forked

    full_env = {**os.environ, **OFFLINE_ENV, **(env or {})}
    command = (
        [str(Path(sys.executable).with_name("tpurun"))]
        if console_script
        else [sys.executable, "-m", "tpurun"]
    )
    starts = subprocess.run if fresh or console_script else forked.run
    return starts(
        [*command, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    """The `tpurun ...: error:` lines on stderr."""
    return [line for line in result.stderr.splitlines() if ": error: " in line]


USAGE, RUN_FAILURE = 2, 1  # the exit codes of tpurun.errors


def assert_fails(result: subprocess.CompletedProcess, exit_code: int, *keywords: str) -> str:
    """Exit code, exactly one `error:` line containing every keyword, no traceback."""
    report = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == exit_code, report
    assert "Traceback" not in result.stderr, report
    lines = error_lines(result)
    assert len(lines) == 1, report
    missing = [k for k in keywords if k not in lines[0]]
    assert not missing, f"{missing} not in {lines[0]!r}"
    assert result.stdout == "", "an error must not print results"
    return lines[0]


def contents(directory: Path) -> set[str]:
    """Every path below `directory`, relative to it."""
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def short_input_check(patch: pytest.MonkeyPatch) -> None:
    """`tpurun check --target`'s input measured for half a second, not 2 s
    (tpurun.check.bounds.host_input): a test checks what is reported, not how exact it is."""
    from tpurun.check.bounds import host_input

    patch.setattr(host_input, "MEASURE_SECONDS", 0.5)
    patch.setattr(host_input, "WARMUP_SECONDS", 0.2)


@pytest.fixture(scope="session")
def trained_iris(tmp_path_factory) -> Path:
    """An Iris model_dir trained with the default config (1000 steps), shared by read-only tests."""
    model_dir = tmp_path_factory.mktemp("iris") / "model"
    assert_ok(
        tpurun_in_process("train", "--config=iris", "--use_tpu=false", f"--model_dir={model_dir}")
    )
    return model_dir


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory) -> Iterator[GcsServer]:
    """A GCS server on 127.0.0.1 (tests/fake_gcs) for the whole session, started on first use.

    Its `env` goes into this process's environment, so that gs:// paths here
    (`tpurun.cli.main`, tf.io.gfile, pandas) land on it as they do in the subprocesses
    that `run_tpurun` starts. TensorFlow and gcsfs read these variables at each
    request, so this works after gs:// was first used too. They are left set when the
    session ends: a late request (a summary writer flushing at exit) then meets the
    proxy's closed local port rather than Google's hosts.
    """
    from fake_gcs.server import GcsServer  # here: only the tests that use it need its packages

    with GcsServer(tmp_path_factory.mktemp("gcs")) as server:
        if server.pid is not None:
            _SESSION_PROCESSES.add(server.pid)
        os.environ.update(server.env)
        yield server


@pytest.fixture
def gcs(gcs_server: GcsServer) -> Iterator[GcsServer]:
    """The session's GCS server, with no faults and an empty request log at the test's start."""
    gcs_server.clear_faults()
    gcs_server.reset_requests()
    yield gcs_server
    gcs_server.clear_faults()


@pytest.fixture
def bucket(gcs: GcsServer, request) -> str:
    """A new empty bucket for this test, named after it: 'gs://<name>'."""
    return gcs.make_bucket(request.node.name)


# The garbage collector's scans: the objects a worker holds as a test module starts (TensorFlow's,
# every earlier test's) are kept out of them until the module ends (`gc.freeze`), and those of
# the module's earlier tests as each test starts. A full collection walks every object of the
# process: 0.3 CPU-s and more each time, paid at every clear_session() and at each of Python's
# own full collections while TensorFlow traces; most of what a help or a usage error cost.
# Garbage among the frozen objects is collected when the module ends.


@pytest.fixture(scope="module", autouse=True)
def _gc_frozen_module() -> Iterator[None]:
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _gc_frozen(_gc_frozen_module) -> None:
    gc.freeze()
