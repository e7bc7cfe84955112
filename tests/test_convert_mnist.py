"""The MNIST converter: official IDX files (gzipped or plain) and mnist.npz -> TFRecords -> back."""

from __future__ import annotations

import gzip
import struct
import sys
from pathlib import Path

import forked
import numpy as np
import pytest
from conftest import REPO
from synthetic_images import digits

SIZES = {"train": 25, "test": 12}


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array: magic 0x0000080<ndim>, big-endian dims, data."""
    return (
        struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
        + struct.pack(f">{array.ndim}I", *array.shape)
        + array.astype(np.uint8).tobytes()
    )


def write_source(tmp_path: Path, kind: str) -> tuple[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Writes the splits in format `kind`; returns the source path and the arrays written."""
    arrays = {split: digits(count, seed) for seed, (split, count) in enumerate(SIZES.items())}
    if kind == "npz":
        path = tmp_path / "mnist.npz"
        (x_train, y_train), (x_test, y_test) = arrays["train"], arrays["test"]
        np.savez(
            path, x_train=x_train, y_train=y_train.astype(np.uint8), x_test=x_test, y_test=y_test
        )
        return str(path), arrays
    source = tmp_path / "idx"
    source.mkdir()
    names = {
        "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    }
    for split, (images, labels) in arrays.items():
        for name, array in zip(names[split], (images, labels), strict=True):
            data = idx_bytes(array)
            if kind == "idx-gz":
                (source / (name + ".gz")).write_bytes(gzip.compress(data))
            else:
                (source / name).write_bytes(data)
    return str(source), arrays


@pytest.mark.parametrize("kind", ["idx-gz", "idx-plain", "npz"])
def test_round_trip_through_the_models_reader(tmp_path, kind):
    from tpurun.models import image_records

    from tpurun.model import InputParams, Mode

    source, arrays = write_source(tmp_path, kind)
    out = tmp_path / "records"
    written = image_records.convert(source, str(out), examples_per_file=10)
    assert [Path(p).name for p in written["train"]] == [
        f"train-0000{i}-of-00003.tfrecord" for i in range(3)
    ]
    assert [Path(p).name for p in written["test"]] == [
        "test-00000-of-00002.tfrecord",
        "test-00001-of-00002.tfrecord",
    ]
    for split, (images, labels) in arrays.items():
        files = image_records.list_files(str(out / f"{split}-*.tfrecord"), split)
        read_images, read_labels = image_records.read_arrays(files)
        np.testing.assert_array_equal(read_images, images)
        np.testing.assert_array_equal(read_labels, labels)
        # What the models see: the same pixels scaled to [-0.5, 0.5], int32 labels.
        params = InputParams(8, 8, 1, 0, 1, 0)
        batches = list(image_records.dataset(files, Mode.EVAL, params))
        pixels = np.concatenate([f["image"].numpy() for f, _ in batches])
        np.testing.assert_allclose(pixels, images.reshape(-1, 784) / 255 - 0.5, atol=1e-6)
        np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in batches]), labels)


def test_truncated_idx_file_is_named(tmp_path):
    from tpurun.models import image_records

    from tpurun.errors import RunError

    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(idx_bytes(digits(3, 0)[0])[:-5])
    with pytest.raises(RunError, match="truncated"):
        image_records.read_idx(str(path))


@pytest.mark.slow
def test_script(tmp_path):
    source, arrays = write_source(tmp_path, "idx-gz")
    result = forked.run(
        [
            sys.executable,
            str(REPO / "scripts" / "convert_mnist.py"),
            f"--source={source}",
            f"--output_dir={tmp_path / 'out'}",
            "--examples_per_file=20",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("train: 2 file(s), e.g. ")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "test-00000-of-00001.tfrecord",
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    result = forked.run(
        [
            sys.executable,
            str(REPO / "scripts" / "convert_mnist.py"),
            f"--source={tmp_path}",
            f"--output_dir={tmp_path / 'out2'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "convert_mnist: error:" in result.stderr and "train-images-idx3-ubyte" in result.stderr
