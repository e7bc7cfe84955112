"""WGAN-GP on 8 Gaussians: the paper's toy setting (512 units, 5 critic updates, batch 256).

A user's config beside its model (gauss_wgan.py); scripts/bench_loop_choice.py runs it.
"""

import ml_collections

from tpurun import config_defaults


def get_config() -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="gauss_wgan")
    config.model_module = "gauss_wgan"
    config.examples = 100_000
    config.hidden_units = 512
    config.critic_steps = 5
    config.gp_weight = 0.1
    for name in ("generator", "critic"):
        config.optimizers[name] = config_defaults.optimizer_recipe(
            learning_rate=1e-4, beta_1=0.5, beta_2=0.9
        )
    config.train.batch_size = 256
    config.train.steps = 2000
    config.train.iterations = 100
    config.eval.batch_size = 512
    config.predict.batch_size = 512
    config.generate = ml_collections.ConfigDict()
    config.generate.count = 1000  # points `tpurun predict` draws
    return config
