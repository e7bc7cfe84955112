"""The config sections every tpurun config has, with their defaults.

A config file starts from `base_config(model=...)` and sets what its model
needs. The TPUEstimator-style flags (`--batch_size`, `--train_steps`,
`--iterations`, ...) are shortcuts for the keys below; `--config.train.batch_size`
works too. Only ml_collections and the standard library are imported here, so
loading a config never imports TensorFlow.
"""

from __future__ import annotations

import ml_collections


def base_config(model: str) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The registered model name; `model_module` names a module to import first
    # when the model is not one of tpurun's own (e.g. "my_project.my_model").
    config.model = model
    config.model_module = ""
    config.seed = 0

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "adam"
    config.optimizer.learning_rate = 0.001

    config.train = ml_collections.ConfigDict()
    config.train.batch_size = 128  # global: split evenly across replicas
    config.train.steps = 1000  # total (max_steps): a resumed run continues to it
    config.train.iterations = 100  # steps per host loop (iterations_per_loop)
    # A checkpoint every N steps (rounded up to a multiple of iterations) or every
    # N seconds, whichever comes first; 0 turns one off. Always one at the end.
    config.train.save_checkpoints_steps = 0
    config.train.save_checkpoints_secs = 600  # TPUEstimator's default
    config.train.keep_checkpoint_max = 5
    config.train.eval_every = 0  # steps between evals in the training process; 0 = never
    # Initialise from another run's checkpoint (ckpt-N or a model_dir), then train
    # from step 0; only variables whose checkpoint key matches the regex are taken.
    config.train.warm_start_from = ""
    config.train.warm_start_vars = ".*"

    config.eval = ml_collections.ConfigDict()
    config.eval.batch_size = 128  # global
    config.eval.steps = 0  # 0 = one exact pass over the eval data
    # The checkpoint with the best value of this eval metric is kept in model_dir/best
    # (for `tpurun export --best`); best_mode says whether "min" or "max" is best.
    config.eval.best_metric = "loss"
    config.eval.best_mode = "min"

    config.predict = ml_collections.ConfigDict()
    config.predict.batch_size = 128  # global
    config.predict.input = ""  # a file of rows to predict; "" = the model's own examples
    config.predict.output = ""  # JSON lines; "" = print to stdout
    return config
