"""The config keys of one topic each: what they mean and how they are checked, without
TensorFlow.

* `recipe_keys`: config.optimizer's keys, their bounds and the Keras arguments they are;
* `service_keys`: config.data's tf.data service keys (`service`: the run's, or None);
* `determinism`: config.train.deterministic, decided per platform, and what a resume of
  the run reproduces (`tpurun.cluster.determinism` sets it in TensorFlow);
* `trained_keys`: the keys eval, predict and export take from the trained config.
"""
