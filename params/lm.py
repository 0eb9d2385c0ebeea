"""Registered decoder-only language models, pipelined whole, with tied input/output embeddings.

  lm.TinyTiedLm: tensorpipe/tasks/lm/decoder_lm.py's DecoderLm on the built-in counting corpus
  (runs of consecutive numbers in English words, no download): a tied embedding/softmax and 2
  causal Transformer layers (model 32) in one TensorPipeLayer, K = 2 partitions (one per logical
  device: --cpu_devices=2 on CPU, --worker_gpus=2 --worker_split_size=2 on GPUs), M = 4
  micro-batches, the '1f1b' schedule, the per-token loss in the last partition. 1000 steps take
  about a minute on a 2-core CPU: the training loss falls from ~4.3 nats per token (perplexity ~70)
  to ~0.7, and the held-out log-perplexity is ~0.65 (perplexity ~1.9). The floor is ~0.58: a
  training run is one of 2691 equally likely ones (its first number and length), ~13.5 tokens long,
  and the rest is counting.

Train: python -m tensorpipe.trainer.train --model=lm.TinyTiedLm --cpu_devices=2 \
         --mode=sync --run_locally=cpu --logdir=/tmp/tiny_lm
Eval:  python -m tensorpipe.trainer.train --model=lm.TinyTiedLm --cpu_devices=2 \
         --mode=sync --run_locally=cpu --logdir=/tmp/tiny_lm --job=evaler_test

Other schedules: --model_params_override="task.pipeline.schedule: zero_bubble" (or gpipe).
"""

from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import learner
from lingvo.core import optimizer
from lingvo.core import schedule

from tensorpipe.tasks.lm import decoder_lm


@model_registry.RegisterSingleTaskModel
class TinyTiedLm(base_model_params.SingleTaskModelParams):
  """A tiny tied-embedding decoder LM on the counting corpus: 2 partitions, M = 4, 1F1B."""

  TINY = True  # CPU-sized: --list_models marks it tiny.
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4
  SCHEDULE = '1f1b'
  MODEL_DIM = 32
  HIDDEN_DIM = 128
  NUM_HEADS = 4
  NUM_LAYERS = 2
  DROPOUT_PROB = 0.1
  BATCH_SIZE = 32
  EVAL_BATCH_SIZE = 100  # The 300 held-out runs in 3 batches.
  MAX_NUMBERS = 4  # Runs of 2 to 4 numbers: sequences of T = 20 tokens.
  LEARNING_RATE = 3e-3
  MAX_STEPS = 1000

  def Train(self):
    return decoder_lm.CountingInput.Params().Set(split='train', batch_size=self.BATCH_SIZE,
                                                 max_numbers=self.MAX_NUMBERS)

  def Test(self):
    # resettable: the evaler covers the whole held-out split once per checkpoint.
    return decoder_lm.CountingInput.Params().Set(split='test', batch_size=self.EVAL_BATCH_SIZE,
                                                 max_numbers=self.MAX_NUMBERS, resettable=True)

  def Dev(self):
    # No separate dev split: --job=evaler_dev evaluates the same held-out runs as evaler_test.
    return self.Test()

  def Task(self):
    p = decoder_lm.DecoderLmParams(
        vocab_size=decoder_lm.VOCAB_SIZE, model_dim=self.MODEL_DIM, hidden_dim=self.HIDDEN_DIM,
        num_heads=self.NUM_HEADS, num_layers=self.NUM_LAYERS,
        num_partitions=self.NUM_PARTITIONS, num_micro_batches=self.NUM_MICRO_BATCHES,
        schedule=self.SCHEDULE, dropout_prob=self.DROPOUT_PROB, name='tiny_lm')
    p.eval.samples_per_summary = 0  # The whole held-out split.

    tp = p.train
    tp.max_steps = self.MAX_STEPS
    tp.save_interval_steps = 250
    tp.save_max_to_keep = 10
    tp.summary_interval_steps = 50
    tp.learner = learner.Learner.Params().Set(
        name='loss', learning_rate=self.LEARNING_RATE, optimizer=optimizer.Adam.Params(),
        lr_schedule=schedule.LinearSchedule.Params().Set(start=(0, 1.0),
                                                         limit=(self.MAX_STEPS, 0.05)))
    return p
