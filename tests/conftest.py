"""Shared test helpers: run the real CLI, in this process or in a subprocess, offline.

Two ways to run `tpurun ...`, with the same result type (a CompletedProcess):

* the `tpurun_cli` fixture calls `tpurun.cli.main` in this process: the same code
  path as the console script, without the 3 seconds a subprocess spends importing
  TensorFlow. Use it for every CLI scenario that does not need a process of its
  own;
* `run_tpurun` starts `python -m tpurun`: for what needs one (signals, kills, the
  watchdog's os._exit, multi-worker clusters, what a fresh process imports or prints
  at start-up).

The CPU of this test process is split into IN_PROCESS_REPLICAS logical devices
before TensorFlow initialises, so in-process runs with `--num_shards` up to that
many work as in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# Google libraries probe the metadata server and googleapis.com on their own: the
# same closed local port as the scripts' (one definition, in scripts/offline_env.py).
from scripts.offline_env import OFFLINE_ENV, free_local_ports  # noqa: F401 - for the tests

os.environ.update(OFFLINE_ENV)
os.environ.pop("TPU_NAME", None)

if TYPE_CHECKING:
    from fake_gcs.server import GcsServer

REPO = Path(__file__).resolve().parent.parent
IN_PROCESS_REPLICAS = 8


def _split_cpu() -> None:
    from tpurun import strategy

    strategy.split_cpu(IN_PROCESS_REPLICAS)  # before any TensorFlow op of the session


_split_cpu()


def _is_users_module(module) -> bool:
    """A module from a test's own files: not the standard library, a package, or tpurun's."""
    file = getattr(module, "__file__", None) or ""
    return bool(file) and not file.startswith((sys.prefix, sys.base_prefix, str(REPO)))


@pytest.fixture
def tpurun_cli(capfd, monkeypatch):
    """`tpurun_cli(*args, cwd=..., env=...)`: runs the CLI in this process; a CompletedProcess.

    Each run starts as a new process would: in `cwd` (default: the current
    directory), with `env` added to the environment, a fresh Keras session (layer
    names, global policy), and stdout/stderr captured at the file descriptors
    (absl's log handler keeps the stream it was made with, so it is pointed at
    the captured one for the run).
    """
    import keras
    from absl import logging as absl_logging

    from tpurun import cli
    from tpurun import model as model_lib

    def run(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
        # A user's model registered by this run, and the modules and sys.path entry its
        # config brought, end with it, as they would with its process.
        registered, path, modules = dict(model_lib._REGISTRY), list(sys.path), set(sys.modules)
        with monkeypatch.context() as patch:
            if cwd is not None:
                patch.chdir(cwd)
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            keras.backend.clear_session()
            keras.mixed_precision.set_global_policy("float32")
            capfd.readouterr()  # what came before is not this run's
            handler = absl_logging.get_absl_handler().python_handler
            stream = handler.stream
            handler.setStream(sys.stderr)
            try:
                code = cli.main(["tpurun", *args])
            finally:
                handler.setStream(stream)
                sys.stdout.flush()
                sys.stderr.flush()
                sys.path[:] = path
                for name in set(sys.modules) - modules:
                    if _is_users_module(sys.modules[name]):
                        del sys.modules[name]
                for name, cls in list(model_lib._REGISTRY.items()):
                    if name not in registered and cls.__module__ not in sys.modules:
                        del model_lib._REGISTRY[name]
            out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["tpurun", *args], code, out, err)

    return run


def run_tpurun(
    *args: str,
    cwd: str | os.PathLike | None = None,
    env: dict | None = None,
    timeout: int = 300,
    console_script: bool = False,
) -> subprocess.CompletedProcess:
    """Runs `tpurun args...` as a user would; returns the finished process (never raises).

    `console_script`: run the installed `tpurun` script rather than `python -m tpurun`,
    which also puts the working directory on sys.path (a user's `tpurun` does not).
    """
    full_env = {**os.environ, **OFFLINE_ENV, **(env or {})}
    command = (
        [str(Path(sys.executable).with_name("tpurun"))]
        if console_script
        else [sys.executable, "-m", "tpurun"]
    )
    return subprocess.run(
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


@pytest.fixture(scope="session")
def trained_iris(tmp_path_factory) -> Path:
    """An Iris model_dir trained with the default config (1000 steps), shared by read-only tests."""
    model_dir = tmp_path_factory.mktemp("iris") / "model"
    assert_ok(run_tpurun("train", "--config=iris", "--use_tpu=false", f"--model_dir={model_dir}"))
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
