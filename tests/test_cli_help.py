"""What the CLI offers: help, `list`, --flagfile, config files and overrides, TF-free answers.

In-process (`tpurun_cli`), except what a fresh interpreter must show: that help and
usage errors answer without importing TensorFlow (which the test process has).
`--help` stays fast because of that; timing it belongs in `make bench`, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, assert_ok

from tpurun import cli
from tpurun.run_config import config_files

COMMANDS = ("train", "eval", "predict", "export", "list", "check", "report", "data-service")
COMMON = (
    "--config",
    "--model_dir",
    "--tpu",
    "--tpu_zone",
    "--gcp_project",
    "--use_tpu",
    "--num_shards",
    "--batch_size",
    "--train_steps",
    "--iterations",
    "--flagfile",
    "--verbosity",
)


def run_python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs Python code in a fresh interpreter, so nothing this test process imported leaks in."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_top_level_help_lists_every_command(tpurun_cli, flag):
    result = assert_ok(tpurun_cli(flag))
    assert result.stdout.startswith("usage: tpurun <command> [--flags]")
    commands = result.stdout.split("commands:\n")[1].split("\n\n")[0].splitlines()
    listed = {line.split()[0]: line.split(None, 1)[1] for line in commands}
    assert listed == cli.COMMAND_HELP  # every command, each with its one line
    assert list(listed) == list(COMMANDS)  # in this order
    assert "`tpurun <command> --help` lists the flags of a command" in result.stdout


def test_no_command_prints_usage_and_exits_2(tpurun_cli):
    result = tpurun_cli()
    assert result.returncode == 2
    assert result.stdout.startswith("usage: tpurun <command> [--flags]")


def test_version(tpurun_cli):
    from tpurun import __version__

    assert assert_ok(tpurun_cli("--version")).stdout.strip() == f"tpurun {__version__}"


@pytest.mark.parametrize(
    "command, present, absent",
    [
        ("train", COMMON, ("--input", "--output", "--export_dir")),
        ("eval", (*COMMON, "--eval_batch_size", "--eval_steps"), ("--input", "--export_dir")),
        ("predict", (*COMMON, "--input", "--output", "--predict_batch_size"), ("--export_dir",)),
        ("export", (*COMMON, "--export_dir"), ("--input", "--output")),
        ("list", ("--flagfile", "--verbosity"), ("--config", "--model_dir")),
        ("check", ("--config", "--num_shards", "--batch_size"), ("--input", "--export_dir")),
        ("report", ("--model_dir", "--json"), ("--config", "--batch_size")),
        (
            "data-service",
            ("--port", "--work_dir", "--dispatcher", "--worker_address"),
            ("--config", "--model_dir"),
        ),
    ],
    ids=COMMANDS,
)
def test_command_help_lists_its_flags_only(tpurun_cli, command, present, absent):
    result = assert_ok(tpurun_cli(command, "--help"))
    assert result.stdout.startswith(f"usage: tpurun {command} [--flags]")
    flags = {
        line.split(":")[0].strip() for line in result.stdout.splitlines() if line.startswith("  --")
    }
    assert set(present) <= flags
    assert not set(absent) & flags


def test_help_wins_over_other_flags(tpurun_cli):
    """`--help` anywhere answers help, even next to flags that would be an error."""
    result = assert_ok(tpurun_cli("train", "--config=nope", "--batch_size=abc", "--help"))
    assert result.stdout.startswith("usage: tpurun train [--flags]")


# argv -> the exit code; all asked in one fresh interpreter, TensorFlow and Keras checked
# absent after each.
TF_FREE_ANSWERS = {
    "help": (["--help"], 0),
    "train_help": (["train", "--help"], 0),
    "predict_help": (["predict", "--help"], 0),
    "list": (["list"], 0),
    "unknown_config": (["train", "--config=nope"], 2),
    "not_divisible": (["train", "--num_shards=8", "--batch_size=100"], 2),
    "wrong_flag": (["train", "--input=rows.csv"], 2),
    "negative_restarts": (["train", "--max_restarts=-1"], 2),
    "report": (["report", "--model_dir=/nonexistent/model"], 1),
    "data_service_help": (["data-service", "--help"], 0),
    "data_service_without_role": (["data-service", "--port=5050"], 2),
    "worker_without_dispatcher": (["data-service", "worker"], 2),
    "bad_service_address": (["train", "--config.data.service=localhost:5050"], 2),
}


def test_answers_without_importing_tensorflow():
    code = (
        "import sys\n"
        "from tpurun import cli\n"
        f"for name, (argv, _) in {TF_FREE_ANSWERS!r}.items():\n"
        "    code = cli.main(['tpurun', *argv])\n"
        "    imported = [m for m in ('tensorflow', 'keras') if m in sys.modules]\n"
        "    print(f'@@ {name} exit {code} imported {imported}')\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    answers = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("@@ ")]
    assert answers == [
        [name, "exit", str(exit_code), "imported", "[]"]
        for name, (_, exit_code) in TF_FREE_ANSWERS.items()
    ], result.stdout


@pytest.mark.parametrize("command", list(cli.COMMAND_HELP))
def test_every_command_has_help_naming_what_it_does(tpurun_cli, command):
    result = assert_ok(tpurun_cli(command, "--help"))
    lines = result.stdout.splitlines()
    assert lines[:3] == [f"usage: tpurun {command} [--flags]", "", cli.COMMAND_HELP[command] + "."]
    assert "  --flagfile: read flags from a file, one per line." in lines
    assert result.stderr == ""


def test_list_shows_every_config_with_its_one_liner(tpurun_cli, tmp_path):
    # In an empty directory: no config files of the user's to list below them.
    result = assert_ok(tpurun_cli("list", cwd=tmp_path))
    names = config_files.builtin_names()
    width = max(len(name) for name in names)
    expected = [
        f"{name:<{width}}  {config_files.summary(str(REPO / 'configs' / f'{name}.py'))}"
        for name in names
    ]
    assert result.stdout.splitlines() == expected
    iris = next(line for line in expected if line.startswith("iris "))
    assert iris.split(None, 1)[1].startswith("Iris classifier of the TPUEstimator tutorial")


def test_parse_reads_overrides_from_its_argv_not_sys_argv(monkeypatch):
    """cli.parse(argv) used to look for `--config.<key>` overrides in sys.argv instead."""
    monkeypatch.setattr(sys, "argv", ["pytest", "--config.optimizer.learning_rate=0.9"])
    run = cli.parse(
        "train",
        ["tpurun", "--config.optimizer.learning_rate=0.05", "--model_dir=/nonexistent/model"],
    )
    assert [run.config.optimizer.learning_rate, run.model_dir] == [0.05, "/nonexistent/model"]


def run_record(model_dir: Path) -> dict:
    records = sorted((model_dir / "runs").glob("*-train.json"))
    assert len(records) == 1, records
    return json.loads(records[0].read_text())


@pytest.mark.parametrize(
    "args",
    [
        ("--config=iris", "--config.optimizer.learning_rate=0.05"),
        ("--config.optimizer.learning_rate=0.05", "--config=iris"),
    ],
    ids=["after_config", "before_config"],
)
def test_an_override_before_or_after_config_applies(args):
    run = cli.parse("train", ["tpurun", *args, "--model_dir=/nonexistent/model"])
    assert (run.config_name, run.config.optimizer.name) == ("iris", "adagrad")
    assert run.config.optimizer.learning_rate == 0.05


MY_CONFIG = '''"""My Iris: wider layers, a config file that lives outside the repo."""

from tpurun.configs import iris


def get_config(arg=None):
    config = iris.get_config()
    config.hidden_units = (16, 16) if arg is None else (int(arg),)
    config.train.steps = 20
    config.train.iterations = 10
    return config
'''


def write_my_config(tmp_path: Path) -> tuple[Path, Path]:
    """MY_CONFIG under tmp_path/configs, and an empty working directory: (config, workdir)."""
    config_file = tmp_path / "configs" / "my_iris.py"
    config_file.parent.mkdir()
    config_file.write_text(MY_CONFIG)
    workdir = tmp_path / "work"
    workdir.mkdir()
    return config_file, workdir


@pytest.mark.slow
def test_flagfile_override_and_config_file_outside_the_repo_land_in_the_run_record(
    tpurun_cli, tmp_path
):
    """One training for three things: a config file outside the repo (its name is the
    config's and, without --model_dir, the model_dir's), a --flagfile's flags and a
    --config.<key> override, all in the run record with the versions. (The override before or
    after --config: test_an_override_before_or_after_config_applies.)"""
    config_file, workdir = write_my_config(tmp_path)
    flagfile = tmp_path / "iris.flags"
    # Not the file's 20 steps in loops of 10: the flagfile's own, in the record.
    flagfile.write_text(
        f"--config={config_file}\n--train_steps=10\n--iterations=5\n--use_tpu=false\n"
    )
    override = "--config.optimizer.learning_rate=0.05"
    result = assert_ok(tpurun_cli("train", f"--flagfile={flagfile}", override, cwd=workdir))
    # No --model_dir: it defaults to ./<config file name>.
    model_dir = workdir / "my_iris"
    assert f"--model_dir not set, using {model_dir}" in result.stderr
    assert sorted(p.name for p in model_dir.glob("ckpt-*.index")) == ["ckpt-10.index"]
    record = run_record(model_dir)
    run_config = record["run_config"]
    assert run_config["config_name"] == "my_iris"
    assert run_config["config"]["hidden_units"] == [16, 16]
    assert run_config["config"]["train"]["steps"] == 10
    assert run_config["config"]["train"]["iterations"] == 5
    optimizer = run_config["config"]["optimizer"]
    assert (optimizer["name"], optimizer["learning_rate"]) == ("adagrad", 0.05)
    versions = record["versions"]
    assert set(versions) == {"tensorflow", "tpurun", "python"}
    assert versions["tensorflow"].startswith("2.")
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    from tpurun import __version__

    assert versions["tpurun"] == __version__


def test_config_file_outside_the_repo_with_an_argument(tmp_path, monkeypatch):
    """`--config=<file>:8` calls get_config("8"); the run goes as above (its record holds the
    run's config, whichever way get_config made it)."""
    config_file, workdir = write_my_config(tmp_path)
    monkeypatch.chdir(workdir)
    run = cli.parse("train", ["tpurun", f"--config={config_file}:8", "--use_tpu=false"])
    assert (run.config_name, run.model_dir) == ("my_iris", str(workdir / "my_iris"))
    assert run.config.hidden_units == (8,)
