"""The shipped WGAN-GP (configs/wgan_gp.py, models/wgan_gp.py), through the CLI in this process.

One tiny training on synthetic digits is shared: its checkpoint holds both
optimizers, the critic's stepped critic_steps times per generator step; its eval (by
the train, at its end) scores test images against generated ones; predict writes `images` as .npz and a .png
grid; export serves the generator (noise in, images out). The gradient penalty is
checked against one computed by hand. The flow is marked tpu_wheel: `make
test-tpu-wheel` runs it on tensorflow-tpu 2.20 too, with a second train that resumes
both optimizers where they stopped (bit for bit after a SIGKILL: tests/test_user_gan.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import USAGE, assert_fails, assert_ok, tensorboard_scalars, tpurun_in_process
from test_resume import weights

pytestmark = pytest.mark.slow

TINY = (
    "--config=wgan_gp",
    "--config.noise_dim=8",
    "--config.generator_base=8",
    "--config.generator_filters=(4, 4)",
    # One convolution: with --config.dropout=0.0 below, a middle layer's dropout is the
    # identity, so more layers proved nothing here and cost ~20% of each training's CPU
    # (each penalty differentiates the critic twice; the default four: the paper's shape).
    "--config.critic_filters=(4,)",
    # Two critic updates per generator update, not the default three: the same loop
    # (range(critic_steps)), a third fewer critic updates to trace.
    "--config.critic_steps=2",
    # KeyedDropout before the score only: tracing each keyed mask costs ops (30 of the
    # step's draws were masks), and one layer of them is what this test needs.
    "--config.dropout=0.0",
    "--config.data.shuffle_buffer=64",
    "--batch_size=16",
    "--eval_batch_size=32",
    "--predict_batch_size=16",
    "--config.generate.count=40",
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """10 steps of the tiny WGAN-GP, 5 per host loop, one replica."""
    from synthetic_images import write_digit_records

    root = tmp_path_factory.mktemp("wgan_gp")
    data = write_digit_records(root / "data", train=64, test=32, examples_per_file=32)
    model_dir = root / "model"
    common = (*TINY, f"--data_dir={data}", f"--model_dir={model_dir}")
    # Evaluated by the train at its end (--eval_every: its models and input built once,
    # not again by a `tpurun eval` of its own: that command is test_e2e_iris.py's and
    # test_models_resnet50.py's; predict and export below restore this one's two models).
    steps = ("--use_tpu=false", "--train_steps=10", "--iterations=5")
    result = assert_ok(tpurun_in_process("train", *common, *steps, "--eval_every=10"))
    return {"common": common, "model_dir": model_dir, "train": result}


@pytest.mark.tpu_wheel  # the own-step GAN's end-to-end run on tensorflow-tpu 2.20 too
def test_two_optimizers_and_critic_steps_critic_updates_per_generator_update(trained):
    saved = weights(trained["model_dir"] / "ckpt-10")
    iterations = {k.split("/")[1]: int(v) for k, v in saved.items() if "/_iterations/" in k}
    assert iterations == {"critic": 20, "generator": 10}
    assert int(saved["step/.ATTRIBUTES/VARIABLE_VALUE"]) == 10
    # Each Adam keeps two moments per variable of its own model.
    for name in ("critic", "generator"):
        moments = [k for k in saved if k.startswith(f"optimizers/{name}/_variables/")]
        assert len(moments) >= 4, moments
    assert "No model graph" not in trained["train"].stderr  # TensorBoard's: the generator's
    lines = [line for line in trained["train"].stderr.splitlines() if "] step 10/10" in line]
    assert lines and all(f" {name} " in lines[0] for name in ("d_loss", "g_loss", "gp")), lines
    scalars = tensorboard_scalars(trained["model_dir"])
    for tag in ("d_loss", "g_loss", "gp", "learning_rate/critic", "learning_rate/generator"):
        assert [step for step, _ in scalars[tag]] == [5, 10], tag
    assert scalars["learning_rate/critic"][0][1] == pytest.approx(2e-4)


@pytest.mark.tpu_wheel
def test_eval_predict_and_export_serve_the_generator(trained, tmp_path):
    common = trained["common"]
    assert "(32 examples)" in trained["train"].stdout  # the train's eval at its end
    found = json.loads((trained["model_dir"] / "eval" / "test" / "results-10.json").read_text())
    assert found["loss"] == pytest.approx(found["critic_fake"] - found["critic_real"], abs=1e-4)

    npz, png = tmp_path / "samples.npz", tmp_path / "samples.png"
    result = assert_ok(tpurun_in_process("predict", *common, f"--output={npz}"))
    assert f"wrote 40 predictions to {npz} (images uint8[40, 28, 28])" in result.stdout
    images = np.load(npz)["images"]
    assert images.dtype == np.uint8 and images.shape == (40, 28, 28) and images.std() > 0
    # The same rows to a .png: predict's writer, by the extension (the rows are the ones
    # generate yielded above, written again without a second generation).
    from tpurun.runners.predict import output_target, write_rows

    line = write_rows(
        output_target(str(png), str(trained["model_dir"])), [{"images": image} for image in images]
    )
    assert line == f"wrote 40 images in a 212x182 grid to {png}", line
    grid = tf.io.decode_png(png.read_bytes()).numpy()
    # 40 images in 6 rows of 7 (28 pixels and a 2-pixel gap each).
    assert grid.shape == (6 * 30 + 2, 7 * 30 + 2, 1)
    np.testing.assert_array_equal(grid[2:30, 2:30, 0], images[0])

    export_dir = tmp_path / "export"
    assert_ok(tpurun_in_process("export", *common, f"--export_dir={export_dir}"))
    serving = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    assert list(serving.structured_input_signature[1]) == ["noise"]
    from tpurun.training_step import keyed_random

    # The noise predict drew for its 40 images, keyed on (seed 0, index).
    noise = keyed_random.normal(0, 0, tf.range(40, dtype=tf.int64), [8], "generate")
    served = serving(noise=noise)["images"].numpy()
    assert served.dtype == np.uint8
    assert np.abs(served.astype(int) - images.astype(int)).max() <= 1


@pytest.mark.tpu_wheel  # the own-step GAN's resume on tensorflow-tpu 2.20 too (issue 37)
def test_a_second_train_resumes_both_optimizers(trained):
    """After eval, predict and export: training on from ckpt-10 to step 15, each optimizer
    where it stopped (the critic's two updates per step go on from 20). Bit-identity of a
    killed own-step GAN's resume: test_user_gan."""
    model_dir = trained["model_dir"]
    result = assert_ok(
        tpurun_in_process(
            "train", *trained["common"], "--use_tpu=false", "--train_steps=15", "--iterations=5"
        )
    )
    assert f"Resuming from {model_dir / 'ckpt-10'} (step 10)." in result.stderr
    saved = weights(model_dir / "ckpt-15")
    iterations = {k.split("/")[1]: int(v) for k, v in saved.items() if "/_iterations/" in k}
    assert iterations == {"critic": 30, "generator": 15}


def test_the_gradient_penalty_is_the_one_computed_by_hand():
    """A fixed critic D(x) = w . x + |x|^2 / 2, whose gradient is w + x."""
    import keras
    from tpurun.models.wgan_gp import gradient_penalty

    rng = np.random.default_rng(0)
    w = rng.normal(size=(28, 28, 1)).astype(np.float32) / 28
    inputs = keras.Input((28, 28, 1))
    score = keras.layers.Lambda(
        lambda x: tf.reduce_sum(w * x + x * x / 2, axis=[1, 2, 3])[:, None]
    )(inputs)
    critic = keras.Model(inputs, score)
    real, fake = (rng.uniform(-1, 1, size=(5, 28, 28, 1)).astype(np.float32) for _ in range(2))
    alpha = rng.uniform(size=(5, 1, 1, 1)).astype(np.float32)
    found = gradient_penalty(critic, tf.constant(real), tf.constant(fake), tf.constant(alpha))
    between = real + alpha * (fake - real)
    norms = np.sqrt(np.sum((w + between) ** 2, axis=(1, 2, 3)))
    np.testing.assert_allclose(found.numpy(), (norms - 1.0) ** 2, rtol=1e-5)


def test_accumulation_is_refused_before_anything_is_made(tmp_path):
    result = tpurun_in_process(
        "train",
        "--config=wgan_gp",
        f"--data_dir={tmp_path}",
        f"--model_dir={tmp_path / 'model'}",
        "--config.train.accumulate_steps=2",
    )
    assert_fails(result, USAGE, "accumulate_steps=2", "train_step of its own", "--batch_size")
    assert not (tmp_path / "model").exists()


def test_the_config_generates_1000_images_by_default():
    from tpurun.run_config import config_files

    config = config_files.load(config_files.resolve("wgan_gp"))
    assert config.generate.count == 1000
    assert config.critic_steps == 3  # the shared training runs 2: the same loop
    assert config.data.train_examples == 60_000  # --train_epochs counts MNIST's training split
    paper = config_files.load(config_files.resolve("wgan_gp:paper"))
    assert (paper.noise_dim, tuple(paper.critic_filters)) == (128, (64, 128, 256, 512))
