"""What changes with the replica count: BatchNormalization's per-replica statistics.

A user's model outside the repo (a config and a model written into tmp_path) with
BatchNormalization inside a custom layer of a nested model:
`tpurun check` warns on several replicas; `tpurun train` says it once on 2
replicas and nothing on 1; and `synchronized=True`, which the warning suggests, really
makes 8 logical CPU replicas train the weights of 1 (what docs/replicas.md's scoped
equivalence claim rests on, with tests/test_e2e_iris.py's
test_one_and_eight_replicas_reach_the_same_weights for per-example models).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import assert_ok, tpurun_in_process

MODEL = '''
import keras
import numpy as np
import tensorflow as tf

from tpurun.model import Classifier, register

ROWS = 64


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int32)


class Block(keras.layers.Layer):
    """A custom layer that keeps its BatchNormalization as an attribute."""

    def __init__(self, synchronized, **kwargs):
        super().__init__(**kwargs)
        self.norm = keras.layers.BatchNormalization(synchronized=synchronized, name="norm")

    def call(self, x, training=None):
        return keras.ops.relu(self.norm(x, training=training))


@register("bn_user")
class BnUser(Classifier):
    def input_fn(self, mode, params):
        x, y = data()
        if mode == "predict":
            return tf.data.Dataset.from_tensor_slices(x).batch(params.batch_size)
        examples = tf.data.Dataset.from_tensor_slices((x, y))
        if mode == "train":
            return examples.repeat().batch(params.batch_size, drop_remainder=True)
        return examples.batch(params.batch_size)

    def build(self):
        sync = self.config.synchronized
        # The custom layer inside a nested model: found wherever it is.
        stem = keras.Sequential([keras.layers.Dense(8), Block(sync, name="block")], name="stem")
        inputs = keras.Input((4,))
        # Already synchronized: never named.
        net = keras.layers.BatchNormalization(synchronized=True, name="synced")(stem(inputs))
        return keras.Model(inputs, keras.layers.Dense(2, name="logits")(net))
'''
CONFIG = '''
"""A model with BatchNormalization (tests/test_replica_fidelity.py)."""
from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="bn_user")
    config.model_module = "bn_user_model"
    config.synchronized = False
    config.train.batch_size = 32
    config.train.steps = 10
    config.train.iterations = 10
    config.eval.batch_size = 32
    config.predict.batch_size = 32
    config.optimizer.name = "sgd"
    config.optimizer.learning_rate = 0.1
    return config
'''
STEPS = 10


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bn_user")
    (directory / "bn_user_model.py").write_text(MODEL)
    (directory / "bn_user.py").write_text(CONFIG)
    return directory


def findings(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("[")]


def test_check_warns_of_per_replica_batch_norm_on_many_replicas(project, tmp_path):
    """On 2 replicas (a check traces the step once per replica: 8 cost 4 times as much, the
    warning's words are the same). That 1 replica says nothing: train's 1-replica run in
    test_train_says_it_once_on_2_replicas, and replica_rules itself in
    test_many_layers_are_counted_past_six_and_one_replica_says_nothing."""
    result = tpurun_in_process(
        "check", f"--config={project / 'bn_user.py'}", "--num_shards=2", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]  # a warning only
    batch_norm = [line for line in findings(result.stdout) if line.startswith("[batch-norm]")]
    (line,) = batch_norm
    assert line.startswith(
        "[batch-norm] warning: 1 BatchNormalization layer (stem/block/norm) normalises each replica's batch by its own mean and variance: on 2 replicas each "
        "normalises 16 of the 32 examples of the train step"
    ), line
    assert "synced" not in line  # synchronized=True already
    assert "Fix: create it with keras.layers.BatchNormalization(..., synchronized=True)" in line
    assert "--batch_size=64: 32 per replica" in line
    assert "with no errors" in result.stdout


@pytest.fixture(scope="module")
def trained(project) -> dict[str, tuple[Path, str]]:
    """(model_dir, stderr) of 10 steps on 1 replica, on 2 without synchronized and on 8 with.

    Per-replica statistics on 2 replicas: the warning's path and a model apart from 1
    replica's, as on any number (8 trace and run the step 4 times as often); 8 where
    the equivalence docs/replicas.md claims is the subject."""
    runs = {}
    for name, replicas, synchronized in (
        ("one", 1, False),
        ("two", 2, False),
        ("eight_synchronized", 8, True),
    ):
        model_dir = project / name
        result = assert_ok(
            tpurun_in_process(
                "train",
                f"--config={project / 'bn_user.py'}",
                "--use_tpu=false",
                f"--num_shards={replicas}",
                f"--config.synchronized={synchronized}",
                f"--model_dir={model_dir}",
                cwd=project,
            )
        )
        runs[name] = (model_dir, result.stderr)
    return runs


def weights(model_dir: Path) -> dict[str, np.ndarray]:
    """The model's variables (moving statistics included), by checkpoint key."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(model_dir / f"ckpt-{STEPS}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name.startswith("model_variables/") and reader.get_tensor(name).dtype.kind == "f"
    }


def test_train_says_it_once_on_2_replicas(trained):
    warned = [line for line in trained["two"][1].splitlines() if "BatchNormalization" in line]
    assert len(warned) == 1, trained["two"][1]
    assert "on 2 replicas each normalises 16 of the 32 examples of the train step" in warned[0]
    assert "Fix: create it with" in warned[0]
    assert "BatchNormalization" not in trained["one"][1]
    assert "BatchNormalization" not in trained["eight_synchronized"][1]


def test_synchronized_batch_norm_trains_on_8_replicas_what_1_replica_trains(trained):
    one, per_replica, synchronized = (
        weights(trained[name][0]) for name in ("one", "two", "eight_synchronized")
    )
    assert one.keys() == synchronized.keys() and len(one) == 12  # 2 norms x 4, 2 dense x 2
    worst = max(float(np.max(np.abs(one[k] - synchronized[k]))) for k in one)
    assert worst < 1e-5, f"synchronized: max abs difference {worst}"
    # Per-replica statistics: another model (docs/replicas.md's scope of the 1-vs-8 claim).
    apart = max(float(np.max(np.abs(one[k] - per_replica[k]))) for k in one)
    assert apart > 1e-2, f"per-replica statistics: max abs difference {apart}"


def test_many_layers_are_counted_past_six_and_one_replica_says_nothing():
    import keras

    from tpurun.check.rules import replica_rules

    norms = [keras.layers.BatchNormalization(name=f"norm_{i}") for i in range(9)]
    model = keras.Sequential([keras.Input((4,)), *norms, keras.layers.Dense(2)], name="seq")
    (problem,) = replica_rules.batch_norm_problems(model, replicas=8, global_batch=256)
    assert problem.message.startswith(
        "9 BatchNormalization layers (seq/norm_0, seq/norm_1, seq/norm_2, seq/norm_3, "
        "seq/norm_4, seq/norm_5 and 3 more) "
        "normalise each replica's batch by its own mean and variance: on 8 replicas each "
        "normalises 32 of the 256"
    ), problem.message
    assert "--batch_size=512: 64 per replica" in problem.fix  # already 32: twice as many
    assert replica_rules.batch_norm_problems(model, replicas=1, global_batch=256) == []
    assert replica_rules.batch_norm_warning(model, replicas=1, global_batch=256) is None


def test_every_model_a_step_trains_is_looked_at():
    """A GAN's step trains two models: a critic's BatchNorm counts, not only the served
    generator's (train and check pass the TrainState's models)."""
    import keras

    from tpurun.check.rules import replica_rules

    shared = keras.layers.Dense(3, name="shared")
    generator = keras.Sequential(
        [keras.Input((2,)), shared, keras.layers.BatchNormalization(synchronized=True)],
        name="generator",
    )
    critic = keras.Sequential(
        [keras.Input((2,)), shared, keras.layers.BatchNormalization(name="norm")], name="critic"
    )
    assert replica_rules.unsynchronized_batch_norms(generator) == []
    assert replica_rules.unsynchronized_batch_norms([generator, critic]) == ["critic/norm"]
    warning = replica_rules.batch_norm_warning({"g": generator, "c": critic}.values(), 8, 64)
    assert warning is not None and "1 BatchNormalization layer (critic/norm)" in warning
