"""Datasets by name: a TensorFlow Datasets dataset, prepared once in a data_dir, read per input pipeline.

A config names the dataset and where it was prepared (`config_defaults.tfds_data`):

    config.data = config_defaults.tfds_data("imagenet2012", {"train": "train", "val": "validation"})
    # --config.data.tfds_data_dir=gs://my-bucket/tensorflow_datasets

and the model's `input_fn` reads it for its input pipeline:

    from tpurun import datasets

    def input_fn(self, mode, params):
        split = "train" if mode is Mode.TRAIN else params.split
        examples = datasets.tfds_examples(
            self.config.data, split, params, shuffle_files=mode is Mode.TRAIN
        )
        ...  # repeat / shuffle(seed=params.seed) / batch / decode, as with any tf.data input

`tfds_examples` gives the examples (dicts of the dataset's features) of one split
for THIS input pipeline: sharded by files when the split has at least as many
files as there are pipelines, by examples otherwise; the file order shuffled with
a seed derived from `params.seed` (never unseeded: an unseeded interleave makes a
resumed run differ from an uninterrupted one), deterministic, neither batched nor
repeated. `num_examples` counts a split from the prepared dataset's own record.

Nothing is downloaded, ever: the dataset must have been prepared with `tfds build
NAME --data_dir=DIR`; a name that is not prepared there, a data_dir that does not
exist or a split the dataset lacks is one UsageError line that says how to fix it.
The data_dir is read through TensorFlow's file system, gs:// included. TensorFlow
Datasets itself is the `tfds` extra (`pip install 'tpurun[tfds]'`), imported only
when a dataset is read. docs/datasets.md is the user's page.
"""

from __future__ import annotations

from tpurun.datasets.tfds_reader import (
    INSTALL,
    file_seed,
    num_examples,
    prepared_dir,
    tfds_examples,
    tfds_split,
    train_examples,
)

__all__ = [
    "INSTALL",
    "file_seed",
    "num_examples",
    "prepared_dir",
    "tfds_examples",
    "tfds_split",
    "train_examples",
]
