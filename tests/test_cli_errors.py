"""Every error a user can make, through the real CLI: one line naming the fix, no traceback.

Exit code 2 for usage errors (answered before TensorFlow loads), 1 for run
failures, and a failed command leaves nothing behind: every run here uses a
fresh `tmp_path` as its working directory, and the test checks what is in it
afterwards.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import (
    RUN_FAILURE,
    USAGE,
    assert_fails,
    assert_ok,
    contents,
    error_lines,
    metadata_server_watched,
)

# --- Usage errors: exit 2, before TensorFlow is imported (fast, not marked slow). ---

USAGE_ERRORS = {
    "unknown_command": (["bogus"], ["unknown command 'bogus'", "train", "`tpurun --help`"]),
    "unknown_config": (
        ["train", "--config=nope"],
        ["unknown config 'nope'", "iris", "`tpurun list`", "path to a config .py file"],
    ),
    "missing_config_file": (
        ["train", "--config=no/such/config.py"],
        ["no such config file", "no/such/config.py", "pass an existing .py file"],
    ),
    "unknown_override_key": (
        ["train", "--config.learning_rate=0.05"],
        ["--config.learning_rate", "no key 'learning_rate' at the top level", "optimizer"],
    ),
    "unknown_nested_override_key": (
        ["eval", "--config.optimizer.lr=0.05"],
        ["no key 'lr' at optimizer", "known keys there: alpha,", "learning_rate, momentum"],
    ),
    "override_below_a_value": (
        ["train", "--config.seed.x=1"],
        ["--config.seed.x", "seed is a value, not a group", "--config.seed=<value>"],
    ),
    "unknown_flag": (
        ["train", "--batch_sze=32"],
        ["unknown flag --batch_sze", "did you mean --batch_size?", "`tpurun train --help`"],
    ),
    "unknown_flag_no_suggestion": (
        ["predict", "--frobnicate=1"],
        ["unknown flag --frobnicate;", "`tpurun predict --help`"],
    ),
    "bad_int_value": (["train", "--batch_size=abc"], ["--batch_size=abc", "takes an integer"]),
    "bad_bool_value": (["train", "--use_tpu=maybe"], ["--use_tpu=maybe", "takes true or false"]),
    "bad_override_value": (
        ["train", "--config.optimizer.learning_rate=fast"],
        ["--config.optimizer.learning_rate=fast", "takes a number"],
    ),
    "override_tuple_with_text": (
        ["train", "--config.hidden_units=(10, 'a')"],
        ["--config.hidden_units", "holds integers (its default: (10, 10))", "'a' is not one"],
    ),
    "override_tuple_not_a_number": (
        ["train", "--config.hidden_units=abc"],
        ["'abc' is not one", 'give e.g. --config.hidden_units="(10, 10)"'],
    ),
    "unknown_model": (
        ["train", "--config.model=nope"],
        [
            # The shipped models, in order; a test's own model registered in this
            # process (data-service's service_paced) may stand between them.
            "config.model='nope' is not a registered model (known: bert, bert_classifier, "
            "fashion_mnist, flops, iris, mnist, resnet50, ",
            "shakespeare, ",
            "wgan_gp",
        ],
    ),
    "predict_flag_on_train": (
        ["train", "--input=rows.csv"],
        ["--input does not apply to `tpurun train`", "`tpurun predict`"],
    ),
    "export_flag_on_eval": (
        ["eval", "--export_dir=out"],
        ["--export_dir does not apply to `tpurun eval`", "`tpurun export`"],
    ),
    "positional_argument": (["train", "iris"], ["unexpected arguments ['iris']", "--name=value"]),
    "missing_flagfile": (
        ["train", "--flagfile=no_such_flags.txt"],
        ["Unable to open flagfile", "no_such_flags.txt"],
    ),
    "train_batch_not_divisible": (
        ["train", "--num_shards=8", "--batch_size=100"],
        ["--batch_size=100", "not divisible by the 8 replicas", "96 or 104"],
    ),
    "eval_batch_not_divisible": (
        ["eval", "--num_shards=8", "--eval_batch_size=30"],
        ["--eval_batch_size=30", "not divisible by the 8 replicas", "24 or 32"],
    ),
    "batch_smaller_than_replicas": (
        ["predict", "--num_shards=8", "--predict_batch_size=4"],
        ["--predict_batch_size=4", "multiple of 8 (e.g. 8)"],
    ),
    "zero_shards": (["train", "--num_shards=0"], ["--num_shards=0", "positive integer"]),
    "negative_train_steps": (
        ["train", "--train_steps=-1"],
        ["--train_steps (config.train.steps)=-1", ">= 0"],
    ),
    "tpu_name_without_zone_and_project": (
        ["train", "--tpu=my-tpu"],
        ["--tpu=my-tpu is a TPU name", "--tpu_zone", "--gcp_project"],
    ),
    "tpu_name_without_project": (
        ["eval", "--tpu=my-tpu", "--tpu_zone=us-central1-b"],
        ["--tpu=my-tpu is a TPU name", "--gcp_project"],
    ),
    "tpu_contradicts_use_tpu_false": (
        ["train", "--tpu=grpc://10.0.0.2:8470", "--use_tpu=false"],
        ["contradicts --use_tpu=false", "drop one of them"],
    ),
}


@pytest.mark.parametrize(
    "args, keywords", list(USAGE_ERRORS.values()), ids=list(USAGE_ERRORS.keys())
)
def test_usage_error(tpurun_cli, tmp_path, args, keywords):
    before = contents(tmp_path)
    result = tpurun_cli(*args, f"--model_dir={tmp_path / 'model'}", cwd=tmp_path)
    assert_fails(result, USAGE, *keywords)
    assert contents(tmp_path) == before, "a usage error must not write anything"


@pytest.mark.parametrize(
    "exits, says",
    [
        ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
        ("raise SystemExit('message')\n", "sys.exit('message')"),
        ("import sys\ndef get_config():\n    sys.exit()\n", "sys.exit()"),
    ],
    ids=["exit_0_at_import", "system_exit_message", "exit_in_get_config"],
)
def test_a_config_file_that_exits_is_a_config_error(tpurun_cli, tmp_path, exits, says):
    config = tmp_path / "leaving.py"
    config.write_text(exits)
    result = tpurun_cli("train", f"--config={config}", f"--model_dir={tmp_path / 'model'}")
    assert_fails(result, USAGE, f"config file {config} exited while loading ({says})")
    assert not (tmp_path / "model").exists()


def test_an_error_line_is_cut_whatever_it_quotes(tpurun_cli, tmp_path):
    config = tmp_path / "loud.py"
    config.write_text("def get_config():\n    raise ValueError('x' * 200_000)\n")
    line = assert_fails(tpurun_cli("train", f"--config={config}"), USAGE, "ValueError: xxx")
    assert len(line) < 2100 and line.endswith(" characters)")


def test_usage_error_from_tpu_name_in_the_environment(tpurun_cli, tmp_path):
    """TPU_NAME works like --tpu: a bare name still needs its zone and project."""
    result = tpurun_cli(
        "train", f"--model_dir={tmp_path / 'model'}", cwd=tmp_path, env={"TPU_NAME": "env-tpu"}
    )
    assert_fails(result, USAGE, "--tpu=env-tpu is a TPU name", "--tpu_zone", "--gcp_project")
    assert contents(tmp_path) == set()


def test_override_before_config_is_not_an_ordering_error(tpurun_cli, tmp_path):
    """Flags may come in any order; config_flags used to reject `--config.x=v --config=iris`.

    The divisibility check runs after all flags are parsed, on the overridden value.
    """
    result = tpurun_cli(
        "train", "--config.train.batch_size=100", "--config=iris", "--num_shards=8", cwd=tmp_path
    )
    line = assert_fails(result, USAGE, "--batch_size=100 is not divisible by the 8 replicas")
    assert "before a value for --config" not in line


# --- Run failures: exit 1. These import TensorFlow (seconds each). ---


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval", "predict", "export"])
def test_no_checkpoint_fails_without_creating_model_dir(tpurun_cli, tmp_path, command):
    model_dir = tmp_path / "model"
    result = tpurun_cli(command, "--config=iris", f"--model_dir={model_dir}", cwd=tmp_path)
    assert_fails(
        result,
        RUN_FAILURE,
        f"no checkpoint in {model_dir}",
        f"train first (tpurun train --config=iris --model_dir={model_dir})",
    )
    assert contents(tmp_path) == set(), "eval/predict/export of nothing must not create model_dir"


@pytest.mark.slow
def test_no_checkpoint_in_an_existing_dir_writes_nothing_into_it(tpurun_cli, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    result = tpurun_cli("eval", f"--model_dir={model_dir}", cwd=tmp_path)
    assert_fails(result, RUN_FAILURE, "no checkpoint in", "train first")
    assert contents(tmp_path) == {"model"}


@pytest.mark.slow
def test_unwritable_model_dir(tpurun_cli, tmp_path):
    # We run as root, so chmod does not stop writes; a path below a regular file does.
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory\n")
    model_dir = blocker / "model"
    result = tpurun_cli(
        "train", f"--model_dir={model_dir}", "--train_steps=20", "--iterations=10", cwd=tmp_path
    )
    assert_fails(
        result,
        RUN_FAILURE,
        f"cannot write to --model_dir={model_dir}",
        "not a directory",
        "choose a directory you can write",
    )
    assert contents(tmp_path) == {"afile"}
    assert blocker.read_text() == "not a directory\n"


HEADER = "120,4,setosa,versicolor,virginica\n"
GOOD_ROW = "6.4,2.8,5.6,2.2,2\n"
MALFORMED_DATA = {
    "missing_column": (
        HEADER + GOOD_ROW + "5.0,2.3,3.3,1.0\n",
        ["line 3", "column Species", "missing or malformed value"],
    ),
    "text_in_number_column": (
        HEADER + GOOD_ROW + "5.0,wide,3.3,1.0,1\n",
        ["line 3", "column SepalWidth", "'wide'", "not a number"],
    ),
    "empty_file": ("", ["is empty", "it needs a header line and rows"]),
    "nonexistent_path": (None, ["does not exist", "check the path"]),
    "label_out_of_range": (
        HEADER + GOOD_ROW + "5.0,2.3,3.3,1.0,3\n",
        ["line 3", "label 3 is not a class id in 0..2", "fix that row"],
    ),
    "truncated_file": (
        HEADER + GOOD_ROW + "5.0,2.3,3",
        ["line 3", "column PetalWidth is ''", "missing or malformed value"],
    ),
    "a_cell_of_200000_characters": (
        HEADER + GOOD_ROW + "5.0," + "w" * 200_000 + ",3.3,1.0,1\n",
        ["line 3", "column SepalWidth", "'wwwww", "(200,002 characters)", "not a number"],
    ),
    "a_row_of_1000000_columns": (
        ",".join(["1.0"] * 1_000_000) + "\n" + GOOD_ROW,
        ["line 1", "16,385 or more columns", "fix that line"],
    ),
    "a_row_of_9_columns": (
        HEADER.replace("\n", ",a,b,c,d\n") + GOOD_ROW.replace("\n", ",1,1,1,1\n"),
        ["has 9 columns", "the 4 features", "remove the other columns"],
    ),
    "an_image": (  # a PNG header, then bytes no UTF-8 text has
        b"\x89PNG\r\n\x1a\n" + bytes(range(128, 256)) * 8,
        ["is not UTF-8 text", "pass a CSV file"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "text, keywords", list(MALFORMED_DATA.values()), ids=list(MALFORMED_DATA.keys())
)
def test_malformed_train_data_leaves_no_model_dir(tpurun_cli, tmp_path, text, keywords):
    data = tmp_path / "train.csv"
    if isinstance(text, bytes):
        data.write_bytes(text)
    elif text is not None:
        data.write_text(text)
    before = contents(tmp_path)
    result = tpurun_cli(
        "train",
        f"--config.data.train_path={data}",
        f"--model_dir={tmp_path / 'model'}",
        "--train_steps=20",
        "--iterations=10",
        cwd=tmp_path,
    )
    line = assert_fails(result, RUN_FAILURE, f"data file {data}", *keywords)
    assert len(line) < 500  # whatever the data holds, it quotes an excerpt
    # Not even the run record: the model_dir this train created is removed again.
    assert contents(tmp_path) == before


@pytest.fixture
def trained_copy(trained_iris, tmp_path) -> Path:
    """A private copy of the shared trained model_dir, for tests that might write to it."""
    return Path(shutil.copytree(trained_iris, tmp_path / "model"))


@pytest.mark.slow
def test_malformed_data_on_resume_keeps_checkpoints_and_adds_no_record(
    tpurun_cli, trained_copy, tmp_path
):
    data = tmp_path / "bad.csv"
    data.write_text(HEADER + "5.0,2.3,,1.0,1\n")
    before = contents(trained_copy)
    result = tpurun_cli(
        "train",
        f"--config.data.train_path={data}",
        f"--model_dir={trained_copy}",
        "--train_steps=1100",
        cwd=tmp_path,
    )
    assert_fails(result, RUN_FAILURE, "line 2", "column PetalLength")
    assert contents(trained_copy) == before


@pytest.mark.slow
def test_malformed_eval_data_writes_no_results_or_record(tpurun_cli, trained_copy, tmp_path):
    data = tmp_path / "eval.csv"
    data.write_text(HEADER + "5.0,2.3,3.3,1.0,-1\n")
    before = contents(trained_copy)
    result = tpurun_cli(
        "eval", f"--config.data.eval_path={data}", f"--model_dir={trained_copy}", cwd=tmp_path
    )
    assert_fails(result, RUN_FAILURE, "line 2", "label -1 is not a class id")
    assert contents(trained_copy) == before


@pytest.mark.slow
def test_malformed_predict_input_writes_no_output(tpurun_cli, trained_copy, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("SepalLength,SepalWidth,PetalLength,PetalWidth\n5.1,3.3,1.7\n")
    output = tmp_path / "predictions.jsonl"
    before = contents(tmp_path)
    result = tpurun_cli(
        "predict",
        f"--input={rows}",
        f"--output={output}",
        f"--model_dir={trained_copy}",
        cwd=tmp_path,
    )
    assert_fails(result, RUN_FAILURE, f"data file {rows}, line 2", "column PetalWidth")
    assert contents(tmp_path) == before


@pytest.mark.slow
def test_use_tpu_without_a_tpu_fails_fast(tpurun_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    # Fails on what it knows, without asking the metadata server (off GCE: waiting on an
    # address that never answers).
    with metadata_server_watched() as (env, asked):
        result = tpurun_cli(
            "train", "--use_tpu=true", f"--model_dir={tmp_path / 'model'}", cwd=tmp_path, env=env
        )
    assert asked == [False]
    assert "TPU_NAME" not in os.environ
    assert_fails(
        result, RUN_FAILURE, "no TPU is configured or detected", "--tpu=", "--use_tpu=false"
    )
    assert contents(tmp_path) == set()


@pytest.mark.slow
def test_use_tpu_false_ignores_tpu_name_in_the_environment(tpurun_cli, tmp_path):
    """--use_tpu=false with TPU_NAME set runs locally (it used to be a contradiction error)."""
    model_dir = tmp_path / "model"
    result = tpurun_cli(
        "train",
        "--use_tpu=false",
        f"--model_dir={model_dir}",
        "--train_steps=1",
        "--iterations=1",
        cwd=tmp_path,
        env={"TPU_NAME": "env-tpu"},
    )
    assert_ok(result)
    assert (model_dir / "ckpt-1.index").exists()


UNKNOWN_OPTIMIZER = ("train", "--config.optimizer.name=no_such_optimizer", "--train_steps=1")

# A genuinely unexpected failure: a user's model whose build() has a bug.
BROKEN_MODEL = """
from tpurun.model import Model, register


@register("broken")
class Broken(Model):
    def input_fn(self, mode, params):
        raise AssertionError("not reached")

    def build(self):
        raise RuntimeError("bug in the user's build()")

    def loss(self, labels, outputs):
        raise AssertionError("not reached")
"""
BROKEN_CONFIG = """
from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="broken")
    config.model_module = "broken_model"
    return config
"""


def broken_model_args(tmp_path: Path) -> tuple[str, ...]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "broken_model.py").write_text(BROKEN_MODEL)
    (project / "broken_config.py").write_text(BROKEN_CONFIG)
    return ("train", f"--config={project / 'broken_config.py'}", "--train_steps=1")


@pytest.mark.slow
def test_unknown_optimizer_is_a_usage_error(tpurun_cli, tmp_path):
    result = tpurun_cli(*UNKNOWN_OPTIMIZER, f"--model_dir={tmp_path / 'model'}", cwd=tmp_path)
    assert_fails(result, USAGE, "no_such_optimizer", "is not a Keras optimizer", "adam")
    assert contents(tmp_path) == set()


@pytest.mark.slow
def test_a_bug_in_the_users_model_is_one_line_naming_it_without_verbosity(tpurun_cli, tmp_path):
    """The user's own error: their message and their file:line, not "unexpected" (issue 15)."""
    args = broken_model_args(tmp_path)
    result = tpurun_cli(*args, f"--model_dir={tmp_path / 'model'}", cwd=tmp_path)
    line = assert_fails(
        result,
        RUN_FAILURE,
        "RuntimeError in your code at project/broken_model.py:11: bug in the user's build()",
    )
    assert "unexpected" not in line
    assert "rerun with --verbosity=1 for the traceback" in result.stderr
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_verbosity_1_adds_the_traceback(tpurun_cli, tmp_path):
    args = broken_model_args(tmp_path)
    result = tpurun_cli(*args, "--verbosity=1", f"--model_dir={tmp_path / 'model'}", cwd=tmp_path)
    assert result.returncode == RUN_FAILURE, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and "RuntimeError in your code" in lines[0], result.stderr
    assert "rerun with --verbosity=1" not in result.stderr
    assert not (tmp_path / "model").exists()
