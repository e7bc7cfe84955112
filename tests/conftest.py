"""Shared test helpers: run the real CLI in a subprocess, with no traffic leaving 127.0.0.1."""

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
