"""The TPU compiler's memory of each step against the XLA:CPU estimate, and check's wall time.

    python scripts/bench_tpu_compile.py [--target=v5e-8] [CONFIG ...]

For each seed config (iris, mnist, fashion_mnist, shakespeare, flops; their data
made here, small) and a CNN of a user's own (a CIFAR-sized ResNet-style model
with BatchNorm, written to a directory outside the repo), runs
`tpurun check --target` twice in fresh processes: with the TPU compiler
(`pip install '.[tpu-compile]'`), and with it hidden (the XLA:CPU estimate). Prints, per
step, both totals and their ratio, and the wall time of each run. Timings are
the machine's of the moment: compare them within one run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from offline_env import OFFLINE_ENV  # scripts/offline_env.py

REPO = Path(__file__).resolve().parent.parent
SEEDS = ("iris", "mnist", "fashion_mnist", "shakespeare", "flops")
# `tpurun check` with the extra hidden: what a machine without it runs.
WITHOUT_EXTRA = (
    "import tpurun.check.sizing.tpu_compiler.client as c; c.missing_extra = lambda: 'jax'; "
    "from tpurun.cli import run; run()"
)

USER_MODEL = '''
"""A CIFAR-sized CNN of a user's own: residual blocks with BatchNorm, random images."""

import keras
import tensorflow as tf

from tpurun.model import Classifier, Mode, register


def block(x, filters, stride):
    shortcut = x
    x = keras.layers.Conv2D(filters, 3, stride, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(filters, 3, 1, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(filters, 1, stride, use_bias=False)(shortcut)
        shortcut = keras.layers.BatchNormalization()(shortcut)
    return keras.layers.ReLU()(x + shortcut)


@register("small_resnet")
class SmallResNet(Classifier):
    def input_fn(self, mode, params):
        def example(i):
            seed = tf.stack([tf.cast(i, tf.int32), params.seed])
            image = tf.random.stateless_uniform([32, 32, 3], seed)
            label = tf.random.stateless_uniform([], seed, maxval=10, dtype=tf.int32)
            return ({"image": image}, label) if mode is not Mode.PREDICT else {"image": image}

        dataset = tf.data.Dataset.range(1024 if mode is not Mode.TRAIN else 1 << 30)
        dataset = dataset.map(example)
        return dataset.batch(params.batch_size, drop_remainder=mode is Mode.TRAIN)

    def build(self):
        inputs = {"image": keras.Input((32, 32, 3), name="image")}
        x = keras.layers.Conv2D(64, 3, padding="same", use_bias=False)(inputs["image"])
        x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
        for filters, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1)):
            x = block(x, filters, stride)
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(10)(x))
'''

USER_CONFIG = """
from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="small_resnet")
    config.model_module = "small_resnet"
    config.n_classes = 10
    config.optimizer.name = "sgd"
    config.optimizer.momentum = 0.9
    config.optimizer.learning_rate = 0.1
    config.train.batch_size = 1024
    config.train.steps = 10000
    config.eval.batch_size = 1024
    config.predict.batch_size = 1024
    return config
"""


def seed_flags(name: str, data: Path) -> list[str]:
    """What each seed config needs to find its data (as tests/test_check.py makes it)."""
    if name in ("mnist", "fashion_mnist"):
        sys.path.insert(0, str(REPO / "tests"))
        from synthetic_images import write_digit_records

        return [f"--data_dir={write_digit_records(data, train=64, test=16)}"]
    if name == "shakespeare":
        data.mkdir()
        text = data / "text.txt"
        text.write_text("ROMEO: But soft, what light through yonder window breaks?\n" * 60)
        return [f"--config.data.path={text}"]
    return []


def check(config_flags: list[str], target: str, with_extra: bool, cwd: Path) -> tuple[dict, float]:
    report = Path(tempfile.mkdtemp()) / "report.json"
    command = (
        [sys.executable, "-m", "tpurun"] if with_extra else [sys.executable, "-c", WITHOUT_EXTRA]
    )
    args = [*command, "check", *config_flags, f"--target={target}", f"--report={report}"]
    start = time.perf_counter()
    result = subprocess.run(
        args, cwd=cwd, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if not report.exists():
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr[-3000:]}")
    return json.loads(report.read_text()), seconds


def main() -> None:
    target = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--target=")), "v5e-8")
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or [*SEEDS, "user:small_resnet"]
    work = Path(tempfile.mkdtemp(prefix="bench-tpu-compile-"))
    user = work / "user_project"
    user.mkdir()
    (user / "small_resnet.py").write_text(USER_MODEL)
    (user / "small_resnet_config.py").write_text(USER_CONFIG)
    print(
        f"target {target}; per step: per-replica batch, the TPU compiler's total, the XLA:CPU estimate"
    )
    print(f"{'config':<18}{'step':<9}{'batch':>7}{'TPU compiler':>15}{'XLA:CPU':>12}{'CPU/TPU':>9}")
    walls = []
    for name in names:
        if name.startswith("user:"):
            flags = [f"--config={user / 'small_resnet_config.py'}"]
        else:
            flags = [f"--config={name}", *seed_flags(name, work / f"data-{name}")]
        tpu, tpu_seconds = check(flags, target, True, work)
        cpu, cpu_seconds = check(flags, target, False, work)
        walls.append((name, tpu_seconds, cpu_seconds, tpu.get("compiled_by")))
        for step, found in tpu["steps"].items():
            estimated = cpu["steps"][step]["total_bytes"]
            print(
                f"{name:<18}{step:<9}{found['batch_per_replica']:>7}"
                f"{found['total_bytes'] / 1e6:>12.1f} MB{estimated / 1e6:>9.1f} MB"
                f"{estimated / found['total_bytes']:>9.2f}"
                + ("" if found["compiler"] == "tpu" else "  (TPU compile failed)")
            )
    print(f"\n`tpurun check --target={target}` wall time, fresh process")
    print(f"{'config':<18}{'TPU compiler':>14}{'XLA:CPU':>10}")
    for name, tpu_seconds, cpu_seconds, _ in walls:
        print(f"{name:<18}{tpu_seconds:>12.1f} s{cpu_seconds:>8.1f} s")
    print(f"\n{walls[0][3]}")


if __name__ == "__main__":
    main()
