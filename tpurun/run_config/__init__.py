"""Flags and a config file -> one frozen, validated RunConfig, before TensorFlow is imported.

* `run`: `RunConfig`, what a run needs to know, validated by topic when it is made;
* `command_table`: every command, what running it involves, and the function that runs it;
* `flag_table`: every flag, once (name, type, help, commands, config key, bound);
* `bounds`: the ranges of the numbers a run takes, and how a batch and a cadence divide;
* `merge`: the flags given merged into the config's keys, then frozen;
* `config_files`: a config by name or path, loaded and its overrides checked;
* `keys/`: the config keys of one topic each, what they mean and how they are checked
  (`recipe_keys`: config.optimizer's; `service_keys`: config.data's tf.data service
  keys; `determinism`: config.train.deterministic, and what a resume reproduces;
  `trained_keys`: the keys eval, predict and export take from the trained config);
* `epochs`: how long a run trains when it says a length in epochs;
* `splits`: the eval splits of a model;
* `tpu_node`: the local paths a TPU node's host cannot see, refused.
"""

from __future__ import annotations

from tpurun.run_config.bounds import aligned_to_loop, check_divisible, split_fix
from tpurun.run_config.flag_table import EPOCH
from tpurun.run_config.keys.trained_keys import DATA_LOCATION_SUFFIXES
from tpurun.run_config.merge import merge_flags
from tpurun.run_config.run import FLOAT16_ON_TPU, RunConfig
from tpurun.run_config.tpu_node import refuse_local_paths_on_a_tpu_node

__all__ = [
    "DATA_LOCATION_SUFFIXES",
    "EPOCH",
    "FLOAT16_ON_TPU",
    "RunConfig",
    "aligned_to_loop",
    "check_divisible",
    "merge_flags",
    "refuse_local_paths_on_a_tpu_node",
    "split_fix",
]
