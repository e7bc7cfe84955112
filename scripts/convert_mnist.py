r"""Converts MNIST (or Fashion-MNIST) to the TFRecords `tpurun --config=mnist` reads.

Sources (nothing is downloaded):

* a directory with the official IDX files, gzipped or not:
  train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
  t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]
  (Fashion-MNIST ships files of the same names);
* a `.npz` file with arrays x_train, y_train, x_test, y_test (keras' mnist.npz).

Writes `<output_dir>/train-00000-of-00006.tfrecord ...` and `test-0000i-of-...`:
tf.train.Example records with `image_raw` (784 bytes) and `label` (int64), as
`tpurun/models/image_records.py` describes. Local paths or gs://.

Usage:
  python scripts/convert_mnist.py --source=/data/mnist --output_dir=/data/mnist/tfrecords
  python scripts/convert_mnist.py --source=/data/mnist.npz --output_dir=gs://bucket/mnist \
      --examples_per_file=5000
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

SOURCE = flags.DEFINE_string(
    "source", None, "Directory of the IDX files (.gz or plain), or an .npz file.", required=True
)
OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where to write the TFRecord files.", required=True
)
EXAMPLES_PER_FILE = flags.DEFINE_integer(
    "examples_per_file",
    10_000,
    "Examples per TFRecord file (60000 -> 6 train files).",
    lower_bound=1,
)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tpurun.models import image_records

    from tpurun.errors import TpurunError

    try:
        written = image_records.convert(SOURCE.value, OUTPUT_DIR.value, EXAMPLES_PER_FILE.value)
    except TpurunError as e:
        print(f"convert_mnist: error: {e}", file=sys.stderr)
        return 1
    for split, paths in written.items():
        print(f"{split}: {len(paths)} file(s), e.g. {paths[0]}")
    return 0


if __name__ == "__main__":
    app.run(main)
