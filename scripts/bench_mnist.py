"""Benchmark of MNIST training in float32 and mixed bfloat16: tpurun against Keras `model.fit`.

What it measures: examples per second of the seed's MNIST CNN (`configs/mnist.py`,
`models/mnist.py`) at global batch 128, 1 replica, on TFRecords read by the model's
own input_fn (random 28x28 digits: speed does not depend on what they show):

* tpurun:    `Trainer.train(iterations)`, the real host loop, under `--precision`;
* keras fit: `model.fit` on the same model, optimizer (SGD 0.05), loss and dataset,
             with `steps_per_execution` = iterations, under the same Keras policy.

Each of the four configurations runs in its own subprocess (the Keras policy is
global state), warms up (two host calls, the first of which traces and compiles),
then times `--repeats` repeats of `--steps` steps; the median is reported.

The targets (the training-recipes issue): tpurun mixed_bfloat16 >= 1.6x Keras fit
float32 and >= 1.0x Keras fit mixed_bfloat16; tpurun float32 >= 1.0x Keras fit
float32. Figures vary with the machine and its load: compare ratios of one run.

Usage: `make bench` (runs this after the Iris loop benchmark), or
`.venv/bin/python scripts/bench_mnist.py --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from offline_env import execution_stamps, run_json_worker  # scripts/offline_env.py

BATCH = 128
ITERATIONS = 50  # configs/mnist.py's iterations per loop
WORKERS = ("tpurun-float32", "tpurun-mixed_bfloat16", "fit-float32", "fit-mixed_bfloat16")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps timed per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; median reported")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(run_worker(args)))
        return
    with tempfile.TemporaryDirectory() as data_dir:
        write_data(data_dir)
        rates = {name: run_in_subprocess(name, data_dir, args) for name in WORKERS}
    print(f"\nMNIST CNN, global batch {BATCH}, 1 replica, {ITERATIONS} steps per host call")
    print(f"{'loop':<26} {'examples/s':>12}")
    for name in WORKERS:
        print(f"{name.replace('-', ' ', 1):<26} {rates[name]:>12.0f}")
    fit32, fit16 = rates["fit-float32"], rates["fit-mixed_bfloat16"]
    ours32, ours16 = rates["tpurun-float32"], rates["tpurun-mixed_bfloat16"]
    print()
    print(f"tpurun mixed_bfloat16 / fit float32        = {ours16 / fit32:.2f}  (target >= 1.6)")
    print(f"tpurun mixed_bfloat16 / fit mixed_bfloat16 = {ours16 / fit16:.2f}  (target >= 1.0)")
    print(f"tpurun float32 / fit float32               = {ours32 / fit32:.2f}  (target >= 1.0)")


def write_data(data_dir: str) -> None:
    import numpy as np
    from tpurun.models import image_records

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(4096, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=4096)
    image_records.write_records(images, labels, data_dir, "train", 1024)
    image_records.write_records(images[:256], labels[:256], data_dir, "test", 256)


def run_in_subprocess(name: str, data_dir: str, args: argparse.Namespace) -> float:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        f"--worker={name}",
        f"--data_dir={data_dir}",
        f"--steps={args.steps}",
        f"--repeats={args.repeats}",
    ]
    return float(run_json_worker(command))  # type: ignore[arg-type]


def run_config(data_dir: str, precision: str):
    from tpurun.run_config import RunConfig, config_files, merge_flags

    flags = {"data_dir": data_dir, "batch_size": BATCH, "iterations": ITERATIONS}
    config = merge_flags(
        config_files.load(config_files.resolve("mnist")), {**flags, "precision": precision}
    )
    return RunConfig("train", "mnist", config, model_dir=tempfile.mkdtemp())


def run_worker(args: argparse.Namespace) -> float:
    """Examples per second of one configuration (median of the repeats)."""
    kind, precision = args.worker.split("-", 1)
    import keras

    from tpurun import model as model_lib
    from tpurun import precision as precision_lib
    from tpurun.cluster import strategy

    run = run_config(args.data_dir, precision)
    cluster = strategy.build(run)
    model = model_lib.create(run.config)
    keras.utils.set_random_seed(0)
    with precision_lib.policy(precision):
        timed = time_tpurun if kind == "tpurun" else time_fit
        seconds = timed(run, cluster, model, args)
    return BATCH * args.steps / statistics.median(seconds)


def time_tpurun(run, cluster, model, args, iterations: int = ITERATIONS) -> list[float]:
    """Seconds of `args.steps` steps of the real Trainer, `args.repeats` times, after two
    host calls of warm-up (scripts/bench_resnet.py times its loop with it too)."""
    from tpurun.runners.train import Trainer

    trainer = Trainer(run, cluster, model)
    for _ in range(2):
        trainer.train(iterations)
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.steps // iterations):
            trainer.train(iterations)
        seconds.append(time.perf_counter() - start)
    return seconds


def time_fit(run, cluster, model, args) -> list[float]:
    import keras
    import tensorflow as tf

    from tpurun import inputs
    from tpurun.model import Mode

    keras_model = model.build()
    keras_model.compile(
        optimizer=keras.optimizers.SGD(run.config.optimizer.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=ITERATIONS,
    )
    params = inputs.input_params(tf.distribute.InputContext(), BATCH, run.seed)
    dataset = model.input_fn(Mode.TRAIN, params)  # repeats forever

    return time_fit_calls(keras_model, dataset, args, ITERATIONS)


def time_fit_calls(keras_model, dataset, args, iterations: int) -> list[float]:
    """Seconds of `args.steps` steps of Keras `fit`, `args.repeats` times, after two calls
    of warm-up (the model compiled with steps_per_execution=`iterations`; scripts/
    bench_resnet.py times its fit with it too)."""
    stamps = execution_stamps()
    calls = args.steps // iterations
    warmup = 2
    keras_model.fit(
        dataset,
        steps_per_epoch=iterations * (warmup + calls * args.repeats),
        epochs=1,
        verbose=0,
        callbacks=[stamps],
    )
    # One stamp per execution of `iterations` steps; after the warm-up calls, every
    # `calls` stamps make a repeat.
    times = stamps.stamps[warmup - 1 :]
    return [times[(i + 1) * calls] - times[i * calls] for i in range(args.repeats)]


if __name__ == "__main__":
    main()
