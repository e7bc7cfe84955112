"""Benchmark of tpurun's training loop: device data against tf.data, and against Keras `model.fit`.

What it measures: microseconds per training step of

* tpurun, device data: `tpurun.runners.train.Trainer.train` (the real host loop) with the
             model's `train_arrays` on the device (the default for Iris): each
             replica step gathers its own batch, and with one replica the whole
             host loop is compiled by XLA;
* tpurun, tf.data: the same Trainer with `config.train.device_data=false`: the
             same batches through `tpurun.inputs.distribute` (seekable_batches);
* keras fit: `model.fit` on the same model (`Iris.build()`), data (the same
             batches, through tf.data) and optimizer (Adagrad 0.1), with
             `steps_per_execution` = iterations, at 1 replica (default strategy),
             timed two ways: "steady" by a callback inside one long fit(), like
             tpurun's loop; "per call" as whole fit() calls of a repeat's steps,
             which adds what fit() does around its steps;

for Iris (global batch 32) at 1 replica (the default strategy) and 8 replicas
(MirroredStrategy over 8 logical CPU devices: what `--num_shards=8
--use_tpu=false` builds), each at `--iterations` 1 (one step per host call:
Python dispatch dominates) and 100 (the Iris config's default); and for the
Shakespeare LSTM (its laptop config, on a generated 1 MB text) at 1 replica,
device data (with and without XLA) against tf.data, at 10 steps per host call.

How: each replica count (and Shakespeare) runs in its own subprocess (this
script with `--worker=...`), because logical CPU devices must be set before
TensorFlow initialises. Within a worker the loops being compared take turns,
repeat by repeat, so a change in the machine's load hits them alike: after a
warm-up (two host calls each, the first of which compiles), each times
`--repeats` repeats of 2000 steps (500 at iterations=1; `--scale` changes both;
Shakespeare: 20) and reports their median.

How to read it: lower is better. The lines under the tables are the targets:
device data at 1 replica and iterations=100 <= 25 us/step and >= 6x faster than
fit (steady); at 8 replicas <= 400 us/step. Figures vary with the machine and its
load (other processes on a 2-core machine easily add 20%, or much more): compare
the ratios of one run, and note the load (`uptime`), which the report prints.

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

from offline_env import execution_stamps, run_json_worker  # scripts/offline_env.py

ITERATIONS = (1, 100)
# Steps timed per repeat, by iterations. At iterations=1 each step is one host call
# (milliseconds at 8 replicas), and the figure is stable with fewer of them.
STEPS_PER_REPEAT = {1: 500, 100: 2000}
WARMUP_CALLS = 2  # host calls before timing; the first traces (and compiles) the loop
# row -> (config.train.device_data, config.train.xla)
INPUTS = {"device data": (True, True), "tf.data": (False, True)}
# Shakespeare also without XLA: on a CPU, XLA's LSTM matmuls are slower than oneDNN's.
SHAKESPEARE_INPUTS = {**INPUTS, "device data, xla=false": (True, False)}
SHAKESPEARE_ITERATIONS = 10
SHAKESPEARE_STEPS = 20  # per repeat: a laptop-config step takes ~0.1-0.3 s
WORKERS = ("iris-1", "iris-8", "shakespeare-1")

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
        "--only", nargs="+", choices=WORKERS, default=list(WORKERS), help="run only these"
    )
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    return parser.parse_args()


# --- Parent: one subprocess per worker, then the tables. ---


def run_worker(name: str, args: argparse.Namespace) -> Results:
    """Runs one worker in a fresh Python and returns its rows."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        f"--worker={name}",
        f"--scale={args.scale}",
        f"--repeats={args.repeats}",
    ]
    return run_json_worker(command)  # type: ignore[return-value]


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def print_report(results: dict[str, Results]) -> None:
    header = f"{'Iris loop':<28} {'replicas':>8}" + "".join(
        f" {f'iterations={k} (us/step)':>26}" for k in ITERATIONS
    )
    print(header)
    print("-" * len(header))
    for name in ("iris-1", "iris-8"):
        for row, per_step in results.get(name, {}).items():
            cells = "".join(f" {per_step[str(k)]:>26.1f}" for k in ITERATIONS)
            print(f"{row:<28} {name[-1]:>8}{cells}")
    print()
    if "iris-1" in results:
        one = results["iris-1"]
        device = one["tpurun, device data"]["100"]
        print(
            f"device data, 1 replica, iterations=100: {device:.1f} us/step  (target <= 25); "
            f"{one['tpurun, tf.data']['100'] / device:.1f}x faster than tf.data"
        )
        for row in ("keras fit, steady", "keras fit, per call"):
            note = "target >= 6" if row.endswith("steady") else "reference only"
            print(f"  {row} / device data: {one[row]['100'] / device:.1f}x  ({note})")
    if "iris-8" in results:
        eight = results["iris-8"]
        device = eight["tpurun, device data"]["100"]
        print(
            f"device data, 8 replicas, iterations=100: {device:.0f} us/step  (target <= 400); "
            f"{eight['tpurun, tf.data']['100'] / device:.2f}x faster than tf.data"
        )
    if "shakespeare-1" in results:
        rows = results["shakespeare-1"]
        print(
            f"\nShakespeare LSTM (laptop config), 1 replica, {SHAKESPEARE_ITERATIONS} steps per call"
        )
        for row, per_step in rows.items():
            print(f"{row:<28} {per_step[str(SHAKESPEARE_ITERATIONS)] / 1000:>10.1f} ms/step")
        before = rows["tpurun, tf.data"][str(SHAKESPEARE_ITERATIONS)]
        for row in ("tpurun, device data", "tpurun, device data, xla=false"):
            after = rows[row][str(SHAKESPEARE_ITERATIONS)]
            print(f"tf.data / {row.removeprefix('tpurun, ')}: {before / after:.2f}x")


# --- Worker: one replica count (or Shakespeare), every loop compared, in this process. ---


def run_config(config_name: str, replicas: int, model_dir: str, device: bool, **keys):
    """The RunConfig of `tpurun train --config=<name> --num_shards=<replicas>` with `keys`."""
    import importlib

    from tpurun.run_config import RunConfig, merge_flags

    config = importlib.import_module(f"tpurun.configs.{config_name}").get_config()
    config.train.device_data = device
    for key, value in keys.items():
        section, leaf = key.split(".") if "." in key else (None, key)
        (config[section] if section else config)[leaf] = value
    return RunConfig(
        command="train",
        config_name=config_name,
        config=merge_flags(config, {}),
        model_dir=model_dir,
        use_tpu=False,
        num_shards=replicas,
    )


def host_calls(iterations: int, args: argparse.Namespace) -> int:
    """Host calls (each running `iterations` steps) per timed repeat."""
    return max(1, round(STEPS_PER_REPEAT[iterations] * args.scale) // iterations)


def take_turns(loops: dict, iterations: int, calls: int, repeats: int) -> dict[str, float]:
    """Median microseconds per step of each loop; `loops[row](iterations)` runs one host call.

    The loops take turns, repeat by repeat, after WARMUP_CALLS calls each.
    """
    for run in loops.values():
        for _ in range(WARMUP_CALLS):
            run(iterations)
    seconds: dict[str, list[float]] = {row: [] for row in loops}
    for _ in range(repeats):
        for row, run in loops.items():
            start = time.perf_counter()
            for _ in range(calls):
                run(iterations)
            seconds[row].append((time.perf_counter() - start) / (calls * iterations))
    return {row: statistics.median(values) * 1e6 for row, values in seconds.items()}


def trainers(config_name: str, replicas: int, model_dir: str, rows: dict = INPUTS, **keys) -> dict:
    """row -> Trainer.train of a fresh Trainer per input; one strategy for all."""
    import keras

    from tpurun import model as model_lib
    from tpurun.cluster import strategy
    from tpurun.runners.train import Trainer

    first = run_config(config_name, replicas, model_dir, True, **keys)
    cluster = strategy.build(first)  # first: it splits the CPU before TF initialises
    assert cluster.num_replicas == replicas, cluster.description
    loops = {}
    for row, (device, xla) in rows.items():
        run = run_config(config_name, replicas, model_dir, device, **{"train.xla": xla, **keys})
        keras.utils.set_random_seed(run.seed)
        trainer = Trainer(run, cluster, model_lib.create(run.config))
        trainer.start_input()
        assert (trainer.device_data is not None) == device, row
        loops[f"tpurun, {row}"] = trainer.train
    return loops


def bench_iris(replicas: int, model_dir: str, args: argparse.Namespace) -> Results:
    loops = trainers("iris", replicas, model_dir)
    fit = FitLoops(model_dir) if replicas == 1 else None
    if fit is not None:
        loops["keras fit, per call"] = fit.per_call
    results: Results = {row: {} for row in loops}
    for iterations in ITERATIONS:
        calls = host_calls(iterations, args)
        if fit is not None:
            fit.compile(iterations)
        for row, value in take_turns(loops, iterations, calls, args.repeats).items():
            results[row][str(iterations)] = value
        if fit is not None:
            steady = fit.steady(iterations, calls, args.repeats)
            results.setdefault("keras fit, steady", {})[str(iterations)] = steady
    return results


class FitLoops:
    """Keras model.fit on Iris's model, data and optimizer; default strategy."""

    def __init__(self, model_dir: str):
        import keras
        import tensorflow as tf

        from tpurun import inputs
        from tpurun import model as model_lib

        run = run_config("iris", 1, model_dir, False)
        self.model = model_lib.create(run.config)
        keras.utils.set_random_seed(run.seed)
        params = inputs.input_params(tf.distribute.InputContext(), run.train_batch_size, run.seed)
        self.dataset = inputs.train_dataset(self.model, params)  # repeats forever
        self.keras_model = None

    def compile(self, iterations: int) -> None:
        import keras

        self.keras_model = self.model.build()
        self.keras_model.compile(
            optimizer=keras.optimizers.Adagrad(learning_rate=0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=iterations,
        )

    def per_call(self, iterations: int) -> None:
        """One whole fit() of one execution (`iterations` steps): like one host call."""
        self.keras_model.fit(self.dataset, epochs=1, steps_per_epoch=iterations, verbose=0)

    def steady(self, iterations: int, calls: int, repeats: int) -> float:
        """Median us/step of one long fit(), stamped after every execution from inside."""
        timer = execution_stamps()
        steps = (WARMUP_CALLS + repeats * calls) * iterations
        self.keras_model.fit(
            self.dataset, epochs=1, steps_per_epoch=steps, callbacks=[timer], verbose=0
        )
        per_step = []
        for r in range(repeats):  # the first WARMUP_CALLS stamps end the warm-up
            begin = WARMUP_CALLS - 1 + r * calls
            elapsed = timer.stamps[begin + calls] - timer.stamps[begin]
            per_step.append(elapsed / (calls * iterations))
        return statistics.median(per_step) * 1e6


def bench_shakespeare(model_dir: str, args: argparse.Namespace) -> Results:
    """The laptop config on a generated 1 MB text (bytes of a fixed random word list)."""
    import numpy as np

    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 5)) for _ in range(500)]
    text = os.path.join(model_dir, "text.txt")
    with open(text, "w") as f:
        f.write(" ".join(rng.choice(words, 200_000)))
    loops = trainers("shakespeare", 1, model_dir, SHAKESPEARE_INPUTS, **{"data.path": text})
    calls = max(1, round(SHAKESPEARE_STEPS * args.scale) // SHAKESPEARE_ITERATIONS)
    timed = take_turns(loops, SHAKESPEARE_ITERATIONS, calls, args.repeats)
    return {row: {str(SHAKESPEARE_ITERATIONS): value} for row, value in timed.items()}


def worker(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-train-loop-") as model_dir:
        if args.worker == "shakespeare-1":
            results = bench_shakespeare(model_dir, args)
        else:
            results = bench_iris(int(args.worker.split("-")[1]), model_dir, args)
    print(json.dumps(results))


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    start = time.perf_counter()
    before = load()
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
        f"{steps} steps; load average (1, 5, 15 min) {before} before, {load()} after)"
    )


if __name__ == "__main__":
    main()
