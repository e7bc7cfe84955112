"""`tpurun check`: every TPU rule caught, with its fix, through the real CLI; iris is clean.

Each fixture under tests/check_fixtures/ is a config plus a model that breaks
exactly one rule, so each case also asserts that no other rule fires (no false
positives on the rest of the model, its optimizer, metrics and padding). Every
run uses a fresh working directory, which must stay empty: check writes nothing.
The graph rules are also unit-tested on small tf.functions, in-process and fast.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from pathlib import Path

import pytest
from conftest import error_lines

FIXTURES = Path(__file__).resolve().parent / "check_fixtures"

# rule -> (fixture config, what the finding must say, what its fix must say)
RULE_CASES = {
    "static-batch": (
        "static_batch",
        ["features from StaticBatch.input_fn has shape (None, 4) in the train step"],
        "dataset.batch(params.batch_size, drop_remainder=True)",
    ),
    "dynamic-shape": (
        "dynamic_shape",
        [
            "/culprit_1/boolean_mask/Where' (Where, layer culprit)",
            "output shape (None, 1) in the train, eval and predict steps",
            "dynamic_shape_model.py:12",
        ],
        "replace tf.boolean_mask by multiplying with a 0/1 mask",
    ),
    "xla-unsupported": (
        "xla_unsupported",
        ["(EagerPyFunc, layer culprit) has no XLA kernel", "xla_unsupported_model.py:12"],
        "tf.py_function / tf.numpy_function run Python",
    ),
    "dtype": (
        "dtype",
        [
            "features from Dtype.input_fn is float64 in the train, eval and predict steps",
            "labels from Dtype.input_fn is int64 in the train and eval steps",
        ],
        "cast it to int32 in the input function",
    ),
    "batch-split": (
        "batch_split",
        ["--batch_size=60 does not split over the 8 replicas of the train step"],
        "use a multiple of 8 (e.g. --batch_size=56 or 64)",
    ),
    "summary": (
        "summary",
        ["(WriteSummary, layer culprit) writes a summary", "summary_model.py:12"],
        "remove the tf.summary call",
    ),
}


def findings(result: subprocess.CompletedProcess) -> list[str]:
    """The finding lines of a check's report: `[rule] severity: message. Fix: fix`."""
    return [line for line in result.stdout.splitlines() if line.startswith("[")]


def report(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


@pytest.mark.slow
@pytest.mark.parametrize("rule", list(RULE_CASES))
def test_rule_is_caught_with_its_fix(tpurun_cli, rule, tmp_path):
    config, found, fix = RULE_CASES[rule]
    # The graph's and the input's rules are found in any replica's step: one replica traces
    # one (a check traces the step once per replica). Only batch-split needs the 8 replicas
    # of a v3-8, check's default (as the iris tests below, which trace on 8 and on 2).
    replicas = () if rule == "batch-split" else ("--num_shards=1",)
    result = tpurun_cli("check", f"--config={FIXTURES / config}.py", *replicas, cwd=tmp_path)
    assert result.returncode == 1, report(result)
    lines = findings(result)
    assert lines, report(result)
    # Only the rule this fixture breaks: the rest of the model is TPU-clean.
    assert all(line.startswith(f"[{rule}] error: ") for line in lines), report(result)
    text = "\n".join(lines)
    missing = [snippet for snippet in found if snippet not in text]
    assert not missing, f"{missing} not in\n{text}"
    assert all(". Fix: " in line for line in lines)
    assert any(fix in line.split(". Fix: ", 1)[1] for line in lines), text
    (error,) = error_lines(result)
    assert error.startswith(f"tpurun check: error: {len(lines)} error(s)"), error
    assert "fix the errors and rerun `tpurun check`" in error
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [], "check must not write anything"


@pytest.mark.slow
def test_shipped_iris_config_is_clean(tpurun_cli, tmp_path):
    result = tpurun_cli("check", "--config=iris", cwd=tmp_path)
    assert result.returncode == 0, report(result)
    assert "tpurun check: clean: the train, eval and predict steps of iris" in result.stdout
    assert "8 replicas (a v3-8), with no errors" in result.stdout
    # Its small batches (4, 4 and 1 per replica) only waste TPU padding: warnings, with
    # their fix (a per-replica batch not a multiple of 8 is no error).
    lines = findings(result)
    assert all("] warning: " in line for line in lines), result.stdout
    assert (
        "[batch-padding] warning: --batch_size=32 gives 4 examples per replica in the train "
        "step, not a multiple of 8"
    ) in result.stdout, result.stdout
    assert any("Fix: use a multiple of 64 (e.g. --batch_size=64)" in line for line in lines)
    assert error_lines(result) == []
    # What a resume of its training reproduces, on a TPU and here (config.train.deterministic).
    assert (
        "Resumes on a TPU are bit-identical: XLA compiles the training step into the same TPU "
        "program every run.\nResumes on this machine's CPU are bit-identical: deterministic "
        "kernels"
    ) in result.stdout, result.stdout
    assert "--model_dir not set" not in result.stderr
    # Step by step, when and how long (not on a terminal: the captured stderr is a file).
    for mode in ("train", "eval", "predict"):
        doing = f"the {mode} step on 8 replicas"
        assert f"Tracing and compiling {doing} ..." in result.stderr, result.stderr
        assert re.search(rf"Checked {doing} in \d+\.\ds\.", result.stderr), result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_num_shards_sets_the_replicas_and_tpu_flags_are_ignored(tpurun_cli, tmp_path):
    """--num_shards=2 checks 2 replicas (not the default 8: a check traces the step once per
    replica); --use_tpu and --model_dir neither connect nor write."""
    model_dir = tmp_path / "model"
    result = tpurun_cli(
        "check",
        "--config=iris",
        "--num_shards=2",
        "--use_tpu=true",
        f"--model_dir={model_dir}",
        "--batch_size=16",
        "--eval_batch_size=16",
        "--predict_batch_size=16",
        cwd=tmp_path,
    )
    assert result.returncode == 0, report(result)
    assert "with 2 replicas, with no errors" in result.stdout
    assert findings(result) == [], result.stdout  # 8 per replica everywhere: nothing to say
    assert not model_dir.exists()


def test_the_report_goes_to_sys_stdout_as_it_is_when_check_runs():
    """Not the sys.stdout of when tpurun.check was imported: a caller may redirect it."""
    from tpurun.check.rules import findings

    warning = findings.Finding("batch-padding", findings.WARNING, "the train step", "small", "grow")
    errors = findings.Finding("dtype", findings.ERROR, "the eval step", "float64", "cast")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert findings.report([warning, errors]) == 1
    assert buffer.getvalue().splitlines() == [str(errors), str(warning)]  # errors first


# --- The graph rules on small functions (in-process, fast) ---------------------------


def graph_findings(fn) -> list[tuple[str, str]]:
    """(rule, op type) of what the step-graph walker finds in `fn` traced on an [8, 4] input."""
    import tensorflow as tf

    from tpurun.check.rules.graph_walk import GraphWalker
    from tpurun.check.rules.xla import populate_xla_registry

    populate_xla_registry()
    graph = tf.function(fn).get_concrete_function(tf.TensorSpec([8, 4])).graph
    return [(found.rule, found.op.type) for found in GraphWalker(graph).findings()]


def grow(x):
    import tensorflow as tf

    return tf.while_loop(
        lambda i, a: i < 3,
        lambda i, a: (i + 1, tf.concat([a, a], 0)),
        [0, x],
        shape_invariants=[tf.TensorShape([]), tf.TensorShape([None, 4])],
    )[1]


# Each a function of an [8, 4] input (the tf module is passed in: imported lazily).
CLEAN_GRAPHS = {
    "map_fn": lambda tf, x: tf.map_fn(lambda r: r * 2, x),
    "fixed_while": lambda tf, x: tf.while_loop(
        lambda i, a: i < 3, lambda i, a: (i + 1, a * 2), [0, x]
    )[1],
    "same_shape_cond": lambda tf, x: tf.cond(tf.reduce_sum(x) > 0, lambda: x, lambda: -x),
    "where_3_args": lambda tf, x: tf.where(x > 0, x, 0.0),
    "reshape_by_shape": lambda tf, x: tf.reshape(tf.reshape(x, [-1]), tf.shape(x)),
    "top_k_and_gather": lambda tf, x: tf.gather(x, tf.math.top_k(x, 2).indices, batch_dims=1),
    "tensor_array": lambda tf, x: (
        tf.TensorArray(tf.float32, size=4).unstack(tf.transpose(x)).stack()
    ),
}
# name -> (function, the one (rule, op type) found: the root of the problem)
CAUGHT_GRAPHS = {
    "where_1_arg": (lambda tf, x: tf.where(x > 0), ("dynamic-shape", "Where")),
    "unique": (
        lambda tf, x: tf.unique(tf.reshape(tf.cast(x, tf.int32), [-1]))[0],
        ("dynamic-shape", "Unique"),
    ),
    "range_of_a_value": (
        lambda tf, x: tf.range(tf.cast(tf.reduce_sum(x), tf.int32)),
        ("dynamic-shape", "Range"),
    ),
    "growing_while": (lambda tf, x: grow(x), ("dynamic-shape", "StatelessWhile")),
    "mask_inside_cond": (
        lambda tf, x: tf.cond(
            tf.reduce_sum(x) > 0, lambda: tf.boolean_mask(x, x > 0), lambda: tf.zeros([3])
        ),
        ("dynamic-shape", "Where"),
    ),
    "cond_shapes_differ": (
        lambda tf, x: tf.cond(tf.reduce_sum(x) > 0, lambda: x, lambda: x[:2]),
        ("dynamic-shape", "StatelessIf"),
    ),
    "float64": (lambda tf, x: tf.cast(x, tf.float64) * 2, ("dtype", "Cast")),
    "numpy_function": (
        lambda tf, x: tf.numpy_function(lambda a: a, [x], tf.float32),
        ("xla-unsupported", "PyFunc"),
    ),
}


@pytest.mark.parametrize("fn", list(CLEAN_GRAPHS.values()), ids=list(CLEAN_GRAPHS))
def test_graph_walker_finds_nothing_in_static_steps(fn):
    import tensorflow as tf

    assert graph_findings(lambda x: fn(tf, x)) == []


@pytest.mark.parametrize("fn, expected", list(CAUGHT_GRAPHS.values()), ids=list(CAUGHT_GRAPHS))
def test_graph_walker_finds_the_root_of_each_problem(fn, expected):
    import tensorflow as tf

    found = graph_findings(lambda x: fn(tf, x))
    if expected[0] == "dtype":
        found = found[:1]  # float64 ops are grouped by layer later
    # Only the root: not the ops after it, whose shapes are dynamic because of it.
    assert found == [expected]


def test_every_data_dependent_op_has_a_fix_of_its_own():
    """graph_walk finds these ops; fixes words each one's fix (a variant takes its base's)."""
    from tpurun.check.rules.fixes import GENERIC_DYNAMIC_FIX, data_dependent_fix
    from tpurun.check.rules.graph_walk import DATA_DEPENDENT_OPS

    generic = [
        op for op in sorted(DATA_DEPENDENT_OPS) if data_dependent_fix(op) == GENERIC_DYNAMIC_FIX
    ]
    assert generic == []
    assert data_dependent_fix("UniqueWithCountsV2") == data_dependent_fix("Unique")
    assert data_dependent_fix("StringSplitV2") == data_dependent_fix("StringSplit")


def shipped_config_args(name: str, data: Path) -> list[str]:
    """What each shipped config needs to find its data, made here on the fly."""
    if name in ("mnist", "fashion_mnist"):
        from synthetic_images import write_digit_records

        return [f"--data_dir={write_digit_records(data, train=64, test=16)}"]
    if name == "shakespeare":
        data.mkdir()
        text = data / "text.txt"
        text.write_text("ROMEO: But soft, what light through yonder window breaks?\n" * 60)
        return [f"--config.data.path={text}"]
    return []


# Every shipped config's check (8 replicas, traced and compiled): in test_check_preflight.py,
# whose runs on a v5e-8 (8 replicas too) also size each step, one check per config for both.
