"""Registered translation models: the GPipe paper's T(L, H, A) setup and a tiny one on num2words.

  mt.Num2WordsTinyT        T(3, 256, 4), model 64, on the built-in num2words corpus (43 languages ->
                           English, temperature T = 5); K = 2 partitions, M = 4 micro-batches;
                           trains on a CPU in minutes.
  mt.Num2WordsDeepT        T(6, 256, 4) and T(3, 704, 4): the same but deep or wide at about the
  mt.Num2WordsWideT        same parameter count (tools/deep_vs_wide.py compares them).

Train:  python -m tensorpipe.trainer.train --model=mt.Num2WordsTinyT --cpu_devices=2 --mode=sync \
          --run_locally=cpu --logdir=/tmp/n2w
Decode: python -m tensorpipe.trainer.train --model=mt.Num2WordsTinyT --cpu_devices=2 --mode=sync \
          --run_locally=cpu --logdir=/tmp/n2w --job=decoder_test    (BLEU overall and per language)
"""

import os

from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import learner
from lingvo.core import optimizer
from lingvo.core import py_utils
from lingvo.core import schedule

from tensorpipe.tasks.lm import lm_task
from tensorpipe.tasks.mt import mt_input
from tensorpipe.tasks.mt import mt_task
from tensorpipe.tasks.mt import num2words_corpus


class TransformerParamsBase(base_model_params.SingleTaskModelParams):
  """T(NUM_LAYERS, FFN_DIM, NUM_HEADS) on multilingual data, with the paper's training recipe.

  Adafactor with a factored second moment (the paper's 'momentum factorisation'), the learning-rate
  schedule (LEARNING_RATE, WARMUP_STEPS) = LEARNING_RATE * D^-0.5 * min(step / WARMUP^1.5,
  step^-0.5), each parameter's gradient clipped to norm 1.0.
  """

  NUM_LAYERS = 6
  FFN_DIM = 8192
  NUM_HEADS = 16
  MODEL_DIM = 1024
  HEAD_DIM = 64
  VOCAB_SIZE = 64000
  NUM_DEVICES = 1
  NUM_MICRO_BATCHES = 1
  BATCH_SIZE = 64  # Sentences per mini-batch.
  SOURCE_MAX_LENGTH = 128
  TARGET_MAX_LENGTH = 128
  DROPOUT_KEEP_PROB = 0.9
  LEARNING_RATE = 3.0
  WARMUP_STEPS = 40000
  MAX_STEPS = 1000000
  DATA_DIR = ''  # '': the built-in num2words corpus.
  TEMPERATURE = 5.0
  LANGUAGES = None  # None: every language in DATA_DIR.
  # Too large for params_test's CPU step; tests/tasks/mt/mt_params_test.py builds them.
  SMOKE_TEST = False

  def _Input(self, split):
    p = mt_input.MultilingualInput.Params().Set(
        data_dir=self.DATA_DIR, split=split, temperature=self.TEMPERATURE,
        languages=self.LANGUAGES, source_max_length=self.SOURCE_MAX_LENGTH,
        target_max_length=self.TARGET_MAX_LENGTH)
    p.batch_size = self.BATCH_SIZE
    return p

  def Train(self):
    return self._Input('train')

  def Test(self):
    p = self._Input('test')
    p.resettable = True
    return p

  def Dev(self):
    return self.Test()

  def _Languages(self):
    return list(self.LANGUAGES or [])

  def _VocabSize(self):
    return self.VOCAB_SIZE

  def _Learner(self):
    return learner.Learner.Params().Set(
        name='loss',
        learning_rate=self.LEARNING_RATE,
        optimizer=optimizer.XLAShardingAdafactor.Params().Set(factored=True, beta1=0.0),
        lr_schedule=schedule.TransformerSchedule.Params().Set(
            warmup_steps=self.WARMUP_STEPS, model_dim=self.MODEL_DIM),
        clip_gradient_single_norm_to_value=1.0)

  def Task(self):
    p = mt_task.TransformerParams(
        num_layers=self.NUM_LAYERS, ffn_dim=self.FFN_DIM, num_heads=self.NUM_HEADS,
        model_dim=self.MODEL_DIM, head_dim=self.HEAD_DIM, vocab_size=self._VocabSize(),
        num_devices=self.NUM_DEVICES, num_micro_batches=self.NUM_MICRO_BATCHES,
        dropout_keep_prob=self.DROPOUT_KEEP_PROB)
    p.name = 'mt'
    b, s, t, d = self.BATCH_SIZE, self.SOURCE_MAX_LENGTH, self.TARGET_MAX_LENGTH, self.MODEL_DIM
    # The stacks' input shapes for the planner (tools.plan); they stay split by layer count.
    p.encoder.Set(cost_input_shapes=[py_utils.NestedMap(vec=[b, s, d], paddings=[b, s])],
                  partition_cost='count')
    p.decoder.Set(cost_input_shapes=[py_utils.NestedMap(vec=[b, t, d], paddings=[b, t],
                                                        aux_vec=[b, s, d], aux_paddings=[b, s])],
                  partition_cost='count')
    p.languages = self._Languages()
    p.max_decode_length = self.TARGET_MAX_LENGTH - 1
    p.eval.samples_per_summary = 0  # The whole test split.
    tp = p.train
    tp.max_steps = self.MAX_STEPS
    tp.learner = self._Learner()
    return p


class Num2WordsBase(TransformerParamsBase):
  """Models on the built-in num2words corpus: vocabulary and languages read from the corpus."""

  TINY = True  # CPU-sized: --list_models marks it tiny.
  SOURCE_MAX_LENGTH = 32
  TARGET_MAX_LENGTH = 16

  def _Corpus(self):
    return num2words_corpus.EnsureCorpus(self.DATA_DIR or None)

  def _Languages(self):
    if self.LANGUAGES:
      return list(self.LANGUAGES)
    return self._Corpus()[1]['languages']

  def _VocabSize(self):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    data_dir = self._Corpus()[0]
    return spm.SentencePieceProcessor(model_file=os.path.join(data_dir, 'spm.model')).GetPieceSize()


@model_registry.RegisterSingleTaskModel
class Num2WordsTinyT(Num2WordsBase):
  """T(3, 256, 4) with model dimension 64 on num2words, K = 2 partitions, M = 4 micro-batches."""

  NUM_LAYERS = 3
  FFN_DIM = 256
  NUM_HEADS = 4
  MODEL_DIM = 64
  HEAD_DIM = 16
  NUM_DEVICES = 2
  NUM_MICRO_BATCHES = 4
  BATCH_SIZE = 64
  DROPOUT_KEEP_PROB = 0.9
  MAX_STEPS = 1500
  SMOKE_TEST = True

  def _Learner(self):
    # Adam with the Transformer schedule: the tiny model's steps are too few for Adafactor's recipe.
    return learner.Learner.Params().Set(
        name='loss', learning_rate=1.0, optimizer=optimizer.Adam.Params(),
        lr_schedule=schedule.TransformerSchedule.Params().Set(warmup_steps=400,
                                                              model_dim=self.MODEL_DIM),
        clip_gradient_single_norm_to_value=1.0)

  def Task(self):
    p = super().Task()
    p.train.save_interval_steps = 500
    p.train.summary_interval_steps = 100
    p.label_smoothing = 0.1
    return p


@model_registry.RegisterSingleTaskModel
class Num2WordsDeepT(Num2WordsTinyT):
  """Deep side of the deep-vs-wide comparison: T(6, 256, 4), model 64, K = 2, M = 4.

  Twice Num2WordsTinyT's depth; Num2WordsWideT has about the same parameter count with half the
  layers and a wider feed-forward (the paper's T(24, 8192, 16) vs T(12, 16384, 32) at 1.3B).
  tools/deep_vs_wide.py trains and decodes both.
  """

  NUM_LAYERS = 6
  FFN_DIM = 256
  # Num2WordsTinyT's code at other sizes: tests/trainer/params_test.py steps Num2WordsTinyT, and
  # tests/tasks/mt/deep_vs_wide_test.py builds this model (its parameter count).
  SMOKE_TEST = False


@model_registry.RegisterSingleTaskModel
class Num2WordsWideT(Num2WordsTinyT):
  """Wide side of the deep-vs-wide comparison: T(3, 704, 4), model 64, K = 2, M = 4.

  FFN_DIM 704 makes its parameter count match Num2WordsDeepT's to within 0.2%.
  """

  NUM_LAYERS = 3
  FFN_DIM = 704
  SMOKE_TEST = False  # As Num2WordsDeepT.


class MultilingualT(TransformerParamsBase):
  """The paper's multilingual T(L, H, A): 64k shared vocabulary, model dimension 1024, T = 5.

  DATA_DIR must hold <lang>.train.tsv / <lang>.test.tsv for the languages and a 64k spm.model (set
  it with --model_params_override or a subclass); the default '' falls back to the num2words corpus,
  whose ids all fit the 64k table, so the graph also runs without real data.
  """

  VOCAB_SIZE = 64000
  MODEL_DIM = 1024
  BATCH_SIZE = 4096


@model_registry.RegisterSingleTaskModel
class T6H8192A16(MultilingualT):
  """T(6, 8192, 16), ~400M parameters, 1 partition."""
  NUM_LAYERS, FFN_DIM, NUM_HEADS, NUM_DEVICES = 6, 8192, 16, 1
  NUM_MICRO_BATCHES = 1


@model_registry.RegisterSingleTaskModel
class T24H8192A16(MultilingualT):
  """T(24, 8192, 16), 1.3B deep, 4 partitions."""
  NUM_LAYERS, FFN_DIM, NUM_HEADS, NUM_DEVICES = 24, 8192, 16, 4
  NUM_MICRO_BATCHES = 16


@model_registry.RegisterSingleTaskModel
class T12H16384A32(MultilingualT):
  """T(12, 16384, 32), 1.3B wide, 2 partitions."""
  NUM_LAYERS, FFN_DIM, NUM_HEADS, NUM_DEVICES = 12, 16384, 32, 2
  NUM_MICRO_BATCHES = 8


@model_registry.RegisterSingleTaskModel
class T32H16384A32(MultilingualT):
  """T(32, 16384, 32), 3B, 8 partitions."""
  NUM_LAYERS, FFN_DIM, NUM_HEADS, NUM_DEVICES = 32, 16384, 32, 8
  NUM_MICRO_BATCHES = 32


@model_registry.RegisterSingleTaskModel
class T64H16384A32(MultilingualT):
  """T(64, 16384, 32), 6B (128 layers), 16 partitions."""
  NUM_LAYERS, FFN_DIM, NUM_HEADS, NUM_DEVICES = 64, 16384, 32, 16
  NUM_MICRO_BATCHES = 64


class BilingualBaseline(TransformerParamsBase):
  """A bilingual German-English Transformer baseline with the (2.0, 8K) schedule, 32k vocabulary.

  DATA_DIR must hold de.train.tsv / de.test.tsv and a 32k spm.model.
  """

  VOCAB_SIZE = 32000
  LANGUAGES = ['de']
  LEARNING_RATE = 2.0
  WARMUP_STEPS = 8000
  NUM_DEVICES = 1
  NUM_MICRO_BATCHES = 1
  BATCH_SIZE = 4096
  DROPOUT_KEEP_PROB = 0.9


@model_registry.RegisterSingleTaskModel
class TransformerBig(BilingualBaseline):
  """Transformer-Big: 6 + 6 layers, model 1024, feed-forward 4096, 16 heads."""
  NUM_LAYERS, MODEL_DIM, FFN_DIM, NUM_HEADS = 6, 1024, 4096, 16
  DROPOUT_KEEP_PROB = 0.7


@model_registry.RegisterSingleTaskModel
class TransformerBase(BilingualBaseline):
  """Transformer-Base: 6 + 6 layers, model 512, feed-forward 2048, 8 heads."""
  NUM_LAYERS, MODEL_DIM, FFN_DIM, NUM_HEADS = 6, 512, 2048, 8


class LargeBatch(MultilingualT):
  """The large-batch study: T(6, 8192, 16) on German-English, TOKENS tokens per batch.

  Batch sentences = TOKENS / SOURCE_MAX_LENGTH (128), rounded to a power of two; pipelined over 4
  partitions with 32 micro-batches.
  """
  NUM_LAYERS, FFN_DIM, NUM_HEADS = 6, 8192, 16
  LANGUAGES = ['de']
  NUM_DEVICES = 4
  NUM_MICRO_BATCHES = 32


@model_registry.RegisterSingleTaskModel
class LargeBatch260K(LargeBatch):
  """260K tokens per batch (2048 x 128 = 262K)."""
  BATCH_SIZE = 2048


@model_registry.RegisterSingleTaskModel
class LargeBatch1M(LargeBatch):
  """1M tokens per batch (8192 x 128 = 1.05M)."""
  BATCH_SIZE = 8192


@model_registry.RegisterSingleTaskModel
class LargeBatch4M(LargeBatch):
  """4M tokens per batch (32768 x 128 = 4.19M)."""
  BATCH_SIZE = 32768


class TransformerL(base_model_params.SingleTaskModelParams):
  """Transformer-L of the paper's memory table: L layers, model 2048, feed-forward 8192, 32 heads,
  32k vocabulary, sequence 1024, batch 32 (synthetic tokens: a memory/speed config, not a quality
  one).

  NUM_DEVICES = 1 with RECOMPUTE 'never' is the paper's Naive-1; the others re-compute (GPipe).
  """

  NUM_LAYERS = 3
  NUM_DEVICES = 1
  NUM_MICRO_BATCHES = 1
  RECOMPUTE = 'always'
  BATCH_SIZE = 32
  SEQ_LEN = 1024
  VOCAB_SIZE = 32000
  SMOKE_TEST = False

  def Train(self):
    p = lm_task.SyntheticLmInput.Params().Set(vocab_size=self.VOCAB_SIZE, seq_len=self.SEQ_LEN)
    p.batch_size = self.BATCH_SIZE
    return p

  def Test(self):
    return self.Train()

  def Task(self):
    p = lm_task.TransformerLmParams(
        self.NUM_LAYERS, model_dim=2048, ffn_dim=8192, num_heads=32, vocab_size=self.VOCAB_SIZE,
        num_devices=self.NUM_DEVICES, num_micro_batches=self.NUM_MICRO_BATCHES,
        recompute=self.RECOMPUTE)
    p.train.learner = learner.Learner.Params().Set(
        name='loss', learning_rate=3.0,
        optimizer=optimizer.XLAShardingAdafactor.Params().Set(factored=True, beta1=0.0),
        lr_schedule=schedule.TransformerSchedule.Params().Set(warmup_steps=40000, model_dim=2048),
        clip_gradient_single_norm_to_value=1.0)
    return p


@model_registry.RegisterSingleTaskModel
class TransformerL3Naive1(TransformerL):
  """Naive-1: L = 3, no pipeline, no re-computation."""
  NUM_LAYERS, NUM_DEVICES, NUM_MICRO_BATCHES, RECOMPUTE = 3, 1, 1, 'never'


@model_registry.RegisterSingleTaskModel
class TransformerL13Pipeline1(TransformerL):
  """Pipeline-1: L = 13, one partition, re-computation with 32 micro-batches."""
  NUM_LAYERS, NUM_DEVICES, NUM_MICRO_BATCHES = 13, 1, 32


@model_registry.RegisterSingleTaskModel
class TransformerL103Pipeline8(TransformerL):
  """Pipeline-8: L = 103 on 8 partitions, 32 micro-batches."""
  NUM_LAYERS, NUM_DEVICES, NUM_MICRO_BATCHES = 103, 8, 32


@model_registry.RegisterSingleTaskModel
class TransformerL415Pipeline32(TransformerL):
  """Pipeline-32: L = 415 on 32 partitions, 32 micro-batches."""
  NUM_LAYERS, NUM_DEVICES, NUM_MICRO_BATCHES = 415, 32, 32


@model_registry.RegisterSingleTaskModel
class TransformerL1663Pipeline128(TransformerL):
  """Pipeline-128: L = 1663 on 128 partitions, 32 micro-batches."""
  NUM_LAYERS, NUM_DEVICES, NUM_MICRO_BATCHES = 1663, 128, 32
