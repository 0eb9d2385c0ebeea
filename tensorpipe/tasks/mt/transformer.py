"""Batch-major Transformer layers for the encoder and decoder stacks of a pipelined T(L, H, A).

Each layer maps a NestedMap to a NestedMap of the same fields, so a stack of them is a sequential
layer list that TensorPipeLayer can cut into partitions and micro-batch along dimension 0:

  vec           [B, T, D]  the activations this layer transforms;
  paddings      [B, T]     1.0 at padded positions;
  aux_vec       [B, S, D]  decoder only: the encoder output, passed on unchanged to every layer;
  aux_paddings  [B, S]     decoder only: the source paddings, passed on unchanged.

Batch-major (rather than Lingvo's time-major layers) because the pipeline splits micro-batches along
dimension 0. Dropout masks are keyed by each example's index in the mini-batch (see `randomness`),
so they are the same whatever K and M are. Layers are pre-layer-norm (x + f(LN(x))), which is stable
for deep stacks; `ffn_init_scale` lets deep models scale the feed-forward init down by depth, as the
GPipe paper needed.
"""

import math

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import layers
from lingvo.core import py_utils

from tensorpipe import randomness


def _Gaussian(fan_in, scale=1.0):
  return py_utils.WeightInit.Gaussian(scale / math.sqrt(fan_in))


class MultiHeadAttention(base_layer.BaseLayer):
  """Scaled dot-product attention with `num_heads` heads of `head_dim` channels, batch-major."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', 1024, 'Width D of the query, memory and output vectors.')
    p.Define('num_heads', 16, 'A, the number of attention heads.')
    p.Define('head_dim', 64, 'Channels per head; the attention width is num_heads * head_dim.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.model_dim <= 0 or p.num_heads <= 0 or p.head_dim <= 0:
      raise ValueError('MultiHeadAttention %r: model_dim, num_heads and head_dim must be positive, '
                       'got %r, %r, %r' % (p.name, p.model_dim, p.num_heads, p.head_dim))
    width = p.num_heads * p.head_dim
    for name in ('w_q', 'w_k', 'w_v'):
      self.CreateVariable(name, py_utils.WeightParams([p.model_dim, width], _Gaussian(p.model_dim)))
    self.CreateVariable('w_o', py_utils.WeightParams([width, p.model_dim], _Gaussian(width)))

  def _Heads(self, x, w):
    """x [B, T, D] projected by w into heads [B, T, num_heads, head_dim]."""
    p = self.params
    b, t = py_utils.GetShape(x)[0], py_utils.GetShape(x)[1]
    return tf.reshape(tf.einsum('BTD,DH->BTH', x, w), [b, t, p.num_heads, p.head_dim])

  def PackMemory(self, theta, memory, memory_paddings):
    """NestedMap(key, value [B, S, num_heads, head_dim], paddings [B, S]) of memory [B, S, D]: what
    attention to it needs, computed once (a decoder's cross-attention keeps it for every step)."""
    return py_utils.NestedMap(key=self._Heads(memory, theta.w_k),
                              value=self._Heads(memory, theta.w_v),
                              paddings=tf.cast(memory_paddings, memory.dtype))

  def _Attend(self, theta, query, key, value, mask, memory_axes='BSNH'):
    """query [B, T, D] attends to key and value (axes `memory_axes`), where mask [B, 1 or N, T, S]
    is 1.0; returns [B, T, D]."""
    p = self.params
    b, t = py_utils.GetShape(query)[0], py_utils.GetShape(query)[1]
    q = self._Heads(query, theta.w_q) * (p.head_dim**-0.5)
    logits = tf.einsum('BTNH,%s->BNTS' % memory_axes, q, key)
    logits += mask * -1e9
    probs = tf.nn.softmax(logits, axis=-1)
    ctx = tf.einsum('BNTS,%s->BTNH' % memory_axes, probs, value)
    return tf.einsum('BTH,HD->BTD', tf.reshape(ctx, [b, t, p.num_heads * p.head_dim]), theta.w_o)

  def AttendToPacked(self, theta, query, packed):
    """query [B, T, D] attends to PackMemory's `packed`; returns [B, T, D]."""
    with tf.name_scope(self.params.name):
      return self._Attend(theta, query, packed.key, packed.value,
                          packed.paddings[:, None, None, :])

  def FProp(self, theta, query, memory, memory_paddings, causal=False):
    """query [B, T, D] attends to memory [B, S, D] (paddings [B, S]); returns [B, T, D]."""
    with tf.name_scope(self.params.name):
      packed = self.PackMemory(theta, memory, memory_paddings)
      mask = packed.paddings[:, None, None, :]
      if causal:
        t, s = py_utils.GetShape(query)[1], py_utils.GetShape(memory)[1]
        future = 1.0 - tf.linalg.band_part(tf.ones([t, s], mask.dtype), -1, 0)
        mask = tf.maximum(mask, future[None, None, :, :])
      return self._Attend(theta, query, packed.key, packed.value, mask)

  def InitStates(self, theta, batch_size, max_length):
    """Causal self-attention's cache for `max_length` positions: time-major key and value [L, B,
    num_heads, head_dim] and paddings [L, B], 1.0 where no position has been written yet."""
    p = self.params
    zeros = tf.zeros([max_length, batch_size, p.num_heads, p.head_dim])
    return py_utils.NestedMap(key=zeros, value=zeros, paddings=tf.ones([max_length, batch_size]))

  def ExtendStep(self, theta, query, paddings, states, t):
    """Causal self-attention of position t: query [B, 1, D] (paddings [B, 1]) is written into the
    cache at t and attends to positions 0 .. t. Returns ([B, 1, D], the new cache)."""
    with tf.name_scope(self.params.name):
      write = lambda cache, x: tf.tensor_scatter_nd_update(cache, [[t]], x)
      states = py_utils.NestedMap(
          key=write(states.key, tf.transpose(self._Heads(query, theta.w_k), [1, 0, 2, 3])),
          value=write(states.value, tf.transpose(self._Heads(query, theta.w_v), [1, 0, 2, 3])),
          paddings=write(states.paddings, tf.transpose(tf.cast(paddings, query.dtype))))
      mask = tf.transpose(states.paddings)[:, None, None, :]
      return self._Attend(theta, query, states.key, states.value, mask, 'SBNH'), states


class TransformerLayer(base_layer.BaseLayer):
  """Encoder layer (self-attention, feed-forward) or decoder layer (+ causal mask, cross-attention).

  FProp(theta, NestedMap) -> NestedMap with `vec` replaced; the other fields pass through, so the
  decoder's aux_vec / aux_paddings reach every decoder layer through the pipeline.
  """

  SHAPE_NEUTRAL_PARAMS = ('dropout_keep_prob',)

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', 1024, 'Model width D.')
    p.Define('ffn_dim', 8192, 'H, the hidden width of the feed-forward block.')
    p.Define('num_heads', 16, 'A, the number of attention heads.')
    p.Define('head_dim', 64, 'Channels per attention head (attention width grows with heads).')
    p.Define('is_decoder', False, 'True: causal self-attention plus attention to aux_vec.')
    p.Define('causal', None, 'Causal self-attention without aux_vec (a language model\'s layer); '
             'None: same as is_decoder.')
    p.Define('dropout_keep_prob', 1.0, 'Keep probability of the residual-branch dropouts.')
    p.Define('ffn_init_scale', 1.0,
             'Multiplies the feed-forward weights\' init std; '
             'set 1/sqrt(num_layers) for deep models.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.ffn_dim <= 0:
      raise ValueError('TransformerLayer %r: ffn_dim must be positive, got %r' %
                       (p.name, p.ffn_dim))
    if not 0.0 < p.dropout_keep_prob <= 1.0:
      raise ValueError('TransformerLayer %r: dropout_keep_prob must be in (0, 1], got %r' %
                       (p.name, p.dropout_keep_prob))
    att = MultiHeadAttention.Params().Set(model_dim=p.model_dim, num_heads=p.num_heads,
                                          head_dim=p.head_dim)
    norm = layers.LayerNorm.Params().Set(input_dim=p.model_dim, use_defun=False)
    self.CreateChild('self_norm', norm.Copy())
    self.CreateChild('self_att', att.Copy())
    if p.is_decoder:
      self.CreateChild('cross_norm', norm.Copy())
      self.CreateChild('cross_att', att.Copy())
    self.CreateChild('ffn_norm', norm.Copy())
    self.CreateVariable('ffn_w1', py_utils.WeightParams(
        [p.model_dim, p.ffn_dim], _Gaussian(p.model_dim, p.ffn_init_scale)))
    self.CreateVariable('ffn_b1', py_utils.WeightParams([p.ffn_dim],
                                                        py_utils.WeightInit.Constant(0.)))
    self.CreateVariable('ffn_w2', py_utils.WeightParams(
        [p.ffn_dim, p.model_dim], _Gaussian(p.ffn_dim, p.ffn_init_scale)))
    self.CreateVariable('ffn_b2', py_utils.WeightParams([p.model_dim],
                                                        py_utils.WeightInit.Constant(0.)))

  def _Dropout(self, x, use):
    p = self.params
    if self.do_eval or p.dropout_keep_prob >= 1.0:
      return x
    return randomness.Dropout(x, p.dropout_keep_prob, randomness.Site(self, use),
                              where='TransformerLayer %r' % p.name)

  def _Apply(self, theta, x, self_attention, cross_attention):
    """The layer on x [B, T, D], given its attentions as functions of their normalised inputs:
    FProp's and ExtendStep's one computation."""
    p = self.params
    h = self.self_norm.FProp(theta.self_norm, x)
    x += self._Dropout(self_attention(h), 'self_att')
    if p.is_decoder:
      h = self.cross_norm.FProp(theta.cross_norm, x)
      x += self._Dropout(cross_attention(h), 'cross_att')
    h = self.ffn_norm.FProp(theta.ffn_norm, x)
    h = tf.nn.relu(tf.einsum('BTD,DH->BTH', h, theta.ffn_w1) + theta.ffn_b1)
    h = self._Dropout(h, 'ffn_hidden')
    h = tf.einsum('BTH,HD->BTD', h, theta.ffn_w2) + theta.ffn_b2
    return x + self._Dropout(h, 'ffn_out')

  def FProp(self, theta, inputs):
    p = self.params
    causal = p.is_decoder if p.causal is None else p.causal
    with tf.name_scope(p.name):
      out = py_utils.NestedMap(inputs)
      out.vec = self._Apply(
          theta, inputs.vec,
          lambda h: self.self_att.FProp(theta.self_att, h, h, inputs.paddings, causal=causal),
          lambda h: self.cross_att.FProp(theta.cross_att, h, inputs.aux_vec,
                                         inputs.aux_paddings))
      return out

  def InitStates(self, theta, batch_size, max_length, context=None):
    """Incremental decoding's states: the self-attention cache, and for a decoder layer the encoder
    output's keys and values (from context=NestedMap(aux_vec [B, S, D], aux_paddings [B, S])),
    computed once here instead of at every step."""
    p = self.params
    causal = p.is_decoder if p.causal is None else p.causal
    if not causal:
      raise ValueError('TransformerLayer %r: only a causal layer (is_decoder or causal) decodes '
                       'one position at a time' % p.name)
    with tf.name_scope(p.name):
      states = py_utils.NestedMap(
          self_att=self.self_att.InitStates(theta.self_att, batch_size, max_length))
      if p.is_decoder:
        if context is None or context.get('aux_vec') is None:
          raise ValueError("TransformerLayer %r: a decoder layer's InitStates needs "
                           'context=NestedMap(aux_vec, aux_paddings), the encoder output' % p.name)
        states.cross_att = self.cross_att.PackMemory(theta.cross_att, context.aux_vec,
                                                     context.aux_paddings)
    return states

  def ExtendStep(self, theta, inputs, states, t):
    """Position t: inputs NestedMap(vec [B, 1, D], paddings [B, 1]); returns (the same with vec
    transformed, the new states)."""
    p = self.params
    new = py_utils.NestedMap(states)

    def SelfAttention(h):
      out, new.self_att = self.self_att.ExtendStep(theta.self_att, h, inputs.paddings,
                                                   states.self_att, t)
      return out

    with tf.name_scope(p.name):
      out = py_utils.NestedMap(inputs)
      out.vec = self._Apply(
          theta, inputs.vec, SelfAttention,
          lambda h: self.cross_att.AttendToPacked(theta.cross_att, h, states.cross_att))
      return out, new

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Forward flops for NestedMap(vec [B, T, D], paddings [B, T][, aux_vec [B, S, D], ...]) of
    shapes: the attention projections and products (W = num_heads x head_dim), the feed-forward
    block's two matmuls, and about 10 per element of each layer norm; the shapes pass through."""
    b, t, d = inputs.vec[0], inputs.vec[1], inputs.vec[2]
    w, h = p.num_heads * p.head_dim, p.ffn_dim

    def Attention(query_length, memory_length):
      # Query and output projections, key and value projections, logits and context, softmax.
      return (4 * b * query_length * d * w + 4 * b * memory_length * d * w +
              4 * b * query_length * memory_length * w +
              5 * b * p.num_heads * query_length * memory_length)

    flops = Attention(t, t) + 4 * b * t * d * h + 2 * 10 * b * t * d
    if p.is_decoder:
      flops += Attention(t, inputs.aux_vec[1]) + 10 * b * t * d
    return py_utils.NestedMap(flops=flops, out_shapes=(inputs,))


class FinalNorm(base_layer.BaseLayer):
  """Layer norm of `vec` at the top of a pre-layer-norm stack; other fields pass through."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', 1024, 'Model width D.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('norm', layers.LayerNorm.Params().Set(input_dim=self.params.model_dim,
                                                           use_defun=False))

  def FProp(self, theta, inputs):
    with tf.name_scope(self.params.name):
      out = py_utils.NestedMap(inputs)
      out.vec = self.norm.FProp(theta.norm, inputs.vec)
      return out

  @classmethod
  def FPropMeta(cls, p, inputs):
    """About 10 flops per element of `vec`; the shapes pass through."""
    return py_utils.NestedMap(flops=10 * inputs.vec.num_elements(), out_shapes=(inputs,))


def StackLayers(num_layers, model_dim, ffn_dim, num_heads, is_decoder, head_dim=64,
                dropout_keep_prob=1.0, scale_ffn_init_by_depth=True, causal=None):
  """Layer Params of an encoder or decoder stack: `num_layers` TransformerLayers and a FinalNorm.

  causal=True with is_decoder=False gives a language model's stack (no attention to aux_vec).
  """
  if not isinstance(num_layers, int) or num_layers < 1:
    raise ValueError('StackLayers: num_layers must be a positive integer, got %r' % (num_layers,))
  prefix = 'dec' if is_decoder else 'enc'
  scale = 1.0 / math.sqrt(num_layers) if scale_ffn_init_by_depth else 1.0
  out = []
  for i in range(num_layers):
    out.append(TransformerLayer.Params().Set(
        name='%s_layer%03d' % (prefix, i), model_dim=model_dim, ffn_dim=ffn_dim,
        num_heads=num_heads, head_dim=head_dim, is_decoder=is_decoder,
        dropout_keep_prob=dropout_keep_prob, ffn_init_scale=scale, causal=causal))
  out.append(FinalNorm.Params().Set(name='%s_final_norm' % prefix, model_dim=model_dim))
  return out
