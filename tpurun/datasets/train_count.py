"""The training examples a run's data hold, where the data can count them.

A run that says a length in epochs needs them (`tpurun.run_config.epochs.resolve_length`
turns epochs into steps): in-memory arrays count themselves, a TFDS dataset's record
counts its train split, and the TFRecord files a model names (`Model.train_record_files`)
are counted where that is cheap: on this machine's disk, `COUNT_BYTES` at most. Where
nothing counts them, the config's `data.train_examples` says them; where both do and
differ, `resolve_length` warns and counts the data.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import tensorflow as tf
from absl import logging

from tpurun.datasets.tfds_reader import train_examples
from tpurun.errors import TpurunError
from tpurun.model import Model, TrainArrays
from tpurun.run_config.epochs import Counted

# The most bytes of TFRecord files counted. Counting reads each record's 8-byte length and
# seeks past the record, so its time grows with the records: MNIST's 60,000 take about
# 0.1 s here, and a GiB of records of a KB or more (a million at most) a few seconds, at
# the start of a run that trains for many minutes. Past it (a local ImageNet: 140 GB, 1.3
# million records) the config's data.train_examples is trusted. Files on gs:// are never
# counted: every seek there is a request of tens of milliseconds.
COUNT_BYTES = 2**30
# A TFRecord: the data's length (uint64, little-endian) and its masked CRC (4 bytes), the
# data, and the data's masked CRC (4 bytes).
_HEADER = 12
_FOOTER = 4


def counted(model: Model, arrays: TrainArrays | None) -> Counted | None:
    """The training examples counted in `model`'s data, whose in-memory training arrays
    are `arrays` (None: it has none); None where nothing counts them cheaply."""
    if arrays is not None:
        return Counted(arrays.num_examples, "counted in the model's train_arrays")
    examples = train_examples(model.config)
    if examples is not None:
        return Counted(examples, "counted by the prepared TFDS dataset's train split")
    try:
        files = model.train_record_files()
    except (TpurunError, OSError, tf.errors.OpError):
        return None  # no training data found: its input says so when it reads them
    if not files:
        return None
    records = count_records(files)
    if records is None:
        return None
    where = f"{len(files)} TFRecord file{'s' * (len(files) > 1)}"
    return Counted(records, f"counted in the {where} of the training data")


def count_records(files: Sequence[str]) -> int | None:
    """The records of uncompressed TFRecord files on this machine's disk, together at most
    COUNT_BYTES; None where they cannot be counted so (on gs://, larger, or a file whose
    lengths do not frame it: compressed, truncated, not TFRecords)."""
    if any("://" in path for path in files):
        return None
    try:
        sizes = [os.path.getsize(path) for path in files]
    except OSError:
        return None  # the input says what is wrong with the file when it reads it
    if sum(sizes) > COUNT_BYTES:
        return None
    total = 0
    for path, size in zip(files, sizes, strict=True):
        records = _records_in(path, size)
        if records is None:
            logging.info("%s is not an uncompressed TFRecord file: its records not counted.", path)
            return None
        total += records
    return total


def _records_in(path: str, size: int) -> int | None:
    """The records of one file, by walking the lengths; None unless they end at its end."""
    records = position = 0
    try:
        with open(path, "rb", buffering=0) as file:
            while position < size:
                length = file.read(8)
                if len(length) < 8:
                    return None
                position += _HEADER + int.from_bytes(length, "little") + _FOOTER
                if position > size:
                    return None
                file.seek(position)
                records += 1
    except OSError:
        return None
    return records
