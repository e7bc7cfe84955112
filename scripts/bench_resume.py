"""How long a resume takes after 10 and after 10,000 steps: it must not grow with the step.

    python scripts/bench_resume.py            (or: make bench-resume)

For each model_dir trained to N steps, `tpurun train` is resumed for one more
host loop and its "Resumed at step N in ...s" line is read: the restore, plus the
first host loop, which rebuilds the input at step N. Two inputs are compared:
iris, whose input_fn seeks (tpurun.inputs.seekable_batches: O(1)), and the same
data through a plain shuffle/repeat pipeline that the launcher must skip forward
(`input_fn_seeks = False`: O(N)). Prints a table; the ratio 10,000 / 10 is what
matters, absolute times depend on the machine.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from offline_env import OFFLINE_ENV  # scripts/offline_env.py

# Iris's own data, through a pipeline that cannot seek.
SKIPPING_MODEL = textwrap.dedent(
    """
    import tensorflow as tf
    from tpurun.model import Mode, register
    from tpurun.models import iris

    @register("iris_skipping")
    class IrisSkipping(iris.Iris):
        input_fn_seeks = False

        def input_fn(self, mode, params):
            if mode is not Mode.TRAIN:
                return super().input_fn(mode, params)
            frame = iris.read_csv(iris.shipped_csv("iris_training.csv"), with_labels=True)
            features = {name: frame[name].to_numpy() for name in iris.FEATURES}
            dataset = tf.data.Dataset.from_tensor_slices((features, frame[iris.LABEL].to_numpy()))
            dataset = dataset.shuffle(120, seed=params.seed).repeat()
            return dataset.batch(params.batch_size, drop_remainder=True)
    """
)
SKIPPING_CONFIG = textwrap.dedent(
    """
    from tpurun.configs import iris

    def get_config():
        config = iris.get_config()
        config.model = "iris_skipping"
        config.model_module = "iris_skipping"
        return config
    """
)
STEPS = (10, 10_000)
REPEATS = 3


def tpurun(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "tpurun", "train", "--use_tpu=false", *args],
        cwd=cwd,
        env={**os.environ, **OFFLINE_ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        raise SystemExit(f"tpurun train {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stderr


def resume_seconds(config: str, steps: int, work: Path) -> list[float]:
    model_dir = work / f"{Path(config).stem}-{steps}"
    common = (f"--config={config}", f"--model_dir={model_dir}", "--iterations=10")
    tpurun(*common, f"--train_steps={steps}", cwd=work)
    times = []
    for repeat in range(REPEATS):
        log = tpurun(*common, f"--train_steps={steps + 10 * (repeat + 1)}", cwd=work)
        match = re.search(r"Resumed at step \d+ in ([\d.]+)s", log)
        if not match:
            raise SystemExit(f"no 'Resumed at step' line in:\n{log[-3000:]}")
        times.append(float(match.group(1)))
    return times


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "iris_skipping.py").write_text(SKIPPING_MODEL)
        (work / "iris_skipping_config.py").write_text(SKIPPING_CONFIG)
        print(f"resume time, median of {REPEATS} (s): restore + first host loop of 10 steps")
        print(f"{'input':<34}{'at step 10':>12}{'at step 10,000':>16}{'ratio':>8}")
        for label, config in (
            ("iris (seeks: seekable_batches)", "iris"),
            ("shuffle/repeat (skipped forward)", "iris_skipping_config.py"),
        ):
            medians = [statistics.median(resume_seconds(config, n, work)) for n in STEPS]
            print(
                f"{label:<34}{medians[0]:>12.3f}{medians[1]:>16.3f}{medians[1] / medians[0]:>8.2f}"
            )


if __name__ == "__main__":
    main()
