"""A Transformer language model whose layer stack runs inside one TensorPipeLayer: Transformer-L.

The GPipe paper's memory table (Table 1) scales Transformer-L, a stack of L Transformer layers with
model dimension 2048, feed-forward 8192, 32 heads, a 32k vocabulary, sequences of 1024 tokens and
batch 32. `PipelinedTransformerLm` is that model: an embedding and a softmax around a
TensorPipeLayer of transformer.StackLayers(causal=True) (self-attention only); loss is next-token
cross-entropy. Input batches: ids [B, T], labels [B, T], paddings [B, T] (e.g. SyntheticLmInput
below, which draws random tokens: enough for the memory/throughput configs, which do not measure
quality).
"""

import math

from lingvo import compat as tf
from lingvo.core import base_input_generator
from lingvo.core import base_model
from lingvo.core import layers
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tensorpipe.tasks.mt import transformer


class PipelinedTransformerLm(base_model.BaseTask):
  """Embedding -> pipelined causal Transformer stack (`stack`) -> softmax, next-token loss."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 32000, 'Vocabulary size.')
    p.Define('model_dim', 2048, 'Model width D.')
    p.Define('stack', None, 'The layer stack: a TensorPipeLayer over causal TransformerLayers.')
    p.Define('logits_abs_max', 30.0, 'Clip logits to [-v, v]; None disables.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.stack is None:
      raise ValueError('PipelinedTransformerLm %r: set `stack`' % p.name)
    self.CreateChild('stack', p.stack.Copy().Set(name=p.stack.name or 'stack'))
    devices = getattr(self.stack, 'devices', None) or ['']
    with tf.device(devices[0]):
      self.CreateVariable('emb', py_utils.WeightParams(
          [p.vocab_size, p.model_dim], py_utils.WeightInit.Gaussian(1.0 / math.sqrt(p.model_dim))))
      self.CreateChild('position', layers.PositionalEmbeddingLayer.Params().Set(
          embedding_dim=p.model_dim))
    with tf.device(devices[-1]):
      self.CreateVariable('softmax_w', py_utils.WeightParams(
          [p.model_dim, p.vocab_size], py_utils.WeightInit.Gaussian(1.0 / math.sqrt(p.model_dim))))
      self.CreateVariable('softmax_b', py_utils.WeightParams(
          [p.vocab_size], py_utils.WeightInit.Constant(0.0)))
    self._devices = devices

  def ComputePredictions(self, theta, input_batch):
    p = self.params
    ids = input_batch.ids
    t = py_utils.GetShape(ids)[1]
    with tf.device(self._devices[0]):
      x = tf.gather(theta.emb, ids) * math.sqrt(p.model_dim)
      x += self.position.FProp(theta.position, t)[None, :, :]
    out = self.stack.FProp(theta.stack, py_utils.NestedMap(
        vec=x, paddings=tf.cast(input_batch.paddings, x.dtype)))
    with tf.device(self._devices[-1]):
      logits = tf.einsum('BTD,DV->BTV', out.vec, theta.softmax_w) + theta.softmax_b
      if p.logits_abs_max:
        logits = tf.clip_by_value(logits, -p.logits_abs_max, p.logits_abs_max)
    return py_utils.NestedMap(logits=logits)

  def ComputeLoss(self, theta, predictions, input_batch):
    with tf.device(self._devices[-1]), tf.name_scope('loss'):
      weights = 1.0 - tf.cast(input_batch.paddings, tf.float32)
      xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=tf.cast(input_batch.labels, tf.int32), logits=predictions.logits)
      num = tf.reduce_sum(weights)
      loss = tf.reduce_sum(xent * weights) / tf.maximum(num, 1.0)
    return {'loss': (loss, num), 'log_pplx': (loss, num)}, {}


class SyntheticLmInput(base_input_generator.BaseInputGenerator):
  """Batches of uniformly random token ids (labels = ids shifted by one), for memory/speed runs."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'synthetic_lm_input'
    p.Define('vocab_size', 32000, 'Token ids are drawn from [0, vocab_size).')
    p.Define('seq_len', 1024, 'Tokens per sequence.')
    p.Define('seed', 1, 'Seed of the stateless draws (batch i uses seed [seed, i]).')
    return p

  def _InputBatch(self):
    p = self.params
    b = self.InfeedBatchSize()
    step = tf.cast(py_utils.GetGlobalStep(), tf.int64)
    tokens = tf.random.stateless_uniform([b, p.seq_len + 1], seed=tf.stack([p.seed, step]),
                                         minval=0, maxval=p.vocab_size, dtype=tf.int32)
    return py_utils.NestedMap(ids=tokens[:, :-1], labels=tokens[:, 1:],
                              paddings=tf.zeros([b, p.seq_len], tf.float32))


def TransformerLmParams(num_layers, model_dim=2048, ffn_dim=8192, num_heads=32, vocab_size=32000,
                        num_devices=1, num_micro_batches=1, head_dim=64, recompute='always',
                        dropout_keep_prob=1.0, name='lm'):
  """PipelinedTransformerLm Params for Transformer-L: L causal layers on num_devices devices."""
  p = PipelinedTransformerLm.Params().Set(name=name, vocab_size=vocab_size, model_dim=model_dim)
  p.stack = layer_lib.TensorPipeLayer.Params().Set(
      name='stack', num_devices=num_devices, num_micro_batches=num_micro_batches,
      recompute=recompute,
      layers=transformer.StackLayers(num_layers, model_dim, ffn_dim, num_heads, is_decoder=False,
                                     head_dim=head_dim, dropout_keep_prob=dropout_keep_prob,
                                     causal=True))
  return p
