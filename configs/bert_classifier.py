r"""BERT fine-tuning: google-research/bert's run_classifier.py, from a pretrained bert_model.ckpt.

Records: run_classifier.py's (input_ids, input_mask, segment_ids, label_ids,
is_real_example), or made from TSV/CSV text (text_a, optional text_b, label) with the
checkpoint's vocab.txt:
  python -m tpurun.models.bert_text --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \
      --input=train.tsv --output=gs://BUCKET/glue/train.tfrecord --labels=0,1

Run (a TPU VM; the pretrained checkpoint and its bert_config.json as google-research/bert
publishes them, the classifier head new):
  tpurun train --config=bert_classifier --tpu=local --model_dir=gs://BUCKET/mrpc \
      --warm_start_from=gs://BUCKET/uncased_L-12_H-768_A-12/bert_model.ckpt \
      --config.bert_config_file=gs://BUCKET/uncased_L-12_H-768_A-12/bert_config.json \
      --config.data.train_files=gs://BUCKET/glue/train.tfrecord \
      --config.data.eval_files=gs://BUCKET/glue/dev.tfrecord \
      --config.data.train_examples=3668 --eval_every=epoch
  tpurun export --config=bert_classifier --model_dir=gs://BUCKET/mrpc \
      --config.data.eval_files=gs://BUCKET/glue/dev.tfrecord
(docs/bert.md: converting text, fine-tuning, serving.)

Variants: `bert_classifier` fine-tunes BERT-Base, `bert_classifier:large` BERT-Large,
`bert_classifier:tiny` BERT-Tiny (the CPU-sized one). --config.bert_config_file gives
any other published shape.

The recipe (run_classifier.py's): AdamWeightDecay as in pretraining (optimization.py),
learning rate 2e-5, 10% of the steps warming up (0.3 of the 3 epochs), decayed linearly
to 0; 3 epochs of global batch 32 (data.train_examples counts them: the converter
prints it); max_seq_length 128; dropout 0.1 on the pooled output; the encoder warm-
started from the checkpoint, the head (classifier/output_weights, output_bias) new.

Cost: ~6 x 110M x 128 = 85 GFLOP per example trained (BERT-Base), so 3 epochs of
MRPC's 3,668 pairs are ~1 PFLOP: google-research/bert's README, "at most 1 hour on a
single Cloud TPU" for any of its fine-tuning tasks, and `tpurun check --target` for
batch 32 beside it in docs/bert.md. bert_classifier:tiny fine-tunes on a laptop CPU.
"""

import ml_collections
from tpurun.configs import bert as pretraining

from tpurun import config_defaults

# run_classifier's checkpoints name the encoder as pretraining's do and its head
# `output_weights` / `output_bias` (no scope); pretraining's cls/ (heads a classifier has
# no use for), optimization.py's slots and global_step are left, and said so.
NAME_MAP = (
    r"(bert/.*) -> \1",
    r"output_(weights|bias) -> classifier/output_\1",
)


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="bert_classifier")
    config.name_map = NAME_MAP
    pretraining.bert_model_config(config, pretraining.BASE)
    config.num_labels = 2
    config.classifier_dropout = 0.1  # run_classifier's keep_prob=0.9 on the pooled output

    # Globs of run_classifier's records (local or gs://; several separated by commas).
    config.data.train_files = ""
    config.data.eval_files = ""
    config.data.cycle_length = 4
    config.data.shuffle_buffer = 100  # run_classifier's
    # The training examples an epoch counts: the converter prints it.
    config.data.train_examples = 0

    pretraining.optimization_py(config, learning_rate=2e-5)
    config.optimizer.warmup_epochs = 0.3  # run_classifier's warmup_proportion 0.1 of 3 epochs

    config.train.batch_size = 32
    config.train.epochs = 3.0
    config.train.iterations = 100
    # The encoder from --warm_start_from; the head is new (run_classifier's init_checkpoint
    # held no output_weights).
    config.train.warm_start_vars = r"^bert/"
    config.eval.batch_size = 32
    config.eval.best_metric = "accuracy"
    config.eval.best_mode = "max"
    config.predict.batch_size = 32

    if variant == "large":
        config.bert = ml_collections.ConfigDict(pretraining.LARGE)
    elif variant == "tiny":
        config.bert = ml_collections.ConfigDict(pretraining.TINY)
    elif variant:
        raise ValueError(
            f"unknown variant {variant!r} of the bert_classifier config; use "
            "bert_classifier, bert_classifier:large or bert_classifier:tiny"
        )
    return config
