"""Benchmark of tpurun's training loop on Iris, against plain Keras `model.fit`.

What it measures: microseconds per training step of

* tpurun:    `tpurun.train.Trainer.train` (the real host loop) fed by the real
             distributed dataset of `tpurun.inputs.distribute`, at 1 replica (the
             default strategy) and at 8 replicas (MirroredStrategy over 8 logical
             CPU devices: what `--num_shards=8 --use_tpu=false` builds);
* keras fit: `model.fit` on the same model (`Iris.build()`), data (the same CSV
             and input_fn, global batch 32) and optimizer (Adagrad 0.1), with
             `steps_per_execution` = iterations, at 1 replica (default strategy),
             timed two ways: "steady" by a callback inside one long fit(), like
             tpurun's loop; "per call" as whole fit() calls of a repeat's steps,
             which adds what fit() does around its steps: its tear-down takes
             ~1 ms or ~300 ms at random (2-core machine, Keras 3.15), so this row
             flips between about the steady figure and twice it at 2000 steps;

each at `--iterations` 1 (one step per host call: Python dispatch dominates)
and 100 (100 steps per call, the Iris config's default).

How: every configuration runs in its own subprocess (this script with
`--worker=...`), because logical CPU devices must be set before TensorFlow
initialises and 1 and 8 replicas need different set-ups. A worker warms up (two
host calls, the first of which traces), then times `--repeats` repeats of 2000
steps (500 at iterations=1; `--scale` changes both) and reports their median.

How to read it: lower is better. The lines under the table are the targets:
tpurun / fit (steady) at 1 replica and iterations=100 (<= 0.5), and the
8-replica tpurun step at iterations=100 (<= 1500 us); the ratio to fit per call
is for reference only. Figures vary with the machine and its load (other
processes on a 2-core machine easily add 20%); compare runs made on the same
machine, at the same time.

Usage: `make bench`, or `.venv/bin/python scripts/bench_train_loop.py --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from offline_env import run_json_worker  # scripts/offline_env.py

ITERATIONS = (1, 100)
# Steps timed per repeat, by iterations. At iterations=1 each step is one host call
# (milliseconds at 8 replicas), and the figure is stable with fewer of them.
STEPS_PER_REPEAT = {1: 500, 100: 2000}
WARMUP_CALLS = 2  # host calls before timing; the first traces the loop
# Worker name -> replicas. The rows each worker reports are in ROWS.
WORKERS = {"tpurun-1": 1, "tpurun-8": 8, "fit-1": 1}
ROWS = {
    "tpurun-1": ("tpurun",),
    "tpurun-8": ("tpurun",),
    "fit-1": ("keras fit, steady", "keras fit, per call"),
}

# {row: {iterations (as a JSON key): microseconds per step}}
Results = dict[str, dict[str, float]]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiplies the steps timed per repeat (500 at iterations=1, 2000 at 100)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; median reported")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(WORKERS),
        default=list(WORKERS),
        help="run only these configurations",
    )
    parser.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    return parser.parse_args()


# --- Parent: one subprocess per configuration, then the table. ---


def run_worker(name: str, args: argparse.Namespace) -> Results:
    """Runs one configuration in a fresh Python and returns its rows."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        f"--worker={name}",
        f"--scale={args.scale}",
        f"--repeats={args.repeats}",
    ]
    return run_json_worker(command)  # type: ignore[return-value]


def print_report(results: dict[str, Results]) -> None:
    header = f"{'loop':<20} {'replicas':>8}" + "".join(
        f" {f'iterations={k} (us/step)':>26}" for k in ITERATIONS
    )
    print(header)
    print("-" * len(header))
    for name, rows in results.items():
        for row, per_step in rows.items():
            cells = "".join(f" {per_step[str(k)]:>26.1f}" for k in ITERATIONS)
            print(f"{row:<20} {WORKERS[name]:>8}{cells}")
    print()
    if "tpurun-1" in results and "fit-1" in results:
        tpurun = results["tpurun-1"]["tpurun"]["100"]
        for row, per_step in results["fit-1"].items():
            ratio = tpurun / per_step["100"]
            note = "target <= 0.5" if row.endswith("steady") else "reference only"
            print(f"tpurun / {row}, 1 replica, iterations=100: {ratio:.2f}  ({note})")
    if "tpurun-8" in results:
        step = results["tpurun-8"]["tpurun"]["100"]
        print(f"tpurun, 8 replicas, iterations=100: {step:.0f} us/step  (target <= 1500)")


# --- Worker: one configuration, in this process. ---


def iris_run_config(replicas: int, model_dir: str):
    """The RunConfig of `tpurun train --config=iris --use_tpu=false --num_shards=<replicas>`."""
    from tpurun.configs import iris

    from tpurun.run_config import RunConfig, merge_flags

    return RunConfig(
        command="train",
        config_name="iris",
        config=merge_flags(iris.get_config(), {}),
        model_dir=model_dir,
        use_tpu=False,
        num_shards=replicas,
    )


def host_calls(iterations: int, args: argparse.Namespace) -> int:
    """Host calls (each running `iterations` steps) per timed repeat."""
    return max(1, round(STEPS_PER_REPEAT[iterations] * args.scale) // iterations)


def total_calls(iterations: int, args: argparse.Namespace) -> int:
    return WARMUP_CALLS + args.repeats * host_calls(iterations, args)


def median_us_per_step(stamps: list[float], iterations: int, args: argparse.Namespace) -> float:
    """Median over repeats of the time per step, from a timestamp taken after every host call.

    The first WARMUP_CALLS stamps end the warm-up; each repeat is then the next
    `host_calls` calls, timed from the stamp before its first call.
    """
    calls = host_calls(iterations, args)
    assert len(stamps) == total_calls(iterations, args), len(stamps)
    per_step = []
    for r in range(args.repeats):
        begin = WARMUP_CALLS - 1 + r * calls
        per_step.append((stamps[begin + calls] - stamps[begin]) / (calls * iterations))
    return statistics.median(per_step) * 1e6


def bench_tpurun(replicas: int, model_dir: str, args: argparse.Namespace) -> Results:
    """tpurun's Trainer.train (the real host loop) on the distributed Iris input."""
    import keras

    from tpurun import model as model_lib
    from tpurun import strategy
    from tpurun.train import Trainer

    run = iris_run_config(replicas, model_dir)  # Trainer only lists it: no checkpoint is saved
    cluster = strategy.build(run)  # first: it splits the CPU before TF initialises
    assert cluster.num_replicas == replicas, cluster.description
    model = model_lib.create(run.config)
    keras.utils.set_random_seed(run.seed)
    trainer = Trainer(run, cluster, model)
    per_step = {}
    for iterations in ITERATIONS:
        stamps = []
        for _ in range(total_calls(iterations, args)):
            trainer.train(iterations)
            stamps.append(time.perf_counter())
        per_step[str(iterations)] = median_us_per_step(stamps, iterations, args)
    return {"tpurun": per_step}


def bench_fit(model_dir: str, args: argparse.Namespace) -> Results:
    """Keras model.fit on the same model, data and optimizer; default strategy."""
    import keras
    import tensorflow as tf

    from tpurun import inputs
    from tpurun import model as model_lib
    from tpurun.model import Mode

    class Stamps(keras.callbacks.Callback):
        """Timestamps the end of every execution (`steps_per_execution` steps)."""

        def __init__(self) -> None:
            super().__init__()
            self.stamps: list[float] = []

        def on_train_batch_end(self, batch, logs=None) -> None:
            self.stamps.append(time.perf_counter())

    run = iris_run_config(1, model_dir)
    model = model_lib.create(run.config)
    keras.utils.set_random_seed(run.seed)
    params = inputs.input_params(tf.distribute.InputContext(), run.train_batch_size, run.seed)
    dataset = model.input_fn(Mode.TRAIN, params)  # repeats forever
    steady, per_call = {}, {}
    for iterations in ITERATIONS:
        keras_model = model.build()
        keras_model.compile(
            optimizer=keras.optimizers.Adagrad(learning_rate=0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=iterations,
        )
        # Steady: one fit() over warm-up and repeats, stamped from inside.
        timer = Stamps()
        steps = total_calls(iterations, args) * iterations
        keras_model.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=[timer], verbose=0)
        steady[str(iterations)] = median_us_per_step(timer.stamps, iterations, args)
        # Per call: one whole (already traced) fit() per repeat.
        steps = host_calls(iterations, args) * iterations
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            keras_model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
            seconds.append(time.perf_counter() - start)
        per_call[str(iterations)] = statistics.median(seconds) / steps * 1e6
    return {"keras fit, steady": steady, "keras fit, per call": per_call}


def worker(args: argparse.Namespace) -> None:
    name = args.worker
    with tempfile.TemporaryDirectory(prefix="bench-train-loop-") as model_dir:
        if name.startswith("fit"):
            results = bench_fit(model_dir, args)
        else:
            results = bench_tpurun(WORKERS[name], model_dir, args)
    assert tuple(results) == ROWS[name], results.keys()
    print(json.dumps(results))


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    start = time.perf_counter()
    results = {}
    for name in args.only:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results[name] = run_worker(name, args)
    print_report(results)
    steps = " and ".join(
        f"{round(n * args.scale)} at iterations={k}" for k, n in STEPS_PER_REPEAT.items()
    )
    print(
        f"\n({time.perf_counter() - start:.0f} s; median of {args.repeats} repeats of "
        f"{steps} steps)"
    )


if __name__ == "__main__":
    main()
