"""Checkpoints tpurun did not write, through the CLI: TF1 name-based ones, TPUEstimator model_dirs
and SavedModels, read through a config's name map (tpurun.foreign).

The sources are written here as TF1 programs wrote them (tests/tf1_checkpoints.py:
tf.compat.v1 variables made by name, a name-based Saver in graph mode), never by
tpurun: a premade DNNClassifier's Iris network (`dnn/hiddenlayer_0/kernel`, ...,
`dnn/logits/bias`, Adagrad slots, global_step 300), which a user's config file maps
onto tpurun's Iris model. Every source's bytes are hashed before and after: nothing
is ever written into one, deleted or rotated.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from conftest import USAGE, assert_fails, assert_ok, tpurun_in_process
from tf1_checkpoints import hashes, with_slots, write_checkpoint, write_saved_model

from tpurun.foreign.outside import RESULTS_DIR

pytestmark = pytest.mark.slow  # runs of the CLI (in this process), seconds each

STEP = 300
FEATURES = ("SepalLength", "SepalWidth", "PetalLength", "PetalWidth")
# A user's config file: tpurun's Iris model, and the map of the TF1 program's names.
CONFIG = """
from tpurun.configs import iris


def get_config():
    config = iris.get_config()
    config.name_map = (
        r"dnn/hiddenlayer_0/(kernel|bias) -> dense/\\1",
        r"dnn/hiddenlayer_(\\d+)/(kernel|bias) -> dense_\\1/\\2",
        r"dnn/logits/(kernel|bias) -> logits/\\1",
    )
    return config
"""
ROWS = {name: [5.1 + i, 3.3 - i / 2, 1.7 + 2 * i, 0.5 + i] for i, name in enumerate(FEATURES)}
# A warm start that trains 2 steps without moving the weights: the checkpoint it writes
# holds exactly what it took.
FROZEN = ("--use_tpu=false", "--train_steps=2", "--config.optimizer.learning_rate=0")


def dnn_values(seed: int = 0, classes: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"hiddenlayer_0": (4, 10), "hiddenlayer_1": (10, 10), "logits": (10, classes)}
    values = {}
    for layer, shape in shapes.items():
        values[f"dnn/{layer}/kernel"] = rng.normal(0, 0.5, shape).astype(np.float32)
        values[f"dnn/{layer}/bias"] = rng.normal(0, 0.1, shape[-1]).astype(np.float32)
    return values


def probabilities(values: dict[str, np.ndarray], rows: dict[str, list[float]]) -> np.ndarray:
    """The DNNClassifier's forward pass in numpy: ReLU layers, then softmax."""
    net = np.stack([np.asarray(rows[name], np.float32) for name in FEATURES], axis=-1)
    for layer in ("hiddenlayer_0", "hiddenlayer_1"):
        net = np.maximum(net @ values[f"dnn/{layer}/kernel"] + values[f"dnn/{layer}/bias"], 0)
    logits = net @ values["dnn/logits/kernel"] + values["dnn/logits/bias"]
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def tf1(tmp_path_factory) -> SimpleNamespace:
    """A TPUEstimator-style model_dir (model.ckpt-300 with Adagrad slots, a `checkpoint`
    file), a TF1 SavedModel of the same weights, and the user's config file."""
    root = tmp_path_factory.mktemp("tf1")
    values = dnn_values()
    model_dir = root / "tpuestimator"
    prefix = write_checkpoint(model_dir / "model.ckpt", with_slots(values, "Adagrad"), STEP)
    saved_model = Path(write_saved_model(root / "export" / "1556000000", values, STEP))
    config = root / "dnn_iris.py"
    config.write_text(CONFIG)
    return SimpleNamespace(
        root=root,
        values=values,
        model_dir=model_dir,
        prefix=prefix,
        saved_model=saved_model,
        config=f"--config={config}",
        hashes=hashes(root),
    )


@pytest.fixture
def untouched(tf1):
    """After the test: every byte of the sources as it was, and no file added or removed."""
    yield
    assert hashes(tf1.root) == tf1.hashes


def same_weights(checkpoint: Path, values: dict[str, np.ndarray], skip: str = "-") -> bool:
    """Whether a tpurun checkpoint holds each of `values` (but those named with `skip`)."""
    reader = tf.train.load_checkpoint(str(checkpoint))
    found = [reader.get_tensor(key) for key in reader.get_variable_to_shape_map()]
    wanted = [v for name, v in values.items() if skip not in name]
    return all(any(np.shape(f) == w.shape and np.array_equal(w, f) for f in found) for w in wanted)


def test_check_lists_the_mapping_and_what_is_left(tf1, untouched):
    result = assert_ok(
        tpurun_in_process(
            "check", tf1.config, f"--warm_start_from={tf1.model_dir}", "--num_shards=1"
        )
    )
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        f"Warm start from {tf1.prefix} (a name-based (TF1) checkpoint: the newest of "
        f"{tf1.model_dir}, as its checkpoint file says), through config.name_map (3 rules), "
        f"global_step {STEP}:",
        "  filled 6 of the model's 6 weights from 6 of the checkpoint's 13 variables",
        "  left in the checkpoint: 6 Adagrad slots; global_step",
    ]
    assert "  dnn/hiddenlayer_0/kernel [4, 10] float32 -> dense/kernel" in lines
    assert "  dnn/hiddenlayer_1/bias [10] float32 -> dense_1/bias" in lines
    assert "  dnn/logits/kernel [10, 3] float32 -> logits/kernel" in lines
    assert lines[-1].startswith("tpurun check: clean")


def test_warm_start_takes_the_tf1_weights_then_trains(tf1, tmp_path, untouched):
    result = assert_ok(
        tpurun_in_process(
            "train", tf1.config, *FROZEN, f"--warm_start_from={tf1.model_dir}",
            f"--model_dir={tmp_path}",
        )
    )  # fmt: skip
    assert "filled 6 of the model's 6 weights from 6 of the checkpoint's 13 variables" in (
        result.stderr
    )
    assert "left in the checkpoint: 6 Adagrad slots; global_step" in result.stderr
    assert f"Warm-started 6 of 6 variables from {tf1.prefix}; training starts at step 0" in (
        result.stderr
    )
    assert same_weights(tmp_path / "ckpt-2", tf1.values)


def test_a_head_of_another_size_refuses_in_one_line_then_trains_when_left_out(
    tf1, tmp_path, untouched
):
    four = (tf1.config, *FROZEN, "--config.n_classes=4", f"--warm_start_from={tf1.prefix}")
    refused = tpurun_in_process("train", *four, f"--model_dir={tmp_path / 'refused'}")
    assert_fails(
        refused,
        USAGE,
        "logits/kernel [10, 4] float32 here, dnn/logits/kernel [10, 3] float32 in the checkpoint",
        "2 mismatched",
        "config.train.warm_start_vars",
    )
    assert "mismatch: logits/bias [4] float32 here, dnn/logits/bias [3] float32" in refused.stderr
    assert not (tmp_path / "refused").exists()
    kept = "--config.train.warm_start_vars=^(?!logits/)"
    result = assert_ok(tpurun_in_process("train", *four, kept, f"--model_dir={tmp_path / 'ok'}"))
    assert "filled 4 of the model's 6 weights" in result.stderr
    assert "2 kept as built (config.train.warm_start_vars leaves them out): logits/kernel" in (
        result.stderr
    )
    assert same_weights(tmp_path / "ok" / "ckpt-2", tf1.values, skip="logits")


@pytest.mark.parametrize("kind", ["tf1", "tpurun"])
def test_a_savedmodel_warm_start(tf1, tmp_path, kind, untouched):
    """A TF1 Estimator's export (name-based variables, through the map) and tpurun's own
    (a TF2 SavedModel: its variables by the paths Keras saved them with)."""
    source = tf1.saved_model
    if kind == "tpurun":  # exported from the TF1 weights by tpurun itself first
        source = tmp_path / "served"
        assert_ok(
            tpurun_in_process(
                "export", tf1.config, f"--checkpoint={tf1.prefix}",
                f"--model_dir={tmp_path / 'm'}", f"--export_dir={source}",
            )
        )  # fmt: skip
    result = assert_ok(
        tpurun_in_process(
            "train", tf1.config, *FROZEN, f"--warm_start_from={source}",
            f"--model_dir={tmp_path / 'warm'}",
        )
    )  # fmt: skip
    assert f"the variables of the SavedModel {source}" in result.stderr
    assert "filled 6 of the model's 6 weights" in result.stderr
    assert same_weights(tmp_path / "warm" / "ckpt-2", tf1.values)


def test_eval_predict_and_export_read_a_checkpoint_outside_the_model_dir(tf1, tmp_path, untouched):
    where = (tf1.config, "--use_tpu=false", f"--checkpoint={tf1.model_dir}")
    model_dir = tmp_path / "served"
    evaluated = assert_ok(tpurun_in_process("eval", *where, f"--model_dir={model_dir}"))
    assert evaluated.stdout.startswith(f"eval at step {STEP} on test: ")
    assert evaluated.stdout.rstrip().endswith(f"({tf1.prefix})")
    [results] = (model_dir / RESULTS_DIR).glob("model.ckpt-300-*/results-test.json")
    assert json.loads(results.read_text())["global_step"] == STEP
    assert not (model_dir / "eval").exists() and not (model_dir / "best").exists()

    exported = assert_ok(tpurun_in_process("export", *where, f"--model_dir={model_dir}"))
    serving = tf.saved_model.load(exported.stdout.strip()).signatures["serving_default"]
    served = serving(**{name: tf.constant(values, tf.float32) for name, values in ROWS.items()})
    np.testing.assert_allclose(
        served["probabilities"].numpy(), probabilities(tf1.values, ROWS), atol=1e-6
    )

    predicted = assert_ok(tpurun_in_process("predict", *where, f"--model_dir={model_dir}"))
    assert len(predicted.stdout.splitlines()) == 3  # the Iris tutorial's three rows


def test_another_runs_tpurun_checkpoint_is_served_as_trained(trained_iris, tmp_path):
    """The model its own train_config.json records, not the config file's (20, 20)."""
    config = tmp_path / "wide_iris.py"
    config.write_text(
        "from tpurun.configs import iris\n\n\ndef get_config():\n"
        "    config = iris.get_config()\n    config.hidden_units = (20, 20)\n    return config\n"
    )
    before = hashes(trained_iris)
    result = assert_ok(
        tpurun_in_process(
            "eval", f"--config={config}", f"--checkpoint={trained_iris / 'ckpt-1000'}",
            f"--model_dir={tmp_path / 'model'}",
        )
    )  # fmt: skip
    assert "hidden_units=(10, 10) (the config file: (20, 20))" in result.stderr
    assert result.stdout.startswith("eval at step 1000 on test: ")
    assert hashes(trained_iris) == before


def test_the_model_dir_may_not_be_where_the_checkpoint_lives(tf1, untouched):
    assert_fails(
        tpurun_in_process(
            "eval", tf1.config, f"--checkpoint={tf1.prefix}", f"--model_dir={tf1.model_dir}"
        ),
        USAGE,
        f"--model_dir={tf1.model_dir} is in {tf1.model_dir}",
        "tpurun writes nothing into a checkpoint it reads",
    )


def test_a_failed_eval_of_an_outside_checkpoint_leaves_no_model_dir(tf1, tmp_path, untouched):
    damaged = _damaged(tmp_path / "sources", tf1, ".data-00000-of-00001")
    result = tpurun_in_process(
        "eval", tf1.config, f"--checkpoint={damaged}", f"--model_dir={tmp_path / 'new'}"
    )
    assert_fails(result, 1, f"--checkpoint={damaged}", "is damaged or truncated")
    assert not (tmp_path / "new").exists()


# --- Hostile sources: one line each, an exit code, and the source untouched -------------


def _damaged(root: Path, tf1, suffix: str) -> Path:
    """A copy of the TF1 model_dir with the file ending in `suffix` cut to half its bytes."""
    copy = Path(shutil.copytree(tf1.model_dir, root / "damaged"))
    [file] = [p for p in copy.iterdir() if p.name.endswith(suffix)]
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    return copy


def _tf2(root: Path, tf1) -> Path:
    return Path(tf.train.Checkpoint(w=tf.Variable([1.0])).write(str(root / "tf2" / "ckpt-1")))


def _written(root: Path, values: dict, name: str = "wrong") -> Path:
    return Path(write_checkpoint(root / name / "model.ckpt", values, STEP))


def _float64_head(root: Path, tf1) -> Path:
    values = dict(tf1.values)
    values["dnn/logits/bias"] = values["dnn/logits/bias"].astype(np.float64)
    return _written(root, values)


def _no_variables(root: Path, tf1) -> Path:
    saved = Path(shutil.copytree(tf1.saved_model, root / "saved"))
    shutil.rmtree(saved / "variables")
    return saved


HOSTILE = {
    # name: (source(root, tf1), extra flags, exit code, words of the line)
    "truncated_index": (
        lambda root, tf1: _damaged(root, tf1, ".index"), (), 1,
        ("model.ckpt-300.index is damaged or truncated", "nothing was taken"),
    ),
    "truncated_data": (
        lambda root, tf1: _damaged(root, tf1, ".data-00000-of-00001"), (), 1,
        ("model.ckpt-300.data is damaged or truncated", "nothing was taken"),
    ),
    "map_matches_nothing": (
        lambda root, tf1: tf1.model_dir, ("--config.name_map=(r'resnet/(.*) -> \\1',)",), 2,
        ("config.name_map matches none of the 13 source variables",),
    ),
    "regex_does_not_compile": (
        lambda root, tf1: tf1.model_dir, ("--config.name_map=('dnn/(kernel -> x',)",), 2,
        ("is not a regular expression (missing ), unterminated subpattern",),
    ),
    "two_sources_one_variable": (
        lambda root, tf1: tf1.model_dir,
        ("--config.name_map=(r'dnn/hiddenlayer_\\d/kernel -> dense/kernel',)",), 2,
        ("two source variables to dense/kernel: dnn/hiddenlayer_0/kernel and "
         "dnn/hiddenlayer_1/kernel",),
    ),
    "wrong_dtype": (
        _float64_head, (), 2,
        ("logits/bias [3] float32 here, dnn/logits/bias [3] float64 in the checkpoint",),
    ),
    "tf2_checkpoint_with_a_map": (
        _tf2, ("--config.name_map=('w -> logits/bias',)",), 2,
        ("is an object-based (TF2) checkpoint", "--config.name_map does not apply to it"),
    ),
    "savedmodel_without_variables": (
        _no_variables, (), 2, ("is a SavedModel without variables", "nothing to take"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_source_is_one_line_and_loses_nothing(tf1, tmp_path, case, untouched):
    make, flags, code, words = HOSTILE[case]
    source = make(tmp_path / "sources", tf1)
    directory = source if source.is_dir() else source.parent
    before = hashes(directory)
    result = tpurun_in_process(
        "train", tf1.config, *FROZEN, *flags, f"--warm_start_from={source}",
        f"--model_dir={tmp_path / 'model'}",
    )  # fmt: skip
    assert_fails(result, code, *words)
    assert hashes(directory) == before
    assert not (tmp_path / "model").exists()


# --- On gs:// --------------------------------------------------------------------------


@pytest.fixture
def on_gcs(tf1, bucket) -> str:
    """The TF1 model_dir copied to a bucket: gs://<bucket>/tpuestimator."""
    for path in tf1.model_dir.iterdir():
        tf.io.gfile.copy(str(path), f"{bucket}/tpuestimator/{path.name}")
    return f"{bucket}/tpuestimator"


def test_a_gs_source_is_read_in_one_pass_and_never_written(tf1, on_gcs, gcs, tmp_path):
    with gcs.counting() as log:
        result = tpurun_in_process(
            "train", tf1.config, *FROZEN, f"--warm_start_from={on_gcs}", f"--model_dir={tmp_path}"
        )
    assert_ok(result)
    assert same_weights(tmp_path / "ckpt-2", tf1.values)
    requests = "\n".join(map(str, log))
    # The weights and the step in one read of the .data file (not one per variable), the
    # .index by one reader (its footer, index and blocks: 3 ranged reads), 10 requests in
    # all; nothing written, deleted or copied there.
    assert log.count(kind="download", path=r"model\.ckpt-300\.data-") == 1, requests
    assert log.count(kind="download", path=r"model\.ckpt-300\.index") <= 3, requests
    assert len(log) <= 10, requests
    assert not [r for r in log if r.kind in ("upload", "delete", "copy")], requests


def test_a_gs_source_gone_midway_is_one_line_and_nothing_is_left(tf1, on_gcs, gcs, tmp_path):
    gcs.fail(404, kind="download", path=r"model\.ckpt-300\.data-", times=None)
    result = tpurun_in_process(
        "train", tf1.config, *FROZEN, f"--warm_start_from={on_gcs}", f"--model_dir={tmp_path / 'm'}"
    )
    assert_fails(result, 1, f"--warm_start_from={on_gcs}", "disappeared while it was read")
    assert not (tmp_path / "m").exists()
