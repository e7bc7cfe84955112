"""config_files: resolving --config, loading config files, checking override keys."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import ml_collections
import pytest
from conftest import REPO

from tpurun.errors import UsageError
from tpurun.run_config import config_files

IRIS_PATH = os.path.realpath(REPO / "configs" / "iris.py")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_builtin_names_are_the_config_files():
    assert "iris" in config_files.builtin_names()
    assert not [n for n in config_files.builtin_names() if n.startswith("_")]


@pytest.mark.parametrize(
    "spec, arg",
    [("iris", None), ("iris:small", "small"), ("iris:", None)],
    ids=["name", "name_with_arg", "empty_arg"],
)
def test_resolve_a_registered_name(spec, arg):
    source = config_files.resolve(spec)
    assert source.name == "iris"
    assert source.path == os.path.join(config_files.builtin_dir(), "iris.py")
    assert os.path.isfile(source.path)
    assert source.arg == arg
    assert source.flag_value == (source.path if arg is None else f"{source.path}:{arg}")


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_resolve_a_path(tmp_path, monkeypatch, relative):
    path = write(tmp_path / "mine" / "my_model.py", "def get_config(): ...\n")
    monkeypatch.chdir(tmp_path)
    spec = "mine/my_model.py:big" if relative else f"{path}:big"
    source = config_files.resolve(spec)
    assert source.name == "my_model"
    assert source.path == str(path)  # absolute either way
    assert source.arg == "big"
    assert source.flag_value == f"{path}:big"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "--config=nope: unknown config 'nope'; use one of "),
        ("nope:arg", "unknown config 'nope'"),
        ("", "unknown config ''"),
        ("missing.py", "no such config file 'missing.py'; pass an existing .py file"),
        (os.path.join("no", "such", "dir"), "no such config file"),
    ],
    ids=["unknown_name", "unknown_name_with_arg", "empty", "missing_file", "missing_path"],
)
def test_resolve_rejects(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as raised:
        config_files.resolve(spec)
    assert message in str(raised.value)


def test_unknown_config_lists_the_registered_ones():
    with pytest.raises(UsageError) as raised:
        config_files.resolve("nope")
    names = ", ".join(config_files.builtin_names())
    assert f"use one of {names} (see `tpurun list`)" in str(raised.value)
    assert "iris" in config_files.builtin_names()


def test_load_the_iris_config():
    config = config_files.load(config_files.resolve("iris"))
    assert isinstance(config, ml_collections.ConfigDict)
    assert config.model == "iris"
    assert config.optimizer.learning_rate == 0.1


def test_load_passes_the_arg_and_finds_modules_beside_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # load() may add the config's dir
    write(tmp_path / "shared_settings.py", "WIDTH = 7\n")
    path = write(
        tmp_path / "with_arg.py",
        "import ml_collections\nimport shared_settings\n\n"
        "def get_config(arg):\n"
        "    return ml_collections.ConfigDict({'arg': arg, 'width': shared_settings.WIDTH})\n",
    )
    config = config_files.load(config_files.resolve(f"{path}:hello"))
    assert config.to_dict() == {"arg": "hello", "width": 7}


@pytest.mark.parametrize(
    "text, message",
    [
        ("x = 1\n", "has no get_config() function; add one"),
        (
            "def get_config():\n    return 1 / 0\n",
            "failed to load at line 2 (`return 1 / 0`): ZeroDivisionError: division by zero",
        ),
        ("def get_config(:\n", "failed to load: SyntaxError"),
        ("import no_such_module_xyz\n", "failed to load at line 1"),
        ("def get_config():\n    return {'a': 1}\n", "returned dict; return an ml_collections"),
        (  # a model's own `config.<section>.<key>`, before the section was made
            "from tpurun import config_defaults\n\n"
            "def get_config():\n"
            "    config = config_defaults.base_config(model='iris')\n"
            "    config.generate.count = 16\n"
            "    return config\n",
            "failed to load at line 5 (`config.generate.count = 16`): config has no "
            "section 'generate'; add it before setting its keys: "
            "`config.generate = ml_collections.ConfigDict()`",
        ),
        (  # an escaped message (a KeyError's repr) is shown as its text
            "from tpurun import config_defaults\n\n"
            "def get_config():\n"
            "    config = config_defaults.base_config(model='iris')\n"
            "    config.seeds = config.sed\n",
            'AttributeError: \'sed\' Did you mean "seed" instead of "sed"?',
        ),
    ],
    ids=[
        "no_get_config",
        "raises",
        "syntax_error",
        "import_error",
        "returns_dict",
        "no_generate_section",
        "misspelt_key",
    ],
)
def test_load_turns_a_broken_file_into_a_usage_error(tmp_path, monkeypatch, text, message):
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = write(tmp_path / "broken.py", text)
    with pytest.raises(UsageError) as raised:
        config_files.load(config_files.resolve(str(path)))
    assert message in str(raised.value)
    assert str(path) in str(raised.value), "the message names the file to fix"


@pytest.fixture
def iris_config() -> ml_collections.ConfigDict:
    return config_files.load(config_files.resolve("iris"))


@pytest.mark.parametrize(
    "argv",
    [
        ["tpurun", "--config.optimizer.learning_rate=0.05", "--config.train.steps=5"],
        ["tpurun", "--config.hidden_units=(4,4)", "--batch_size=8", "--model_dir=/x"],
        ["tpurun", "--config.data=", "--other.thing=1"],  # whole group; not a --config flag
    ],
    ids=["leaves", "tuple_leaf_and_other_flags", "group_and_unrelated"],
)
def test_check_override_keys_accepts_known_keys(iris_config, argv):
    assert config_files.check_override_keys(iris_config, argv) is None


@pytest.mark.parametrize(
    "arg, message",
    [
        (
            "--config.learning_rate=0.05",
            "--config.learning_rate: the config has no key 'learning_rate' at the top level; "
            "known keys there: data, eval, hidden_units, model, model_module, n_classes, "
            "name_map, optimizer, optimizers, precision, predict, seed, train",
        ),
        (
            "--config.optimizer.lr=0.05",
            "--config.optimizer.lr: the config has no key 'lr' at optimizer; "
            "known keys there: alpha, base_batch_size, boundaries, boundary_epochs, "
            "clip_norm, decay_rate, decay_steps, end_learning_rate, l2_weight_decay, "
            "learning_rate, momentum, multipliers, name, nesterov, schedule, staircase, "
            "warmup_epochs, warmup_steps, warmup_target, weight_decay, weight_decay_exclude",
        ),
        (
            "--config.train.steps.max=3",
            "--config.train.steps.max: config key train.steps is a value, not a group of keys; "
            "set it with --config.train.steps=<value>",
        ),
    ],
    ids=["top_level", "nested", "below_a_leaf"],
)
def test_check_override_keys_lists_the_known_keys(iris_config, arg, message):
    with pytest.raises(UsageError) as raised:
        config_files.check_override_keys(iris_config, ["tpurun", "--config=iris", arg])
    assert str(raised.value) == message


def test_summary_is_the_first_docstring_line():
    assert config_files.summary(IRIS_PATH) == (
        "Iris classifier of the TPUEstimator tutorial: 4 measurements -> DNN 10x10 -> 3 species."
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ('"""One line.\n\nMore text."""\nraise SystemExit("imported!")\n', "One line."),
        ('"""\n   Indented first line.\n"""\n', "Indented first line."),
        ("x = 1\n", "(no docstring)"),
        ('""""""\n', "(no docstring)"),
    ],
    ids=["not_imported", "leading_blank_line", "none", "empty"],
)
def test_summary_reads_without_importing(tmp_path, text, expected):
    assert config_files.summary(str(write(tmp_path / "c.py", text))) == expected


CONFIG_FILE = '"""{summary}"""\n\ndef get_config():\n    return None\n'


def test_local_configs_finds_config_files_here_and_one_level_down(tmp_path):
    write(tmp_path / "top.py", CONFIG_FILE.format(summary="Top."))
    write(tmp_path / "project" / "cfg.py", CONFIG_FILE.format(summary="In a project."))
    write(tmp_path / "project" / "model.py", "class Model:\n    def get_config(self): ...\n")
    write(tmp_path / "project" / "notes.py", "# def get_config(): in a comment\n")
    write(tmp_path / "project" / "broken.py", "def get_config(:\n")
    # Never imported: listing must not run the user's code (or import TensorFlow).
    write(
        tmp_path / "project" / "loud.py", 'raise SystemExit("imported!")\ndef get_config(): ...\n'
    )
    write(tmp_path / "project" / "deeper" / "too_deep.py", CONFIG_FILE.format(summary="No."))
    write(tmp_path / ".hidden" / "secret.py", CONFIG_FILE.format(summary="No."))
    write(tmp_path / "venv" / "pyvenv.cfg", "home = /usr/bin\n")
    write(tmp_path / "venv" / "tool.py", CONFIG_FILE.format(summary="No."))
    write(tmp_path / "site-packages" / "lib.py", CONFIG_FILE.format(summary="No."))
    assert config_files.local_configs(str(tmp_path)) == [
        ("top.py", "Top."),
        (os.path.join("project", "cfg.py"), "In a project."),
        (os.path.join("project", "loud.py"), "(no docstring)"),
    ]


def test_local_configs_leaves_out_tpuruns_own(monkeypatch):
    monkeypatch.chdir(REPO)  # configs/ is tpurun.configs in a development install
    assert not [path for path, _ in config_files.local_configs() if path.startswith("configs")]
