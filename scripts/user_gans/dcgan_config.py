"""keras-io's DCGAN, ported: 64x64 images, latent 128, Adam 1e-4 for both, batch 32.

A user's config beside its model (dcgan.py); `dcgan_config.py:small` is a quarter of the
pixels and half the generator's filters (a CPU's size). scripts/bench_loop_choice.py runs
both.
"""

import ml_collections

from tpurun import config_defaults


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="dcgan")
    config.model_module = "dcgan"
    config.examples = 2048
    config.image_size = 64
    config.latent_dim = 128
    config.generator_filters = (128, 256, 512)
    for name in ("generator", "discriminator"):
        config.optimizers[name] = config_defaults.optimizer_recipe(learning_rate=1e-4)
    config.train.batch_size = 32
    config.train.steps = 100
    config.train.iterations = 10
    config.eval.batch_size = 64
    config.predict.batch_size = 64
    config.generate = ml_collections.ConfigDict()
    config.generate.count = 16  # images `tpurun predict` draws
    if variant == "small":
        config.image_size = 32
        config.generator_filters = (64, 128, 256)
    elif variant:
        raise ValueError(f"unknown variant {variant!r}; use dcgan_config.py:small")
    return config
