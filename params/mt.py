"""Registered translation models: the GPipe paper's T(L, H, A) setup and a tiny one on the num2words corpus.

  mt.Num2WordsTinyT        T(3, 256, 4), model 64, on the built-in num2words corpus (43 languages ->
                           English, temperature T = 5); K = 2 cells, M = 4 micro-batches; trains on
                           a CPU in minutes.

Train:  python -m tensorpipe.train --model=mt.Num2WordsTinyT --cpu_devices=2 --mode=sync \
          --run_locally=cpu --logdir=/tmp/n2w
Decode: python -m tensorpipe.train --model=mt.Num2WordsTinyT --cpu_devices=2 --mode=sync \
          --run_locally=cpu --logdir=/tmp/n2w --job=decoder_test    (BLEU overall and per language)
"""

import os

from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import learner
from lingvo.core import optimizer
from lingvo.core import schedule

from tensorpipe import mt_input
from tensorpipe import mt_task
from tensorpipe import num2words_corpus


class TransformerParamsBase(base_model_params.SingleTaskModelParams):
  """T(NUM_LAYERS, FFN_DIM, NUM_HEADS) on multilingual data, with the paper's training recipe.

  Adafactor with a factored second moment (the paper's 'momentum factorisation'), the learning-rate
  schedule (LEARNING_RATE, WARMUP_STEPS) = LEARNING_RATE * D^-0.5 * min(step / WARMUP^1.5, step^-0.5),
  each parameter's gradient clipped to norm 1.0.
  """

  NUM_LAYERS = 6
  FFN_DIM = 8192
  NUM_HEADS = 16
  MODEL_DIM = 1024
  HEAD_DIM = 64
  VOCAB_SIZE = 64000
  NUM_PARTITIONS = 1
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
        num_partitions=self.NUM_PARTITIONS, num_micro_batches=self.NUM_MICRO_BATCHES,
        dropout_keep_prob=self.DROPOUT_KEEP_PROB)
    p.name = 'mt'
    p.languages = self._Languages()
    p.max_decode_length = self.TARGET_MAX_LENGTH - 1
    p.eval.samples_per_summary = 0  # The whole test split.
    tp = p.train
    tp.max_steps = self.MAX_STEPS
    tp.learner = self._Learner()
    return p


class Num2WordsBase(TransformerParamsBase):
  """Models on the built-in num2words corpus: vocabulary and languages read from the corpus."""

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
  """T(3, 256, 4) with model dimension 64 on num2words, K = 2 cells, M = 4 micro-batches."""

  NUM_LAYERS = 3
  FFN_DIM = 256
  NUM_HEADS = 4
  MODEL_DIM = 64
  HEAD_DIM = 16
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4
  BATCH_SIZE = 64
  DROPOUT_KEEP_PROB = 0.9
  MAX_STEPS = 1500

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
