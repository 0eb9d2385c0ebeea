"""Synthetic layers that benchmarks and partitioning studies build their models from.

Every layer here has an FPropMeta (forward flops and output shapes), so the partitioner can cost it
by 'flops' and Lingvo's GPipe can infer its partitions' outputs. `TransformerStack` is a token
embedding, Lingvo TransformerLayer blocks and a softmax: the shape of the GPipe paper's Transformer
models, with the embedding and softmax much costlier than a block when the vocabulary is large.
`RepeatedDense` keeps its input's shape and has a cost set by one Param, for stacks with a chosen
uneven cost. `SquaredNorm` is a per-example loss to end a stack with, so that schedules that start
backward passes early (1F1B, zero bubble) have a last layer giving a loss per example.
"""

from typing import List, Tuple

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import hyperparams
from lingvo.core import layers_with_attention
from lingvo.core import py_utils
from lingvo.core import tshape


class TokenEmbedding(base_layer.BaseLayer):
  """ids [T, B] -> (vecs [T, B, D], paddings [T, B]): the first layer of a Transformer stack."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 32000, 'Vocabulary size.')
    p.Define('model_dim', 2048, 'Embedding width.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    super().__init__(params)
    p = self.params
    self.CreateVariable('emb', py_utils.WeightParams(
        [p.vocab_size, p.model_dim], py_utils.WeightInit.Gaussian(p.model_dim**-0.5)))

  def FProp(self, theta: py_utils.NestedMap, ids: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    with tf.name_scope(self.params.name):
      return tf.gather(theta.emb, ids), tf.zeros(tf.shape(ids), tf.float32)

  @classmethod
  def FPropMeta(cls, p: hyperparams.InstantiableParams, ids: tshape.Shape) -> py_utils.NestedMap:
    t, b = ids[0], ids[1]
    vecs = ids.__class__([t, b, p.model_dim])
    return py_utils.NestedMap(flops=t * b * p.model_dim, out_shapes=(vecs, ids))


class SoftmaxLogits(base_layer.BaseLayer):
  """(vecs [T, B, D], paddings) -> log-probabilities [T, B, V]: the last layer of the stack."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 32000, 'Vocabulary size.')
    p.Define('model_dim', 2048, 'Input width.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.model_dim, p.vocab_size], py_utils.WeightInit.Gaussian(p.model_dim**-0.5)))

  def FProp(self, theta: py_utils.NestedMap, vecs: tf.Tensor, paddings: tf.Tensor) -> tf.Tensor:
    with tf.name_scope(self.params.name):
      return tf.nn.log_softmax(tf.einsum('tbd,dv->tbv', vecs, theta.w))

  @classmethod
  def FPropMeta(cls, p: hyperparams.InstantiableParams, vecs: tshape.Shape,
                paddings: tshape.Shape) -> py_utils.NestedMap:
    t, b = vecs[0], vecs[1]
    flops = 2 * t * b * p.model_dim * p.vocab_size + 3 * t * b * p.vocab_size
    return py_utils.NestedMap(flops=flops, out_shapes=(vecs.__class__([t, b, p.vocab_size]),))


class TransformerBlock(base_layer.BaseLayer):
  """A Lingvo TransformerLayer (encoder block) as (vecs, paddings) -> (vecs, paddings).

  vecs are time-major [T, B, D] and paddings [T, B], as Lingvo's attention layers want, so the batch
  dimension of both is 1. TransformerLayer.FProp returns (output, attention probabilities); the
  block passes the paddings on instead, so that SequentialLayer, TensorPipeLayer and Lingvo's
  PipeliningLayer can feed one block's outputs to the next.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('model_dim', 256, 'Model dimension.')
    p.Define('num_heads', 4, 'Attention heads.')
    p.Define('hidden_dim', 1024, 'Feed-forward hidden dimension.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    super().__init__(params)
    p = self.params
    tp = layers_with_attention.TransformerLayer.Params().Set(
        name='transformer', source_dim=p.model_dim, output_dim=p.model_dim)
    tp.tr_atten_tpl.num_attention_heads = p.num_heads
    tp.tr_fflayer_tpl.hidden_dim = p.hidden_dim
    self.CreateChild('transformer', tp)

  def FProp(self, theta: py_utils.NestedMap, vecs: tf.Tensor,
            paddings: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    with tf.name_scope(self.params.name):
      out, _ = self.transformer.FProp(theta.transformer, vecs, paddings)
      return out, paddings

  @classmethod
  def FPropMeta(cls, p: hyperparams.InstantiableParams, vecs: tshape.Shape,
                paddings: tshape.Shape) -> py_utils.NestedMap:
    """Rough forward matmul flops: QKV and output projections, attention, feed-forward."""
    t, b, d = vecs[0], vecs[1], vecs[2]
    flops = 2 * t * b * (4 * d * d + 2 * d * p.hidden_dim) + 4 * t * t * b * d
    return py_utils.NestedMap(flops=flops, out_shapes=(vecs, paddings))


class RepeatedDense(base_layer.BaseLayer):
  """x -> tanh(x w) applied `repeats` times with one weight: cost set by repeats, shape kept."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('dim', 512, 'Width.')
    p.Define('repeats', 1, 'How many times the weight is applied.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.dim, p.dim], py_utils.WeightInit.Gaussian(p.dim**-0.5)))

  def FProp(self, theta: py_utils.NestedMap, x: tf.Tensor) -> tf.Tensor:
    with tf.name_scope(self.params.name):
      for _ in range(self.params.repeats):
        x = tf.tanh(tf.matmul(x, theta.w))
      return x

  @classmethod
  def FPropMeta(cls, p: hyperparams.InstantiableParams, x: tshape.Shape) -> py_utils.NestedMap:
    return py_utils.NestedMap(flops=2 * x[0] * p.dim * p.dim * p.repeats, out_shapes=(x,))


class SquaredNorm(base_layer.BaseLayer):
  """x [B, D] -> per-example losses |x|^2 [B]: a last layer for schedules that run backward passes
  early."""

  def FProp(self, theta: py_utils.NestedMap, x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.square(x), axis=-1)

  @classmethod
  def FPropMeta(cls, p: hyperparams.InstantiableParams, x: tshape.Shape) -> py_utils.NestedMap:
    return py_utils.NestedMap(flops=2 * x.num_elements(), out_shapes=(x.__class__(x[:-1]),))


def TransformerStack(num_layers: int, model_dim: int, hidden_dim: int, num_heads: int,
                     vocab_size: int) -> List[hyperparams.InstantiableParams]:
  """Layer Params of a Transformer stack: embedding, `num_layers` blocks, softmax.

  The first layer takes int32 ids [T, B]; the batch dimension of every layer's inputs is 1.
  """
  if num_layers < 0:
    raise ValueError('TransformerStack: num_layers must be >= 0, got %r' % (num_layers,))
  return ([TokenEmbedding.Params().Set(name='embedding', vocab_size=vocab_size,
                                       model_dim=model_dim)] +
          [TransformerBlock.Params().Set(name='block%d' % i, model_dim=model_dim,
                                         num_heads=num_heads, hidden_dim=hidden_dim)
           for i in range(num_layers)] +
          [SoftmaxLogits.Params().Set(name='softmax', vocab_size=vocab_size,
                                      model_dim=model_dim)])
