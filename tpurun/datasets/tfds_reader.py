"""Reads a prepared TensorFlow Datasets dataset by name: where it is, its splits, one pipeline's examples.

The dataset is found by path, never by TFDS's registry: `prepared_dir` looks for
`<tfds_data_dir>/<name>[/<config>]/<version>/dataset_info.json` (the layout `tfds
build` writes; the newest version when the name gives none), and
`tfds.builder_from_directory` reads it from its files alone. So no dataset code is
imported or run, no download or GCS lookup can start (`tfds.builder` may do both
for some names), and a dataset prepared by an older TFDS still reads.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import ml_collections
import tensorflow as tf
from absl import logging

from tpurun.errors import RunError, UsageError
from tpurun.model import InputParams
from tpurun.storage_errors import explain
from tpurun.tf_errors import one_line

INSTALL = "pip install 'tpurun[tfds]'"
INFO_FILE = "dataset_info.json"
# name[/config][:version], as `tfds build` takes it: "mnist", "mnist:3.0.1",
# "imagenet2012_subset/10pct:5.0.0". (A community "namespace:name" is not read here.)
_NAME = re.compile(r"(?P<name>[a-z][a-z0-9_]*)(?:/(?P<config>[\w.\-]+))?(?::(?P<version>\S+))?")
_VERSION = re.compile(r"\d+\.\d+\.\d+")
_T = TypeVar("_T")

# A config's `data` section (or the whole config, for `train_examples`).
Data: TypeAlias = ml_collections.ConfigDict | ml_collections.FrozenConfigDict


def tfds_examples(
    data: Data,
    split: str,
    params: InputParams,
    *,
    shuffle_files: bool,
    decoders: Any = None,
) -> tf.data.Dataset:
    """The examples of tpurun's `split` (mapped by data.tfds_splits) of the dataset
    data.tfds_name in data.tfds_data_dir, for the input pipeline `params` describes.

    Sharded over the input pipelines by files when the split has at least as many as
    there are pipelines (TFDS's own file sharding), else by examples (an even sub-split
    per pipeline). `shuffle_files`: the file order shuffled, differently every epoch,
    with `file_seed(params.seed)` (an ordered dataset, prepared with
    disable_shuffling, keeps its order). Deterministic; neither batched nor repeated.
    `decoders` goes to TFDS as is (e.g. `tfds.decode.SkipDecoding()` for JPEG bytes).
    """
    tfds = _tfds()
    builder = _builder(prepared_dir(data))
    spec = tfds_split(data, split)
    info = _split_info(builder, data, split, spec)
    read, context = spec, None
    pipelines = params.num_input_pipelines
    if pipelines > 1 and info.num_shards >= pipelines:
        context = tf.distribute.InputContext(
            num_input_pipelines=pipelines,
            input_pipeline_id=params.input_pipeline_id,
            num_replicas_in_sync=params.num_replicas,
        )
    elif pipelines > 1:  # fewer files than pipelines: TFDS would refuse the context
        read = tfds.even_splits(spec, pipelines)[params.input_pipeline_id]
    if shuffle_files and builder.info.disable_shuffling:
        logging.info(
            "%s is an ordered dataset (prepared with disable_shuffling): its files are read "
            "in order.",
            data.tfds_name,
        )
        shuffle_files = False
    options = tf.data.Options()
    options.deterministic = True  # TFDS would turn it off for unseeded file shuffles
    read_config = tfds.ReadConfig(
        options=options,
        shuffle_seed=file_seed(params.seed) if shuffle_files else None,
        shuffle_reshuffle_each_iteration=True if shuffle_files else None,
        input_context=context,
    )
    return _reading(
        data,
        lambda: builder.as_dataset(
            split=read, shuffle_files=shuffle_files, decoders=decoders, read_config=read_config
        ),
    )


def num_examples(data: Data, split: str) -> int:
    """The examples of tpurun's `split` of the prepared dataset, from its own record (for
    epochs, and to size an exact eval)."""
    spec = tfds_split(data, split)
    return int(_split_info(_builder(prepared_dir(data)), data, split, spec).num_examples)


def train_examples(config: Data) -> int | None:
    """The training examples of a config whose data name a TFDS dataset (its "train"
    split); None when it names none."""
    data = config.get("data") or {}
    if not data.get("tfds_name"):
        return None
    return num_examples(data, "train")


def tfds_split(data: Data, split: str) -> str:
    """The dataset's split spec that data.tfds_splits maps tpurun's `split` to."""
    splits = data.get("tfds_splits") or {}
    if split not in splits:
        raise UsageError(
            f"config.data.tfds_splits maps no split {split!r} (it maps "
            f"{', '.join(splits) or 'none'}): add config.data.tfds_splits.{split} = "
            f"'<the {data.get('tfds_name') or 'dataset'}'s split>' to the config"
        )
    return str(splits[split])


def file_seed(seed: int) -> int:
    """The seed of the file-order shuffle, derived from the run's: not the seed itself,
    which the model's own example shuffle uses."""
    return zlib.crc32(f"tpurun.datasets files {seed}".encode()) & 0x7FFFFFFF


def prepared_dir(data: Data) -> str:
    """The directory of data.tfds_name's prepared files in data.tfds_data_dir, or a
    UsageError saying how to prepare it there."""
    return _prepared_dir(str(data.get("tfds_name") or ""), str(data.get("tfds_data_dir") or ""))


@functools.lru_cache(maxsize=16)
def _prepared_dir(name: str, data_dir: str) -> str:
    """`prepared_dir`, looked up once per process (each input pipeline, mode and eval asks)."""
    if not name:
        raise UsageError(
            "config.data.tfds_name is empty: name the TensorFlow Datasets dataset to read "
            "(e.g. --config.data.tfds_name=mnist)"
        )
    match = _NAME.fullmatch(name)
    version = match and match.group("version")
    if match is None or (version and not _VERSION.fullmatch(version)):
        raise UsageError(
            f"config.data.tfds_name={name!r} is not a dataset name: give NAME, NAME:VERSION "
            "or NAME/CONFIG:VERSION, as `tfds build` takes it (e.g. mnist or mnist:3.0.1)"
        )
    data_dir = data_dir.rstrip("/")
    build = f"`tfds build {name} --data_dir={data_dir or 'DIR'}`"
    if not data_dir:
        raise UsageError(
            f"config.data.tfds_name={name} needs config.data.tfds_data_dir, the directory "
            f"where {build} prepared it (tpurun never downloads a dataset, nor reads TFDS's "
            "default ~/tensorflow_datasets): pass --config.data.tfds_data_dir=DIR"
        )
    if not _storage(tf.io.gfile.isdir, data_dir):
        raise UsageError(
            f"config.data.tfds_data_dir={data_dir} does not exist: prepare {name} there "
            f"({build}, where it can be downloaded; tpurun never downloads) or point "
            "tfds_data_dir at the data_dir where it was prepared"
        )
    base = "/".join(p for p in (data_dir, match.group("name"), match.group("config")) if p)
    if version:
        if _storage(tf.io.gfile.exists, f"{base}/{version}/{INFO_FILE}"):
            return f"{base}/{version}"
        found = _versions(base)
        if found:
            plain = name.rsplit(":", 1)[0]
            raise UsageError(
                f"{name} is not prepared in {data_dir}, which has version(s) "
                f"{', '.join(found)}: use --config.data.tfds_name={plain}:{found[-1]}, or "
                f"prepare {version}: {build} (tpurun never downloads a dataset)"
            )
        raise UsageError(
            f"{name} is not prepared in config.data.tfds_data_dir={data_dir}; prepare it: "
            f"{build} (tpurun never downloads a dataset)"
        )
    found = _versions(base)
    if found:
        return f"{base}/{found[-1]}"
    configs = [d for d in _entries(base) if _versions(f"{base}/{d}")]
    if configs:
        raise UsageError(
            f"{name} was prepared in {data_dir} in the configs {', '.join(configs)}: name "
            f"one, e.g. --config.data.tfds_name={name}/{configs[0]}"
        )
    held = [d for d in _entries(data_dir) if d != "downloads"]
    holds = f" (it holds {', '.join(held)})" if held else " (it is empty)"
    raise UsageError(
        f"{name} is not prepared in config.data.tfds_data_dir={data_dir}{holds}; prepare "
        f"it: {build} (tpurun never downloads a dataset)"
    )


def _versions(directory: str) -> list[str]:
    """The versions prepared (whole: with their dataset_info.json) in a dataset's
    directory, oldest first."""
    versions = [
        d
        for d in _entries(directory)
        if _VERSION.fullmatch(d) and _storage(tf.io.gfile.exists, f"{directory}/{d}/{INFO_FILE}")
    ]
    return sorted(versions, key=lambda v: tuple(int(n) for n in v.split(".")))


def _entries(directory: str) -> list[str]:
    """The names in a directory (none if it does not exist), sorted, without gs://'s '/'."""
    if not _storage(tf.io.gfile.isdir, directory):
        return []
    return sorted(name.rstrip("/") for name in _storage(tf.io.gfile.listdir, directory))


def _storage(call: Callable[[str], _T], path: str) -> _T:
    """`call(path)`, a tf.io.gfile look-up; a storage failure becomes one RunError line."""
    try:
        return call(path)
    except tf.errors.OpError as e:
        raise RunError(
            explain(e.message, type(e).__name__) or f"cannot read {path}: {one_line(e)}"
        ) from None


@functools.lru_cache(maxsize=16)
def _builder(directory: str) -> Any:
    """The read-only builder of a prepared dataset's directory (its info read once per
    process: every input pipeline, mode and eval asks)."""
    tfds = _tfds()
    return _reading(None, lambda: tfds.builder_from_directory(directory), directory)


def _split_info(builder: Any, data: Data, split: str, spec: str) -> Any:
    """The dataset's record of a split spec (its examples and files), or a UsageError."""
    try:
        return builder.info.splits[spec]
    except (KeyError, ValueError) as e:
        raise UsageError(
            f"config.data.tfds_splits.{split}={spec!r}: {one_line(e)} ({data.get('tfds_name')} "
            f"in {builder.data_dir}); map {split} to a split it has, e.g. "
            f"--config.data.tfds_splits.{split}={sorted(builder.info.splits)[0]}"
        ) from None


def _reading(data: Data | None, read: Callable[[], _T], where: str = "") -> _T:
    """`read()`; what TFDS or TensorFlow raise for bad or unreadable files, as a RunError."""
    try:
        return read()
    except tf.errors.OpError as e:
        raise RunError(explain(e.message, type(e).__name__) or one_line(e)) from None
    except (OSError, ValueError, KeyError) as e:  # a malformed dataset_info.json, ...
        name = data.get("tfds_name") if data is not None else where
        raise RunError(
            f"cannot read the prepared dataset {name}: {one_line(e)}; prepare it again with "
            "`tfds build`"
        ) from None


def _tfds() -> Any:
    """tensorflow_datasets, imported on first use (2 s), or a UsageError naming the extra."""
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise UsageError(
            f"config.data.tfds_name needs TensorFlow Datasets ({one_line(e)}): {INSTALL}"
        ) from None
    return tfds
