"""Benchmark of ResNet-50's input pipeline and training step: tpurun against the usual alternatives.

1. The training input pipeline, 224x224 crops per second, on the same synthetic
   ImageNet-sized JPEGs in imagenet_to_gcs.py's TFRecord format (random-looking
   images of 300 to 500 pixels a side, ~100 KB each):

   * tpurun:       resnet50's input_fn(TRAIN) (keyed Inception crops decoded alone
                   with decode_and_crop_jpeg, bicubic resize, flip; bfloat16 out);
   * naive:        the Keras-tutorial way: decode the whole JPEG, then crop the same
                   Inception window (sample_distorted_bounding_box), resize, flip;
   * model garden: Model Garden's classification input (official.vision's
                   classification_input Decoder and Parser, training, bfloat16 out),
                   from `tf-models-official` in a venv of its own (.venv-bench, made
                   here with uv). Its TensorFlow is the one tf-models-official pins,
                   so all three pipelines are timed in that venv (tpurun installed
                   there too) and tpurun's again in the project's .venv.

   Each pipeline reads the files interleaved, shuffles records, maps in parallel
   (AUTOTUNE) and batches by 128, as each of them does; each runs in a process of
   its own, warmed up, then timed over --batches batches, --repeats times in turn
   with the others (the median is reported). Target: tpurun >= 1.0x the best other.

2. Training examples per second of ResNet-50 at the cpu variant's size (32x32 crops,
   width 8, one block per group, batch 32, mixed_bfloat16), on JPEG TFRecords through
   the model's own input_fn: tpurun's Trainer.train(iterations), the real host loop,
   against Keras `model.fit` of the same Keras model, dataset, loss and optimizer (the
   recipe's SGD), with steps_per_execution = iterations. Target: >= 1.0x.

Timings on a shared machine are noisy: compare ratios of one run. Usage: `make bench`
(after the other benchmarks), or `.venv/bin/python scripts/bench_resnet.py --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_mnist import time_fit_calls, time_tpurun  # both loops, timed as for MNIST
from offline_env import run_json_worker  # scripts/offline_env.py

REPO = Path(__file__).resolve().parent.parent
BENCH_VENV = REPO / ".venv-bench"
MODEL_GARDEN = "tf-models-official==2.20.0"
PIPELINES = ("tpurun", "naive", "model_garden")
BATCH = 128
IMAGE_SIZE = 224
TRAIN_BATCH, ITERATIONS = 32, 10  # the cpu variant's batch; steps per host call


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1024, help="synthetic JPEGs written")
    parser.add_argument("--batches", type=int, default=12, help="input batches timed per repeat")
    parser.add_argument("--steps", type=int, default=100, help="training steps timed per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; median reported")
    parser.add_argument(
        "--no_model_garden", action="store_true", help="skip the venv of tf-models-official"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(run_worker(args)))
        return
    with tempfile.TemporaryDirectory() as data_dir:
        write_data(Path(data_dir), args.images)
        bench_python, why = bench_venv(args)
        pipelines = time_pipelines(data_dir, args, bench_python)
        training = {
            kind: run(sys.executable, f"train-{kind}", data_dir, args) for kind in ("tpurun", "fit")
        }
    report(pipelines, training, why)


def report(pipelines: dict[str, float], training: dict[str, float], why: str) -> None:
    print(
        f"\nResNet-50 training input, {IMAGE_SIZE}x{IMAGE_SIZE} crops, batch {BATCH}, this machine"
    )
    print(f"{'pipeline':<44} {'images/s':>10}")
    for name, rate in pipelines.items():
        print(f"{name:<44} {rate:>10.0f}")
    ours = pipelines.get("tpurun (.venv-bench)") or pipelines["tpurun (.venv)"]
    others = {n: r for n, r in pipelines.items() if not n.startswith("tpurun")}
    best = max(others, key=lambda n: others[n])
    print(f"\ntpurun / best other ({best}) = {ours / others[best]:.2f}  (target >= 1.0)")
    if why:
        print(f"Model Garden not timed: {why}")
    print(
        f"\nResNet-50 cpu size (32x32, width 8, blocks 1-1-1-1), batch {TRAIN_BATCH}, "
        f"mixed_bfloat16, {ITERATIONS} steps per call"
    )
    print(f"{'loop':<44} {'examples/s':>10}")
    print(f"{'tpurun Trainer':<44} {training['tpurun']:>10.0f}")
    print(f"{'keras fit':<44} {training['fit']:>10.0f}")
    print(f"\ntpurun / keras fit = {training['tpurun'] / training['fit']:.2f}  (target >= 1.0)")


# --- the data ---------------------------------------------------------------------------


def write_data(data_dir: Path, count: int) -> None:
    """`count` JPEGs of 300-500 pixels a side in 8 train files (imagenet_to_gcs's names and
    keys), random-looking enough to weigh what ImageNet's do (~100 KB)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    files = 8
    writers = [
        tf.io.TFRecordWriter(str(data_dir / f"train-{i:05d}-of-{files:05d}")) for i in range(files)
    ]
    for n in range(count):
        height, width = (int(x) for x in rng.integers(300, 501, size=2))
        coarse = rng.integers(0, 256, size=(height // 8 + 1, width // 8 + 1, 3)).astype(np.float32)
        smooth = np.repeat(np.repeat(coarse, 8, axis=0), 8, axis=1)[:height, :width]
        noise = rng.normal(0, 20, size=(height, width, 3))
        image = np.clip(smooth + noise, 0, 255).astype(np.uint8)
        jpeg = tf.io.encode_jpeg(image, quality=90).numpy()
        feature = {
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
            "image/class/label": tf.train.Feature(
                int64_list=tf.train.Int64List(value=[int(rng.integers(1, 1001))])
            ),
        }
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        writers[n % files].write(example.SerializeToString())
    for writer in writers:
        writer.close()


# --- the venv of Model Garden ------------------------------------------------------------


def bench_venv(args: argparse.Namespace) -> tuple[str | None, str]:
    """The Python of .venv-bench (tf-models-official and tpurun, made once with uv), or
    None and why there is none."""
    if args.no_model_garden:
        return None, "--no_model_garden"
    python = BENCH_VENV / "bin" / "python"
    stamp = BENCH_VENV / ".installed"
    if not stamp.exists():
        uv = Path(sys.executable).parent / "uv"
        print(f"Making {BENCH_VENV.name} ({MODEL_GARDEN}, with its TensorFlow; a few minutes)...")
        steps = [
            [str(uv), "venv", "--quiet", "--python", sys.executable, str(BENCH_VENV)],
            [
                str(uv),
                "pip",
                "install",
                "--quiet",
                "--native-tls",
                "--python",
                str(python),
                MODEL_GARDEN,
                "-e",
                str(REPO),
            ],
        ]
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            if result.returncode != 0:
                lines = (result.stderr or result.stdout).strip().splitlines()
                return None, f"{MODEL_GARDEN} did not install: {lines[-1] if lines else '?'}"
        stamp.touch()
    return str(python), ""


# --- timing -------------------------------------------------------------------------------


def run(python: str, worker: str, data_dir: str, args: argparse.Namespace) -> float:
    command = [
        python,
        os.path.abspath(__file__),
        f"--worker={worker}",
        f"--data_dir={data_dir}",
        f"--batches={args.batches}",
        f"--steps={args.steps}",
        "--repeats=1" if worker.startswith("input-") else f"--repeats={args.repeats}",
    ]
    return float(run_json_worker(command))  # type: ignore[arg-type]


def time_pipelines(data_dir: str, args: argparse.Namespace, bench: str | None) -> dict[str, float]:
    """Images/s of each pipeline: the median of --repeats runs, the pipelines in turn."""
    runs: list[tuple[str, str, str]] = [("tpurun (.venv)", sys.executable, "tpurun")]
    if bench:
        runs += [(f"{name} (.venv-bench)", bench, name) for name in PIPELINES]
    else:
        runs += [("naive (.venv)", sys.executable, "naive")]
    rates: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for _ in range(args.repeats):
        for label, python, name in runs:
            rates[label].append(run(python, f"input-{name}", data_dir, args))
    return {label: statistics.median(values) for label, values in rates.items()}


def run_worker(args: argparse.Namespace) -> float:
    kind, name = args.worker.split("-", 1)
    if kind == "input":
        return time_input(name, args)
    return time_training(name, args)


def time_input(name: str, args: argparse.Namespace) -> float:
    import tensorflow as tf

    dataset = {"tpurun": tpurun_input, "naive": naive_input, "model_garden": garden_input}[name](
        args.data_dir
    )
    iterator = iter(dataset)
    for _ in range(3):  # warm up: threads started, buffers filled, autotune settling
        next(iterator)
    start = time.perf_counter()
    for _ in range(args.batches):
        images, _ = next(iterator)
    tf.nest.map_structure(lambda t: t.numpy(), images)
    return BATCH * args.batches / (time.perf_counter() - start)


def _records(data_dir: str):
    """What every pipeline reads: the train files interleaved, shuffled, repeated."""
    import tensorflow as tf

    files = tf.data.Dataset.list_files(f"{data_dir}/train-*", shuffle=True, seed=0).repeat()
    records = files.interleave(
        tf.data.TFRecordDataset, cycle_length=8, num_parallel_calls=tf.data.AUTOTUNE
    )
    return records.shuffle(1024, seed=0)


def tpurun_input(data_dir: str):
    from tpurun import model as model_lib
    from tpurun.model import InputParams, Mode
    from tpurun.run_config import config_files

    config = config_files.load(config_files.resolve("resnet50"))
    config.data.data_dir = data_dir
    config.data.shuffle_buffer = 1024
    config.data.cycle_length = 8
    params = InputParams(BATCH, BATCH, 1, 0, 1, seed=0)
    return model_lib.create(config).input_fn(Mode.TRAIN, params)


def naive_input(data_dir: str):
    """Decode the whole JPEG, then crop the Inception window: what a Keras tutorial does."""
    import tensorflow as tf

    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def preprocess(record):
        parsed = tf.io.parse_single_example(record, spec)
        image = tf.io.decode_jpeg(parsed["image/encoded"], channels=3)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.shape(image),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            min_object_covered=0.1,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        image = tf.slice(image, begin, size)
        image = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE], method="bicubic")
        image = tf.image.random_flip_left_right(image)
        return tf.cast(image, tf.bfloat16), tf.cast(parsed["image/class/label"] - 1, tf.int32)

    records = _records(data_dir)
    images = records.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    return images.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def garden_input(data_dir: str):
    """Model Garden's classification input (its Decoder and training Parser), as its
    InputReader maps them: decode, then parse, in parallel, then batch."""
    import tensorflow as tf
    from official.vision.dataloaders import classification_input

    decoder = classification_input.Decoder()
    parser = classification_input.Parser(
        output_size=[IMAGE_SIZE, IMAGE_SIZE], num_classes=1000, dtype="bfloat16"
    )
    parse = parser.parse_fn(is_training=True)
    records = _records(data_dir)
    images = records.map(lambda r: parse(decoder.decode(r)), num_parallel_calls=tf.data.AUTOTUNE)
    return images.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def time_training(kind: str, args: argparse.Namespace) -> float:
    import keras

    from tpurun import model as model_lib
    from tpurun import precision as precision_lib
    from tpurun.cluster import strategy
    from tpurun.run_config import RunConfig, config_files, merge_flags

    config = config_files.load(config_files.resolve("resnet50:cpu"))
    config.num_classes = 1000  # the bench's labels are ImageNet's
    flags = {"data_dir": args.data_dir, "iterations": ITERATIONS, "train_steps": 10**6}
    config = merge_flags(config, flags)
    run_config = RunConfig("train", "resnet50", config, model_dir=tempfile.mkdtemp())
    cluster = strategy.build(run_config)
    model = model_lib.create(run_config.config)
    keras.utils.set_random_seed(0)
    with precision_lib.policy(run_config.config.precision):
        if kind == "tpurun":
            seconds = time_tpurun(run_config, cluster, model, args, ITERATIONS)
        else:
            seconds = time_fit(run_config, cluster, model, args)
    return TRAIN_BATCH * args.steps / statistics.median(seconds)


def time_fit(run_config, cluster, model, args) -> list[float]:
    import tensorflow as tf

    from tpurun import inputs
    from tpurun.model import Mode

    keras_model = model.build()
    keras_model.compile(
        optimizer=model.optimizer(),  # the recipe's: SGD, Nesterov, L2, warmup and steps
        # (Keras hands a loss function float labels: class ids again.)
        loss=lambda labels, logits: model.loss(
            tf.cast(labels, tf.int32), tf.cast(logits, tf.float32)
        ),
        steps_per_execution=ITERATIONS,
    )
    params = inputs.input_params(tf.distribute.InputContext(), TRAIN_BATCH, run_config.seed)
    dataset = model.input_fn(Mode.TRAIN, params)  # the same batches, endless
    return time_fit_calls(keras_model, dataset, args, ITERATIONS)


if __name__ == "__main__":
    main()
