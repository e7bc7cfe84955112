"""TensorFlow Datasets prepared by the tests with TFDS's own builder API: nothing is downloaded.

`prepare_mnist` writes the synthetic digits of tests/synthetic_images.py as TFDS's
`mnist` (version 3.0.1, features `image` uint8 [28, 28, 1] and `label`), as `tfds
build mnist --data_dir=DIR` lays it out: DIR/mnist/3.0.1/{dataset_info.json,
features.json, mnist-<split>.tfrecord-0000i-of-0000n}. Into a local directory or
onto the tests' GCS server (a gs:// data_dir: TFDS writes through tf.io.gfile).
"""

from __future__ import annotations

import numpy as np
from synthetic_images import digits

NAME, VERSION = "mnist", "3.0.1"


def prepare_mnist(data_dir: str, train: int = 400, test: int = 100, files: int = 4) -> str:
    """Prepares `mnist` in `data_dir` (`files` files per split); returns its directory."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    def split(count: int, seed: int) -> tf.data.Dataset:
        images, labels = digits(count, seed)
        return tf.data.Dataset.from_tensor_slices(
            {"image": images[..., np.newaxis], "label": labels}
        )

    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Image(shape=(28, 28, 1)),
            "label": tfds.features.ClassLabel(num_classes=10),
        }
    )
    builder = tfds.dataset_builders.store_as_tfds_dataset(
        name=NAME,
        version=VERSION,
        features=features,
        split_datasets={"train": split(train, 1), "test": split(test, 2)},
        data_dir=data_dir,
        # No lookup of prepared data on Google's servers: this one is made here.
        download_config=tfds.download.DownloadConfig(num_shards=files, try_download_gcs=False),
    )
    return str(builder.data_dir)
