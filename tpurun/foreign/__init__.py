"""Checkpoints tpurun did not write: read through a model's name map, what is taken said first.

A user coming from TPUEstimator owns TF1 name-based checkpoints (`model.ckpt-N`,
`bert_model.ckpt`), TPUEstimator model_dirs and Estimator SavedModels. This package tells
their kind apart by itself (tpurun's own object-based checkpoints included), sends their
variable names through the model's map (`name_map`: the format, `config.name_map`), says
what was taken and what was left before anything runs, and fills the model with them:
for `--warm_start_from` (train, check) and `--checkpoint=PATH` (eval, predict, export).

`name_map` imports no TensorFlow: a bad rule fails before TensorFlow loads.
"""
