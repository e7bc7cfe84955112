"""Benchmark of the device-data host loop's choice: config.train.xla="auto" against both loops.

What it measures, for two users' GANs written from the manual (scripts/user_gans/, copied
out of the repository and run from there as a user's config files): a WGAN-GP on the
"8 Gaussians" toy set (3 ReLU layers of 512 units, 5 critic updates, the gradient
penalty, batch 256) and keras-io's DCGAN ported (64x64 images, or `:small`, 32x32;
batch 32), each one replica on this CPU, training data on the device:

* the default, `config.train.xla="auto"`: what `Trainer.start_input` cost (both loops
  compiled and timed on copies of the state, `DeviceLoop.time_both`), the loop it chose
  and why;
* then steps per second of three Trainers of the same config, taking turns host loop by
  host loop after one warm-up call each (the first compiles): auto (running the loop it
  chose), `xla=true` and `xla=false`.

How to read it: the auto column must match the faster forced loop (within noise); the
ratios of one run count, not the absolute figures (a shared 2-core machine's load moves
them; the report prints the load before and after). Each model runs in a subprocess of
its own.

Usage: `.venv/bin/python scripts/bench_loop_choice.py [--repeats=3] [--only gauss dcgan]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from offline_env import run_json_worker  # scripts/offline_env.py

SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_gans")
# worker -> (config file, its argument, steps per host call)
MODELS = {
    "gauss": ("gauss_config.py", "", 20),
    "dcgan": ("dcgan_config.py", "", 2),
    "dcgan-small": ("dcgan_config.py", "small", 4),
}
LOOPS = ("auto", True, False)  # config.train.xla of the three Trainers


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed host calls of each loop")
    parser.add_argument("--only", nargs="+", choices=MODELS, default=["gauss", "dcgan-small"])
    parser.add_argument("--worker", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    return parser.parse_args()


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(args: argparse.Namespace) -> None:
    directory = tempfile.mkdtemp(prefix="user_gans-")  # a user's project, outside the repo
    try:
        for name in os.listdir(SOURCES):
            if name.endswith(".py"):
                shutil.copy(os.path.join(SOURCES, name), directory)
        print(f"load average before: {load()}")
        results = {}
        for name in args.only:
            command = [sys.executable, os.path.abspath(__file__), f"--worker={name}"]
            command += [f"--repeats={args.repeats}", f"--directory={directory}"]
            results[name] = run_json_worker(command)
        print(f"load average after:  {load()}\n")
        report(results)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def report(results: dict) -> None:
    header = f"{'model':<12} {'steps/call':>10} {'auto':>8} {'xla=true':>9} {'xla=false':>10}"
    print(header + "   (steps/s, median of the timed calls)")
    for name, result in results.items():
        rate = result["steps_per_s"]
        print(
            f"{name:<12} {result['steps']:>10} {rate['auto']:>8.3g} {rate['True']:>9.3g} "
            f"{rate['False']:>10.3g}"
        )
    for name, result in results.items():
        rate = result["steps_per_s"]
        best = max(rate["True"], rate["False"])
        print(
            f"\n{name}: auto / the faster forced loop = {rate['auto'] / best:.2f}; "
            f"xla=false / xla=true = {rate['False'] / rate['True']:.2f}"
        )
        print(f"  auto chose in {result['choice_s']:.1f}s: {result['why']}")
        calls = "; ".join(
            f"{k} " + ", ".join(f"{t:.2f}" for t in v) for k, v in result["seconds"].items()
        )
        print(f"  the timed calls, s (in turn): {calls}")
        compiled = ", ".join(f"xla={k} {v:.1f}s" for k, v in result["first_call_s"].items())
        print(f"  the forced loops' first call (compile and {result['steps']} steps): {compiled}")


def worker(args: argparse.Namespace) -> dict:
    import keras

    from tpurun import model as model_lib
    from tpurun.cluster import strategy
    from tpurun.run_config import RunConfig, config_files, merge_flags
    from tpurun.runners.train import Trainer

    file, variant, steps = MODELS[args.worker]
    source = config_files.resolve(
        os.path.join(args.directory, file) + (f":{variant}" * bool(variant))
    )
    model_dir = tempfile.mkdtemp()

    def run_config(xla: object) -> RunConfig:
        config = config_files.load(source)
        config.train.xla = xla
        config.train.iterations = steps
        # A long run's, which auto times (it runs a short run's plain loop, untimed).
        config.train.steps = max(config.train.steps, 10_000)
        return RunConfig("train", source.name, merge_flags(config, {}), model_dir, use_tpu=False)

    cluster = strategy.build(run_config("auto"))
    trainers: dict[str, Trainer] = {}
    first_call: dict[str, float] = {}
    for xla in LOOPS:
        run = run_config(xla)
        keras.utils.set_random_seed(run.seed)
        trainer = Trainer(run, cluster, model_lib.create(run.config))
        start = time.perf_counter()
        trainer.start_input()  # auto: times both loops here
        if xla == "auto":
            choice_s = time.perf_counter() - start
            times = trainer.loop_times
            assert times is not None, "auto timed no loops: not on device data?"
            why = f"{'XLA' if times.use_xla else 'the plain loop'}: {times.shown()}"
        start = time.perf_counter()
        trainer.train(steps)  # the forced loops compile here; auto's did above
        first_call[str(xla)] = time.perf_counter() - start
        trainers[str(xla)] = trainer
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(args.repeats):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            trainer.train(steps)
            seconds[name].append(time.perf_counter() - start)
    return {
        "steps": steps,
        "steps_per_s": {name: steps / statistics.median(s) for name, s in seconds.items()},
        "seconds": seconds,
        "choice_s": choice_s,
        "why": why,
        "first_call_s": {k: v for k, v in first_call.items() if k != "auto"},
    }


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.worker:
        print(json.dumps(worker(arguments)))
    else:
        main(arguments)
