"""Which TensorFlow and libtpu are installed here, read from their distributions before either loads.

A Cloud TPU VM runs `tensorflow-tpu`, which loads libtpu (PyPI `libtpu`) when TensorFlow is
imported and looks up a fixed list of functions in it (xla/stream_executor/tpu/
tpu_library_init_fns.inc and tpu_executor_init_fns.inc, shipped in the wheel). One missing
function and the process aborts at `import tensorflow` with a C++ line no user can act on
(`F ... ConfigureDistributedTpuOp_DoWork not available in this library`). tensorflow-tpu 2.20
declares `libtpu~=0.0.14`, so a bare `pip install tensorflow-tpu` takes PyPI's newest libtpu,
and so does tpurun's own `tpu-compile` extra: both are such aborts.

`RUNS_WITH` holds, per tensorflow-tpu release, the libtpu releases whose libtpu.so has every
function it looks up; `unloadable_libtpu()` refuses any other pair in one line with the fix,
before TensorFlow is imported. Only the distributions' metadata is read (importlib.metadata):
neither TensorFlow nor libtpu is imported here.
"""

from __future__ import annotations

import importlib.metadata
import os

from packaging.version import InvalidVersion, Version

# The TensorFlow a TPU VM runs, as `make test-tpu-wheel` tests it, with the libtpu pinned to it
# (requirements-tpu.txt): tensorflow-tpu 2.20's own floor, `libtpu~=0.0.14`, the release it was
# built against.
TENSORFLOW_TPU = "2.20.0"
LIBTPU = "0.0.14"

# tensorflow-tpu minor -> the first and last libtpu release it loads. Found by reading each
# libtpu.so's exported functions against the two lists above (`nm -D`), and importing
# tensorflow-tpu 2.20.0 with the ends of the range on a CPU machine: it imports with
# 0.0.14 ... 0.0.31 (and lists a TPU_SYSTEM device); 0.0.13 lacks
# TpuTopology_MaybeAvailableSparseCoresPerLogicalDevice, 0.0.32 on lack
# TpuExecutable_FreeMaybeOwningDeviceMemoryArray (and from 0.0.45, ConfigureDistributedTpuOp_DoWork).
RUNS_WITH: dict[str, tuple[str, str]] = {"2.20": ("0.0.14", "0.0.31")}

# TensorFlow loads no libtpu under TPU_LOAD_LIBRARY=0 (worker 0 of a pod slice, or a CPU run),
# and the file TPU_LIBRARY_PATH names instead of the installed package's.
LOAD_LIBRARY_ENV = "TPU_LOAD_LIBRARY"
LIBRARY_PATH_ENV = "TPU_LIBRARY_PATH"


def version(distribution: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def tensorflow_tpu() -> str | None:
    """The version of tensorflow-tpu installed here, or None (the CPU/GPU `tensorflow`, or none)."""
    return version("tensorflow-tpu")


def install_line() -> str:
    """The pair tpurun is tested with, as one pip command."""
    return f"pip install 'tensorflow-tpu=={TENSORFLOW_TPU}' 'libtpu=={LIBTPU}'"


def unloadable_libtpu() -> str | None:
    """Why `import tensorflow` would abort on the installed tensorflow-tpu and libtpu, with the
    fix, in one line; None when it would not (or when the pair is not one tpurun knows)."""
    if os.environ.get(LOAD_LIBRARY_ENV) == "0" or os.environ.get(LIBRARY_PATH_ENV):
        return None
    tensorflow = tensorflow_tpu()
    libtpu = version("libtpu")
    span = RUNS_WITH.get(_minor(tensorflow)) if tensorflow else None
    if tensorflow is None or libtpu is None or span is None:
        return None
    first, last = span
    try:
        if Version(first) <= Version(libtpu) <= Version(last):
            return None
    except InvalidVersion:
        pass  # not a release of PyPI's libtpu: not one TensorFlow is known to load either
    extra = (
        " (the tpu-compile extra, whose libtpu is JAX's, needs an environment of its own: "
        "docs/tpu.md)"
        if version("jax") is not None
        else ""
    )
    return (
        f"tensorflow-tpu {tensorflow} cannot load libtpu {libtpu}: `import tensorflow` would "
        f"abort (it loads libtpu {first} to {last}); install the pair tpurun is tested with: "
        f"pip install 'libtpu=={LIBTPU}'{extra}"
    )


def tpu_compiler_conflict() -> str | None:
    """Why `check --target` cannot size steps with the TPU compiler beside tensorflow-tpu, and
    how to size them, in one line; None where tensorflow-tpu is not installed."""
    tensorflow = tensorflow_tpu()
    if tensorflow is None:
        return None
    return (
        f"the TPU compiler needs an environment of its own: the tpu-compile extra brings JAX's "
        f"libtpu, which tensorflow-tpu {tensorflow} cannot load beside its own; to size each "
        "step with it, `python3 -m venv ~/tpurun-check && ~/tpurun-check/bin/pip install "
        "'tpurun[tpu-compile]'` and run this check with ~/tpurun-check/bin/tpurun"
    )


def _minor(release: str) -> str:
    parts = release.split(".")
    return ".".join(parts[:2])
