"""Packaging: what `pip install .` installs, and the TPU VM requirements list."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO

from tpurun.tpu_vm import installed


def install_requires() -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    lines = parser["options"]["install_requires"].splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_tpu_requirements_are_the_tpu_pair_and_install_requires_without_tensorflow():
    """A TPU VM's list: tensorflow-tpu with its libtpu (tpurun.tpu_vm.installed's pair), then
    everything else tpurun needs."""
    listed = [
        line.strip()
        for line in (REPO / "requirements-tpu.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tensorflow_minor = installed.TENSORFLOW_TPU.rsplit(".", 1)[0]
    pair = [f"tensorflow-tpu=={tensorflow_minor}.*", f"libtpu=={installed.LIBTPU}"]
    assert listed == pair + [r for r in install_requires() if not r.startswith("tensorflow")]


def listed_packages() -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return [line.strip() for line in parser["options"]["packages"].splitlines() if line.strip()]


def tree_packages() -> list[str]:
    """tpurun and every package under it in the checkout, with configs/ and models/ (installed
    as tpurun.configs and tpurun.models)."""
    found = [
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "tpurun").rglob("__init__.py")
    ]
    return sorted([*found, "tpurun.configs", "tpurun.models"])


def test_setup_cfg_lists_every_package_of_the_tree():
    """setuptools installs only the packages listed: one left out (tpurun.check, once) makes
    an installed tpurun fail on its first import of it."""
    assert sorted(listed_packages()) == tree_packages()


def test_tensorflow_range_admits_the_tpu_vm_release():
    assert "tensorflow>=2.20,<2.22" in install_requires()
    assert any(r.startswith("tensorboard") for r in install_requires())


@pytest.mark.slow
def test_wheel_carries_configs_models_and_data(tmp_path):
    """`--config=iris` must resolve from an installed tpurun, away from the checkout."""
    # The wheel as `pip wheel --no-deps --no-build-isolation` builds it: pyproject.toml's
    # backend called in the checkout, without pip around it (its start and its separate
    # metadata build were two thirds of the CPU; the wheel holds the same files).
    (backend,) = re.findall(
        r'^build-backend = "([\w.]+)"$', (REPO / "pyproject.toml").read_text(), re.M
    )
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import importlib, sys; importlib.import_module({backend!r}).build_wheel(sys.argv[1])",
            str(tmp_path),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("tpurun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = [str(path.relative_to(REPO)) for path in (REPO / "tpurun").rglob("*.py")]
    for expected in (
        *modules,
        "tpurun/cli/__init__.py",
        "tpurun/check/__init__.py",
        "tpurun/actions/__init__.py",
        # The TPU compiler's process runs this file as a script (tpurun check --target).
        "tpurun/check/sizing/tpu_compiler/server.py",
        "tpurun/configs/iris.py",
        "tpurun/models/iris.py",
        "tpurun/models/data/iris_training.csv",
        "tpurun/models/data/iris_test.csv",
    ):
        assert expected in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tpurun = tpurun.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
