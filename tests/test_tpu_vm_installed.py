"""tensorflow-tpu and its libtpu, read from the installed distributions (tpurun.tpu_vm.installed).

The mismatch that aborts `import tensorflow` is refused before TensorFlow loads: shown with
a made-up installed set (.dist-info directories first on the path of a process of its own),
the other cases with `version` replaced in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import OFFLINE_ENV, REPO, assert_only_localhost, network_traced

from tpurun.check import command, targets
from tpurun.tpu_vm import installed

LOAD_LIBRARY, LIBRARY_PATH = installed.LOAD_LIBRARY_ENV, installed.LIBRARY_PATH_ENV
# What a loaded libtpu would ask the TPU VM's metadata server, given instead.
TOLD_ITS_TPU = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",
    "TPU_WORKER_ID": "0",
    "TPU_WORKER_HOSTNAMES": "localhost",
}


def fake_distribution(site: Path, name: str, version: str) -> None:
    """An installed distribution as importlib.metadata finds it: its .dist-info/METADATA."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )


def test_tensorflow_tpu_with_jaxs_libtpu_is_one_line_and_exit_2_not_an_abort(tmp_path):
    """tensorflow-tpu 2.20 beside the tpu-compile extra's libtpu 0.0.52 (what a `pip install
    'tpurun[tpu-compile]'` next to it leaves): TensorFlow would abort at import."""
    site = tmp_path / "site"
    for name, version in (("tensorflow-tpu", "2.20.0"), ("libtpu", "0.0.52"), ("jax", "0.10.2")):
        fake_distribution(site, name, version)
    # Without TPU_LOAD_LIBRARY (`make test-tpu-wheel` sets it): were the refusal to miss, a
    # real libtpu would load, told its TPU rather than asking a metadata server.
    env = {**os.environ, **OFFLINE_ENV, **TOLD_ITS_TPU, "PYTHONPATH": f"{site}:{REPO}"}
    for name in (LOAD_LIBRARY, LIBRARY_PATH):
        env.pop(name, None)
    program = (
        "import sys\nfrom tpurun import cli\n"
        "code = cli.main(sys.argv)\n"
        "print('tensorflow imported' if 'tensorflow' in sys.modules else 'no tensorflow')\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program, "train", "--config=iris", f"--model_dir={tmp_path}/m"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout.strip() == "no tensorflow"
    assert result.stderr.splitlines() == [
        "tpurun train: error: tensorflow-tpu 2.20.0 cannot load libtpu 0.0.52: `import "
        "tensorflow` would abort (it loads libtpu 0.0.14 to 0.0.31); install the pair tpurun "
        "is tested with: pip install 'libtpu==0.0.14' (the tpu-compile extra, whose libtpu is "
        "JAX's, needs an environment of its own: docs/tpu.md)"
    ]
    assert not (tmp_path / "m").exists()


@pytest.fixture
def distributions(monkeypatch):
    """`distributions.update(name=version)`: what `installed.version` finds in this process."""
    found: dict[str, str] = {}
    monkeypatch.setattr(installed, "version", found.get)
    for name in (LOAD_LIBRARY, LIBRARY_PATH):
        monkeypatch.delenv(name, raising=False)
    return found


@pytest.mark.parametrize(
    "libtpu, refused",
    [("0.0.13", True), ("0.0.14", False), ("0.0.17.1", False), ("0.0.31", False), ("0.0.32", True)],
)
def test_tensorflow_tpu_2_20_loads_libtpu_0_0_14_to_0_0_31(distributions, libtpu, refused):
    distributions.update({"tensorflow-tpu": "2.20.0", "libtpu": libtpu})
    message = installed.unloadable_libtpu()
    assert (message is not None) == refused
    if refused:
        assert message == (
            f"tensorflow-tpu 2.20.0 cannot load libtpu {libtpu}: `import tensorflow` would abort "
            "(it loads libtpu 0.0.14 to 0.0.31); install the pair tpurun is tested with: "
            "pip install 'libtpu==0.0.14'"
        )


@pytest.mark.parametrize(
    "installed_set, env",
    [
        ({"tensorflow": "2.21.0", "libtpu": "0.0.52"}, {}),  # the CPU wheel loads no libtpu
        ({"tensorflow-tpu": "2.20.0"}, {}),  # no libtpu: TensorFlow finds no TPU, no abort
        ({"tensorflow-tpu": "2.22.0", "libtpu": "0.0.52"}, {}),  # a release tpurun does not know
        ({"tensorflow-tpu": "2.20.0", "libtpu": "0.0.52"}, {LOAD_LIBRARY: "0"}),
        ({"tensorflow-tpu": "2.20.0", "libtpu": "0.0.52"}, {LIBRARY_PATH: "/opt/libtpu.so"}),
    ],
    ids=["cpu_tensorflow", "no_libtpu", "unknown_release", "load_library_0", "library_path"],
)
def test_what_cannot_abort_is_not_refused(distributions, monkeypatch, installed_set, env):
    distributions.update(installed_set)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert installed.unloadable_libtpu() is None


def test_the_pinned_libtpu_is_the_first_tensorflow_tpu_loads(distributions):
    """requirements-tpu.txt's pair (tests/test_packaging.py) is one tpurun lets through."""
    tensorflow, libtpu = installed.TENSORFLOW_TPU, installed.LIBTPU
    assert installed.RUNS_WITH[tensorflow.rsplit(".", 1)[0]][0] == libtpu
    distributions.update({"tensorflow-tpu": tensorflow, "libtpu": libtpu})
    assert installed.unloadable_libtpu() is None


def test_check_target_beside_tensorflow_tpu_says_in_one_line_where_the_compiler_runs(
    distributions,
):
    distributions.update({"tensorflow-tpu": "2.20.0", "libtpu": "0.0.14"})
    sizer, note = command.tpu_sizer(targets.parse("v5e-8"))
    assert sizer is None
    assert note == (
        "the TPU compiler needs an environment of its own: the tpu-compile extra brings JAX's "
        "libtpu, which tensorflow-tpu 2.20.0 cannot load beside its own; to size each step with "
        "it, `python3 -m venv ~/tpurun-check && ~/tpurun-check/bin/pip install "
        "'tpurun[tpu-compile]'` and run this check with ~/tpurun-check/bin/tpurun"
    )


def test_check_target_beside_tensorflow_tpu_is_one_line_with_the_fix(monkeypatch, tpurun_cli):
    """tensorflow-tpu 2.20 compiles XLA for the TPU only: no step can be sized beside it (under
    `make test-tpu-wheel` for real; under `make test`, that environment stood in for)."""
    if installed.tensorflow_tpu() is None:
        from tpurun.check.rules import xla

        tpu_only = "tensorflow-tpu 2.20.0 compiles XLA for the TPU only, not the CPU"
        monkeypatch.setattr(xla, "cpu_compiler_missing", lambda: tpu_only)
        monkeypatch.setattr(installed, "tensorflow_tpu", lambda: "2.20.0")
        monkeypatch.setenv(LOAD_LIBRARY, "0")  # as `make test-tpu-wheel` runs (no libtpu check)
    result = tpurun_cli("check", "--config=iris", "--target=v5e-8")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "tpurun check: error: --target=v5e-8 cannot be sized here: tensorflow-tpu 2.20.0 "
        "compiles XLA for the TPU only, not the CPU; the TPU compiler needs an environment of "
        "its own: the tpu-compile extra brings JAX's libtpu, which tensorflow-tpu 2.20.0 cannot "
        "load beside its own; to size each step with it, `python3 -m venv ~/tpurun-check && "
        "~/tpurun-check/bin/pip install 'tpurun[tpu-compile]'` and run this check with "
        "~/tpurun-check/bin/tpurun"
    )
    assert result.stdout == ""  # nothing traced, nothing printed before the line


@pytest.mark.skipif(
    installed.tensorflow_tpu() is None,
    reason="the `tensorflow` wheel loads no libtpu: `make test-tpu-wheel` runs this",
)
def test_tensorflow_tpu_with_libtpu_told_its_tpu_sends_nothing_beyond_localhost(tmp_path):
    """tensorflow-tpu with libtpu loaded (no TPU_LOAD_LIBRARY=0), told its TPU as every test
    that may load it does: every connection of the process, traced, is to 127.0.0.1 (a
    libtpu left to itself asks the TPU VM metadata server, for minutes where none answers)."""
    log = tmp_path / "strace.log"
    env = {k: v for k, v in os.environ.items() if k != LOAD_LIBRARY}
    env.update({**OFFLINE_ENV, **TOLD_ITS_TPU})
    program = "import tensorflow as tf; print(tf.config.list_physical_devices('TPU_SYSTEM'))"
    result = subprocess.run(
        [*network_traced(log), sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "TPU_SYSTEM" in result.stdout  # libtpu loaded
    assert_only_localhost(log.read_text())
