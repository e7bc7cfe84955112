"""Shakespeare: a character-level (byte) LSTM text generator, as in the Cloud TPU Keras example.

Train on any text file (tiny-shakespeare's input.txt is ~1.1 MB; nothing is
downloaded: pass a local or gs:// path), then generate from a prompt:
  tpurun train   --config=shakespeare --config.data.path=/tmp/shakespeare.txt --use_tpu=false
  tpurun eval    --config=shakespeare --config.data.path=/tmp/shakespeare.txt
  tpurun predict --config=shakespeare --prompt="ROMEO:"    # prints the prompt + 250 bytes
  tpurun export  --config=shakespeare   # serving: ids [batch, any length] -> next byte

The example's size (2 x 512-unit LSTMs, 512-dim embedding, global batch 1024) is
  --config.embedding_dim=512 --config.lstm_units='(512, 512)' --batch_size=1024

Cost: these laptop defaults (2 x 256 units, batch 64 of 100 bytes) run ~3 steps/s
on a 2-core x86 CPU, so the 2000 steps take ~10 minutes and give
Shakespeare-shaped text; the example's size is ~20x more work per step: hours on
a laptop, a few minutes for its 1000 steps on a TPU v3-8.
"""

import ml_collections

from tpurun import config_defaults


def get_config() -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="shakespeare")
    config.data.path = ""  # the text to train on (required)
    # Eval text; "" = the last eval_fraction of data.path, which training then skips.
    config.data.eval_path = ""
    config.data.eval_fraction = 0.1

    config.seq_len = 100  # bytes per training window (static: the TPU needs it)
    config.embedding_dim = 128
    config.lstm_units = (256, 256)

    # The example: RMSprop at 0.01.
    config.optimizer.name = "rmsprop"
    config.optimizer.learning_rate = 0.01
    config.train.batch_size = 64
    config.train.steps = 2000
    config.train.iterations = 100
    config.eval.batch_size = 64
    # Generation (tpurun predict): the prompt (--prompt), bytes to add, sampling
    # temperature (0 = greedy; 1 = the model's distribution), texts to sample.
    config.predict.prompt = "ROMEO:"
    config.predict.length = 250
    config.predict.temperature = 0.8
    config.predict.num_samples = 1
    config.predict.batch_size = 64  # the standard predict step (and `tpurun check`)
    return config
