r"""WGAN-GP: keras-io's GAN with a gradient penalty, a model with a training step of its own.

A generator and a critic on 28x28 grey images of the MNIST TFRecord schema (make
them once, from MNIST's or Fashion-MNIST's IDX files or npz; no download):
  python scripts/convert_mnist.py --source=/path/to/fashion_dir_or_npz \
      --output_dir=/tmp/fashion/data

Run (laptop CPU; --num_shards=8 for 8 replicas like a v3-8, the same model):
  tpurun train   --config=wgan_gp --data_dir=/tmp/fashion/data --use_tpu=false
  tpurun eval    --config=wgan_gp --data_dir=/tmp/fashion/data
  tpurun predict --config=wgan_gp --data_dir=/tmp/fashion/data --output=samples.png
  tpurun predict --config=wgan_gp --data_dir=/tmp/fashion/data --output=samples.npz
  tpurun export  --config=wgan_gp --data_dir=/tmp/fashion/data   # noise in, images out

Each step trains the critic `critic_steps` times and the generator once, each with
its own Adam (config.optimizers.critic / .generator); the progress line, TensorBoard
and the NaN guard follow d_loss, g_loss and gp. `predict` writes
`config.generate.count` images (uint8 [count, 28, 28] as `images` in .npz, a grid
in .png); eval reports the critic's Wasserstein loss on the test images against as
many generated ones (`loss`, higher is better: the best checkpoint is the max).

Cost (a step is 3 critic updates, each differentiating the critic twice for the
penalty, and 1 generator update: ~6 generator and ~48 critic forward passes' worth
per example): these CPU-sized defaults (a quarter of keras-io's filters, noise 64,
batch 64) are ~0.28 GFLOP per example, 18 GFLOP per step; the 1500 steps took 6.5
minutes on a loaded 2-core x86 CPU (~0.2 s a step, as fast as keras-io's `fit` of
the same model or 1.13x faster: scripts/bench_wgan_gp.py) and draw garment
silhouettes, still blurred.
`--config=wgan_gp:paper` is keras-io's size (noise 128, critic (64, 128, 256, 512),
generator 256 -> (128, 64), batch 512): ~4.3 GFLOP per example, 2.2 TFLOP per step,
5 PFLOP for its 20 epochs (2,350 steps): minutes on a TPU v3-8, most of a day on
that CPU.
"""

import ml_collections

from tpurun import config_defaults


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="wgan_gp")
    config.data = config_defaults.image_records_data()

    config.noise_dim = 64
    config.generator_base = 64  # the dense layer's 4x4 channels
    config.generator_filters = (32, 16)  # the first two upsampling blocks; the last gives 1
    config.critic_filters = (16, 32, 64, 128)
    config.dropout = 0.3  # after the critic's middle convolutions
    config.final_dropout = 0.2  # before its score
    config.critic_steps = 3  # critic updates per generator update (the paper: 5)
    config.gp_weight = 10.0

    # keras-io's Adam for both; the paper's is 1e-4 with beta_1=0.0.
    for name in ("critic", "generator"):
        config.optimizers[name] = config_defaults.optimizer_recipe(
            name="adam", learning_rate=2e-4, beta_1=0.5, beta_2=0.9
        )
    config.train.batch_size = 64
    config.train.steps = 1500
    config.train.iterations = 100
    config.eval.batch_size = 256
    config.eval.best_mode = "max"  # the critic's loss, E[D(fake)] - E[D(real)] <= 0: nearer 0
    config.predict.batch_size = 256

    config.generate = ml_collections.ConfigDict()
    config.generate.count = 1000  # images `tpurun predict` writes
    if variant == "paper":
        config.noise_dim = 128
        config.generator_base = 256
        config.generator_filters = (128, 64)
        config.critic_filters = (64, 128, 256, 512)
        config.train.batch_size = 512
        config.train.steps = 2350  # 20 epochs of 60,000 images (or --train_epochs=20)
    elif variant:
        raise ValueError(f"unknown variant {variant!r} of the wgan_gp config; use wgan_gp:paper")
    return config
