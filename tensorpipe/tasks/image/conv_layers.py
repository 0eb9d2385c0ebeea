"""Image layers AmoebaNet and ResNet share: convolution + GPipe batch norm, and the classifier head.

`ConvBn` is [relu ->] conv (regular or depthwise-separable, no bias) [-> BatchNorm] [-> relu], NHWC.
`PooledClassifier` is [relu ->] global average pooling [-> dropout] -> fully connected logits.
Both compute in the input's dtype (float32 weights are cast, so bfloat16 activations work), and
their FPropMeta gives the flops and output shape from the Params alone, so the layers built from
them can estimate their cost for the pipeline's partitioner without building a graph.
"""

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import tshape

from tensorpipe import batch_norm
from tensorpipe import randomness


def OutSize(size, kernel, stride, padding, dilation=1):
  """Spatial output size of a convolution or pooling window along one axis."""
  if padding == 'SAME':
    return -(-size // stride)
  span = dilation * (kernel - 1) + 1
  return (size - span) // stride + 1


def HeInit(fan, seed=None):
  """Gaussian N(0, 2 / fan): He initialisation (fan-out for convolutions, as in AmoebaNet)."""
  return py_utils.WeightInit.Gaussian(float(np.sqrt(2.0 / max(fan, 1))), seed=seed)


class ConvBn(base_layer.BaseLayer):
  """[relu ->] conv [-> BatchNorm] [-> relu] on [B, H, W, C] inputs."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('filter_shape', (1, 1, 1, 1), '(height, width, in_channels, out_channels).')
    p.Define('stride', (1, 1), '(stride along height, stride along width).')
    p.Define('dilation', 1, 'Dilation rate of the (depthwise) filter; needs stride 1.')
    p.Define('padding', 'SAME', "'SAME' or 'VALID'.")
    p.Define('separable', False,
             'Depthwise-separable: a per-channel (kh, kw) filter, then a 1x1 to out_channels.')
    p.Define('relu_first', False, 'Apply relu to the input before the convolution.')
    p.Define('batch_norm', True, 'Follow the convolution with GPipe batch norm.')
    p.Define('relu_last', False, 'Apply relu to the output.')
    p.Define('bn_gamma_init', 1.0,
             'Initial batch-norm scale (0 zero-initialises a residual branch).')
    p.Define('bn_decay', 0.9997, 'Batch-norm moving-average decay per mini-batch.')
    p.Define('bn_epsilon', 1e-3, 'Batch-norm epsilon.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if len(p.filter_shape) != 4 or min(p.filter_shape) < 1:
      raise ValueError('ConvBn %r: filter_shape must be 4 positive ints, got %r' %
                       (p.name, p.filter_shape))
    if p.padding not in ('SAME', 'VALID'):
      raise ValueError("ConvBn %r: padding must be 'SAME' or 'VALID', got %r" % (p.name, p.padding))
    if p.dilation > 1 and tuple(p.stride) != (1, 1):
      raise ValueError('ConvBn %r: dilation %d needs stride (1, 1), got %r' %
                       (p.name, p.dilation, p.stride))
    if p.batch_norm:
      self.CreateChild('bn', batch_norm.BatchNorm.Params().Set(
          name='bn', dim=p.filter_shape[3], gamma_init=p.bn_gamma_init, decay=p.bn_decay,
          epsilon=p.bn_epsilon))

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    kh, kw, cin, cout = p.filter_shape
    if p.separable:
      self.CreateVariable('depthwise', py_utils.WeightParams([kh, kw, cin, 1],
                                                             HeInit(kh * kw)))
      self.CreateVariable('pointwise', py_utils.WeightParams([1, 1, cin, cout], HeInit(cout)))
    else:
      self.CreateVariable('w', py_utils.WeightParams([kh, kw, cin, cout], HeInit(kh * kw * cout)))

  def FProp(self, theta, x):
    p = self.params
    strides = [1, p.stride[0], p.stride[1], 1]
    dilations = [p.dilation, p.dilation]
    with tf.name_scope(p.name):
      if p.relu_first:
        x = tf.nn.relu(x)
      if p.separable:
        x = tf.nn.depthwise_conv2d(x, tf.cast(theta.depthwise, x.dtype), strides, p.padding,
                                   dilations=dilations)
        x = tf.nn.conv2d(x, tf.cast(theta.pointwise, x.dtype), [1, 1, 1, 1], 'VALID')
      else:
        x = tf.nn.conv2d(x, tf.cast(theta.w, x.dtype), strides, p.padding, dilations=dilations)
      if p.batch_norm:
        x = self.bn.FProp(theta.bn, x)
      if p.relu_last:
        x = tf.nn.relu(x)
      return x

  @classmethod
  def FPropMeta(cls, p, x):
    py_utils.CheckShapes((x,))
    kh, kw, cin, cout = p.filter_shape
    b, h, w = x[0], x[1], x[2]
    oh = OutSize(h, kh, p.stride[0], p.padding, p.dilation)
    ow = OutSize(w, kw, p.stride[1], p.padding, p.dilation)
    if p.separable:
      flops = 2 * b * oh * ow * (kh * kw * cin + cin * cout)
    else:
      flops = 2 * b * oh * ow * kh * kw * cin * cout
    flops += 10 * b * oh * ow * cout
    return py_utils.NestedMap(flops=flops, out_shapes=(tshape.Shape([b, oh, ow, cout]),))


class PooledClassifier(base_layer.BaseLayer):
  """[B, H, W, C] -> [B, num_classes] logits: [relu ->] global mean pool [-> dropout] -> dense."""

  SHAPE_NEUTRAL_PARAMS = ('dropout_keep_prob',)

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Channels of the input.')
    p.Define('num_classes', 1000, 'Number of classes.')
    p.Define('relu_first', False, 'Apply relu to the input before pooling (AmoebaNet does).')
    p.Define('dropout_keep_prob', 1.0, 'Keep probability of dropout before the dense layer.')
    return p

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.input_dim, p.num_classes],
        py_utils.WeightInit.Gaussian(float(np.sqrt(1.0 / p.input_dim)))))
    self.CreateVariable('b', py_utils.WeightParams([p.num_classes],
                                                   py_utils.WeightInit.Constant(0.0)))

  def Logits(self, theta, x):
    p = self.params
    with tf.name_scope(p.name):
      h = tf.reduce_mean(tf.nn.relu(x) if p.relu_first else x, axis=[1, 2])
      if not self.do_eval and p.dropout_keep_prob < 1.0:
        h = randomness.Dropout(h, p.dropout_keep_prob, randomness.Site(self),
                               where='%s %r' % (type(self).__name__, p.name))
      return tf.matmul(h, tf.cast(theta.w, h.dtype)) + tf.cast(theta.b, h.dtype)

  def FProp(self, theta, x):
    return self.Logits(theta, x)

  @classmethod
  def FPropMeta(cls, p, x):
    b = x[0]
    flops = 2 * b * p.input_dim * p.num_classes + x.num_elements()
    return py_utils.NestedMap(flops=flops, out_shapes=(tshape.Shape([b, p.num_classes]),))
