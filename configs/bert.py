r"""BERT pretraining: google-research/bert's run_pretraining.py on create_pretraining_data.py's records.

The keys are named as run_pretraining.py's flags: `bert_config_file` (a published
bert_config.json: its keys win over config.bert's), `max_seq_length`,
`max_predictions_per_seq`, `data.train_files` / `data.eval_files` for --input_file,
and --warm_start_from for --init_checkpoint (name_map below reads its TF1 names).

Run (a TPU VM; check first: memory per replica, the time and price bound). Phase 1,
90% of the paper's 1M steps at 128 tokens; phase 2, the last 10% at 512, from phase 1:
  tpurun check --config=bert --target=v3-8
  tpurun train --config=bert --tpu=local --model_dir=gs://BUCKET/bert-128 \
      --config.data.train_files='gs://BUCKET/pretrain-128/*.tfrecord'
  tpurun train --config=bert:512 --tpu=local --model_dir=gs://BUCKET/bert-512 \
      --warm_start_from=gs://BUCKET/bert-128 \
      --config.data.train_files='gs://BUCKET/pretrain-512/*.tfrecord'
  tpurun eval --config=bert --checkpoint=gs://BUCKET/uncased_L-12_H-768_A-12/bert_model.ckpt \
      --config.data.eval_files='gs://BUCKET/pretrain-128/eval-*.tfrecord'
(docs/bert.md: the records, the recipe, fine-tuning with bert_classifier.)

Variants: `bert` is BERT-Base as published (30,522 uncased wordpieces, 768 wide, 12
layers, 12 heads); `bert:large` BERT-Large (1024 wide, 24 layers, 16 heads);
`bert:tiny` BERT-Tiny (google-research/bert's smallest published model: 128 wide, 2
layers, 2 heads), batch 32: the CPU-sized one, for laptops and the tests; `:512`
(with any of them, e.g. `bert:tiny,512`) is phase 2: 512 tokens, 80 predictions,
100,000 steps.

The recipe (optimization.py's): AdamWeightDecay (Adam without bias correction, beta 0.9
/ 0.999, epsilon 1e-6, decoupled weight decay 0.01, none on LayerNorm and bias
variables), the gradients clipped to global norm 1.0, 1e-4 reached linearly over 10,000
warmup steps, then decayed linearly to 0 at the last step (counted from step 0);
global batch 256 (the paper's), float32 as run_pretraining ran (--precision=
mixed_bfloat16 on a TPU halves the memory and most of the time).

Cost: BERT-Base is 110M parameters: ~6 x 110M x 128 = 85 GFLOP per 128-token sequence
trained (plus attention and the masked LM), so the paper's 1M steps of 256 sequences are
~2e19 FLOP: "4 days on 4 Cloud TPUs in Pod configuration (16 TPU chips total)" for
Base, 16 Cloud TPUs (64 chips) for Large. `tpurun check --target` bounds phase 1 at
11.3 h on a v3-8 (45.3 ms a step, memory-bound; docs/bert.md has v5e-8 and the
fine-tuning beside the published times). A CPU cannot pretrain BERT-Base; bert:tiny
trains (scripts/bench_bert.py measures its examples/s on this machine).
"""

import ml_collections

from tpurun import config_defaults

# bert_config.json of the published models (uncased_L-12_H-768_A-12 and its siblings).
BASE = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}
LARGE = {**BASE, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
         "intermediate_size": 4096}  # fmt: skip
TINY = {**BASE, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 512}  # fmt: skip

# google-research/bert's checkpoints name the variables as this model's paths are named
# (models/bert_modeling.py): everything under bert/ and cls/ is taken as it is.
# optimization.py's Adam slots (`.../adam_m`, `.../adam_v` of a pretraining run's
# model.ckpt-N) and global_step are left, and said so, as slots and the step.
NAME_MAP = (r"((bert|cls)/.*) -> \1",)


def bert_model_config(config: ml_collections.ConfigDict, shape: dict) -> None:
    """The keys the pretraining and the classifier configs share: the model's shape."""
    # A published bert_config.json (local or gs://): its keys win over config.bert's
    # (tpurun says which it changed); "" = config.bert alone.
    config.bert_config_file = ""
    config.bert = ml_collections.ConfigDict(dict(shape))
    config.max_seq_length = 128  # must match the records' (create_pretraining_data's)


def optimization_py(config: ml_collections.ConfigDict, learning_rate: float) -> None:
    """optimization.py's create_optimizer, but for its warmup's length: AdamWeightDecay, the
    gradients clipped to norm 1.0, learning_rate reached linearly over the warmup, then
    decayed linearly to 0 at the last step (counted from step 0)."""
    config.optimizer.name = "adamweightdecay"
    config.optimizer.learning_rate = learning_rate
    config.optimizer.beta_1 = 0.9
    config.optimizer.beta_2 = 0.999
    config.optimizer.epsilon = 1e-6
    config.optimizer.weight_decay = 0.01
    # optimization.py's exclude_from_weight_decay, searched in the variables' paths (the
    # TF1 names): every LayerNorm and every bias, output_bias included.
    config.optimizer.weight_decay_exclude = "LayerNorm|layer_norm|bias"
    config.optimizer.clip_norm = 1.0
    config.optimizer.schedule = "linear"  # polynomial_decay(power=1) to 0 at train.steps
    config.optimizer.warmup_target = "peak"  # to learning_rate, then the decay from step 0


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="bert")
    config.name_map = NAME_MAP
    bert_model_config(config, BASE)
    config.max_predictions_per_seq = 20  # must match the records'

    # Globs of create_pretraining_data.py's output (several separated by commas; local or
    # gs://): run_pretraining's --input_file, for training and for eval.
    config.data.train_files = ""
    config.data.eval_files = ""
    # Training files read at once and records shuffled in a buffer (run_pretraining's 4 and
    # 100: create_pretraining_data shuffled the instances it wrote), the files' order
    # drawn anew every epoch.
    config.data.cycle_length = 4
    config.data.shuffle_buffer = 100
    # What an epoch counts (--train_epochs): TFRecords do not say how many they hold.
    config.data.train_examples = 0

    optimization_py(config, learning_rate=1e-4)
    config.optimizer.warmup_steps = 10_000

    config.train.batch_size = 256
    config.train.steps = 900_000  # phase 1: 90% of the paper's 1M steps
    config.train.iterations = 1000  # run_pretraining's iterations_per_loop
    config.eval.batch_size = 256
    config.eval.best_metric = "masked_lm_accuracy"
    config.eval.best_mode = "max"
    config.predict.batch_size = 256

    variants = set(filter(None, variant.split(",")))
    unknown = variants - {"large", "tiny", "512"}
    if unknown or {"large", "tiny"} <= variants:
        raise ValueError(
            f"unknown variant {variant!r} of the bert config; use bert, bert:large or "
            "bert:tiny, each optionally with ,512 (phase 2: bert:512, bert:large,512)"
        )
    if "large" in variants:
        config.bert = ml_collections.ConfigDict(LARGE)
    if "tiny" in variants:
        _tiny(config)
    if "512" in variants:
        # Phase 2: the last 10% of the steps at 512 tokens (create_pretraining_data run
        # with --max_seq_length=512 --max_predictions_per_seq=80), warm-started from phase 1.
        config.max_seq_length = 512
        config.max_predictions_per_seq = 80
        config.train.steps = 100_000 if "tiny" not in variants else 100
    return config


def _tiny(config: ml_collections.ConfigDict) -> None:
    """BERT-Tiny (uncased_L-2_H-128_A-2), at a laptop's batch and length."""
    config.bert = ml_collections.ConfigDict(TINY)
    config.optimizer.warmup_steps = 10
    config.train.batch_size = 32
    config.train.steps = 200
    config.train.iterations = 50
    config.eval.batch_size = 32
    config.predict.batch_size = 32
