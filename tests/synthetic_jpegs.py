"""A learnable synthetic ImageNet, in imagenet_to_gcs.py's TFRecords or as TFDS's imagenet2012.

Ten classes, each a colour of its own under noise and a random gradient, at sizes
that vary (non-square, 36 to 64 pixels a side, so crops and resizes do work).
`write_imagenet`: files `train-00000-of-00004` ..., `validation-00000-of-00002` ...;
each record holds the keys imagenet_to_gcs writes (`image/encoded`,
`image/class/label` 1..10, `image/format`, `image/class/synset`, `image/height`,
...). `prepare_imagenet2012`: the same images as TFDS's `imagenet2012` (features
`image`, a JPEG, `label` 0..9, `file_name`), prepared with TFDS's own builder API as
`tfds build` lays it out. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CLASSES = 10
TRAIN, VALIDATION = 320, 90  # the cpu config's data.train_examples is TRAIN
# Ten colours far apart (RGB).
PALETTE = np.array(
    [
        [220, 40, 40],
        [40, 200, 40],
        [40, 60, 220],
        [230, 220, 40],
        [40, 220, 220],
        [220, 40, 220],
        [250, 250, 250],
        [20, 20, 20],
        [240, 140, 30],
        [120, 60, 160],
    ],
    "float32",
)


def images(count: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """`count` uint8 RGB images of varying sizes and their classes 0..9, classes in turn."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % CLASSES
    rng.shuffle(labels)
    made = []
    for label in labels:
        height, width = rng.integers(36, 65, size=2)
        gradient = np.linspace(-40, 40, width, dtype="float32")[None, :, None]
        noise = rng.normal(0, 25, size=(height, width, 3)).astype("float32")
        pixels = PALETTE[label] + noise + gradient * rng.choice([-1.0, 1.0])
        made.append(np.clip(np.round(pixels), 0, 255).astype(np.uint8))
    return made, labels.astype(np.int64)


def example(jpeg: bytes, label: int, height: int, width: int, name: str):
    """One tf.train.Example with the keys imagenet_to_gcs.py's _convert_to_example writes."""
    import tensorflow as tf

    def strings(*values: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))

    def ints(*values: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/height": ints(height),
                "image/width": ints(width),
                "image/colorspace": strings(b"RGB"),
                "image/channels": ints(3),
                "image/class/label": ints(label),
                "image/class/synset": strings(f"n{label:08d}".encode()),
                "image/format": strings(b"JPEG"),
                "image/filename": strings(name.encode()),
                "image/encoded": strings(jpeg),
            }
        )
    )


def encode(image: np.ndarray) -> bytes:
    import tensorflow as tf

    return tf.io.encode_jpeg(image, quality=90).numpy()


def write_split(
    data_dir: Path, split: str, count: int, num_files: int, seed: int
) -> tuple[list[bytes], np.ndarray]:
    """`<split>-0000i-of-0000n` files of `count` examples; returns their JPEGs and classes
    0..9, in file order (labels in the files are 1..10, as imagenet_to_gcs's)."""
    import tensorflow as tf

    data_dir.mkdir(parents=True, exist_ok=True)
    made, labels = images(count, seed)
    jpegs = [encode(image) for image in made]
    per_file = -(-count // num_files)
    for index in range(num_files):
        path = data_dir / f"{split}-{index:05d}-of-{num_files:05d}"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for n in range(index * per_file, min(count, (index + 1) * per_file)):
                height, width = made[n].shape[:2]
                record = example(jpegs[n], int(labels[n]) + 1, height, width, f"{split}_{n}.JPEG")
                writer.write(record.SerializeToString())
    return jpegs, labels


def write_imagenet(data_dir: Path, train: int = TRAIN, validation: int = VALIDATION) -> Path:
    """Train (4 files) and validation (2 files) in imagenet_to_gcs's format in data_dir."""
    write_split(data_dir, "train", train, 4, seed=1)
    write_split(data_dir, "validation", validation, 2, seed=2)
    return data_dir


def prepare_imagenet2012(data_dir: str, files: int = 4) -> str:
    """The images of `write_imagenet` as TFDS's imagenet2012 (5.1.0) in `data_dir` (local
    or gs://), `files` files per split; returns the prepared directory."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    def split(count: int, seed: int) -> tf.data.Dataset:
        made, labels = images(count, seed)
        rows = [
            {"image": image, "label": int(label), "file_name": f"{n}.JPEG"}
            for n, (image, label) in enumerate(zip(made, labels, strict=True))
        ]
        spec = {
            "image": tf.TensorSpec([None, None, 3], tf.uint8),
            "label": tf.TensorSpec([], tf.int64),
            "file_name": tf.TensorSpec([], tf.string),
        }
        return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=spec)

    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Image(encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=CLASSES),
            "file_name": tfds.features.Text(),
        }
    )
    builder = tfds.dataset_builders.store_as_tfds_dataset(
        name="imagenet2012",
        version="5.1.0",
        features=features,
        split_datasets={"train": split(TRAIN, 1), "validation": split(VALIDATION, 2)},
        data_dir=data_dir,
        download_config=tfds.download.DownloadConfig(num_shards=files, try_download_gcs=False),
    )
    return str(builder.data_dir)
