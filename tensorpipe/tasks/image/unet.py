"""A small U-Net-like classifier as a flat layer list with long skip connections across partitions.

A U-Net halves the resolution on its way down and doubles it on its way up, and each up layer also
reads the output of the down layer at its resolution. In a pipeline those are long skip
connections: with K = 4 they leave the first partition and enter the last ones, passing partitions
in between. TensorPipeLayer's `skip_connections` declares them, and each one is sent straight from
its source's partition to its destination's. `TinyUNet` builds the network and its skip
connections for the registered model `digits.TinyUNetPipeline` (params/digits.py):

  down0   ConvBlock   8x8x1  -> 8x8x16   conv 3x3, relu                    -> skip into up0
  down1   ConvBlock   8x8x16 -> 4x4x32   conv 3x3, relu, 2x2 max pool      -> skip into up1
  bottom  ConvBlock   4x4x32 -> 2x2x64   conv 3x3, relu, 2x2 max pool
  up1     UpBlock     2x2x64 -> 4x4x32   2x upsampling, concat down1, conv 3x3, relu
  up0     UpBlock     4x4x32 -> 8x8x16   2x upsampling, concat down0, conv 3x3, relu
  head    MlpHead     8x8x16 -> 10       flatten, relu(x W1 + b1) W2 + b2: logits

Balanced by flops into K = 4 partitions this gives [down0, down1] [bottom] [up1] [up0, head]: both
skips cross partitions, and down0's passes two partitions on its way. Every layer seeds its
initialiser explicitly, so two pipelines of the same layers under different names start equal.

Train and evaluate (the held-out 20% of the digits):

  python -m tensorpipe.trainer.train --model=digits.TinyUNetPipeline --cpu_devices=4 \
      --mode=sync --run_locally=cpu --logdir=/tmp/unet
  python -m tensorpipe.trainer.train --model=digits.TinyUNetPipeline --cpu_devices=4 \
      --mode=sync --run_locally=cpu --logdir=/tmp/unet --job=evaler_test
"""

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import tshape

from tensorpipe.tasks.image import pipelined_classifier
from tensorpipe.tasks.image import conv_layers

MERGES = ('concat', 'add')


class UpBlock(base_layer.BaseLayer):
  """U-Net up layer: FProp(theta, x, skip) = relu(conv(merge(upsample(x), skip)) + b).

  x is [B, H, W, input_dim]; skip is [B, 2H, 2W, skip_dim], the output of the down layer at twice
  x's resolution (a declared skip connection, so it comes last). The upsampling is a transposed
  convolution with a 2x2 kernel and stride 2 to skip_dim channels, written as a 1x1 convolution to
  4 x skip_dim channels that depth_to_space spreads over 2x2 blocks (same function, and no output
  shape to compute from the micro-batch size). `merge` joins it with the skip: 'concat' (2 x
  skip_dim channels, as in U-Net) or 'add' (skip_dim channels, a residual-style join). A SAME
  padded convolution and relu then give [B, 2H, 2W, output_dim].
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Channels of x, the output of the layer below.')
    p.Define('skip_dim', 0, 'Channels of the skip input (the matching down layer\'s output).')
    p.Define('output_dim', 0, 'Channels of the output.')
    p.Define('kernel_size', 3, 'Height and width of the convolution after the merge.')
    p.Define('merge', 'concat', "How the upsampled x and the skip are joined: 'concat' or 'add'.")
    p.Define('seed', None, 'Seed of the upsampling weights\' initialiser; seed + 1 seeds the conv.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    where = 'UpBlock %r' % p.name
    for field in ('input_dim', 'skip_dim', 'output_dim', 'kernel_size'):
      value = p.Get(field)
      if not isinstance(value, int) or value < 1:
        raise ValueError('%s: %s must be a positive integer, got %r' % (where, field, value))
    if p.merge not in MERGES:
      raise ValueError('%s: merge=%r is not one of %s' % (where, p.merge, MERGES))

  @classmethod
  def _MergedDim(cls, p):
    return 2 * p.skip_dim if p.merge == 'concat' else p.skip_dim

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    conv_seed = None if p.seed is None else p.seed + 1
    merged = self._MergedDim(p)
    self.CreateVariable('up_w', py_utils.WeightParams([1, 1, p.input_dim, 4 * p.skip_dim],
                                                      conv_layers.HeInit(p.input_dim, p.seed)))
    self.CreateVariable('up_b', py_utils.WeightParams([4 * p.skip_dim],
                                                      py_utils.WeightInit.Constant(0.0)))
    k = p.kernel_size
    self.CreateVariable('w', py_utils.WeightParams(
        [k, k, merged, p.output_dim], conv_layers.HeInit(k * k * merged, conv_seed)))
    self.CreateVariable('b', py_utils.WeightParams([p.output_dim],
                                                   py_utils.WeightInit.Constant(0.0)))

  def _CheckShapes(self, x, skip):
    """Refuses, naming both shapes, a skip that is not at twice x's resolution with skip_dim."""
    p = self.params
    xs, ss = x.shape.as_list(), skip.shape.as_list()
    if len(xs) != 4 or len(ss) != 4:
      raise ValueError('UpBlock %r: x and skip must be [B, H, W, C], got shapes %s and %s' %
                       (p.name, xs, ss))
    expected = [None if d is None else 2 * d for d in xs[1:3]] + [p.skip_dim]
    if xs[3] not in (None, p.input_dim) or any(
        e is not None and s is not None and e != s for e, s in zip(expected, ss[1:])):
      raise ValueError(
          'UpBlock %r: x %s and skip %s do not fit: x needs %d channels (input_dim) and skip '
          '[B, 2H, 2W, skip_dim=%d]; is the skip connection declared from the down layer at '
          'twice this resolution?' % (p.name, xs, ss, p.input_dim, p.skip_dim))

  def FProp(self, theta, x, skip):
    p = self.params
    self._CheckShapes(x, skip)
    with tf.name_scope(p.name):
      up = tf.nn.conv2d(x, theta.up_w, strides=[1, 1, 1, 1], padding='VALID') + theta.up_b
      up = tf.nn.depth_to_space(up, 2)
      merged = tf.concat([up, skip], axis=-1) if p.merge == 'concat' else up + skip
      y = tf.nn.conv2d(merged, theta.w, strides=[1, 1, 1, 1], padding='SAME') + theta.b
      return tf.nn.relu(y)

  @classmethod
  def FPropMeta(cls, p, x, skip=None):
    """Flops and output shape from x's shape and the Params (the skip's shape follows from them,
    so it is optional)."""
    del skip
    py_utils.CheckShapes((x,))
    b, h, w = x[0], x[1], x[2]
    oh, ow = 2 * h, 2 * w
    merged = cls._MergedDim(p)
    k = p.kernel_size
    flops = 2 * b * h * w * p.input_dim * 4 * p.skip_dim  # Upsampling.
    flops += b * oh * ow * p.skip_dim  # Its bias (or the add of 'add').
    flops += 2 * b * oh * ow * k * k * merged * p.output_dim + 2 * b * oh * ow * p.output_dim
    return py_utils.NestedMap(flops=flops, out_shapes=(tshape.Shape([b, oh, ow, p.output_dim]),))


def TinyUNet(image_shape=(8, 8, 1), channels=(16, 32, 64), hidden_dim=64, num_classes=10,
             merge='concat', seed=1):
  """A U-Net classifier as (layers, skip_connections) for a TensorPipeLayer's Params.

  The down path is 'down0' (full resolution, channels[0]), 'down1' .. 'down<n-1>' (each halving the
  resolution) and 'bottom' (halving it once more to channels[n]), with n = len(channels) - 1. The up
  path 'up<n-1>' .. 'up0' doubles it back, each up layer reading the matching down layer's output
  through the skip connection ('down<i>', 'up<i>'); 'head' turns the full-resolution features
  into logits. Layer i seeds its initialisers with seed + 2 i.

  Args:
    image_shape: (height, width, channels) of the images; height and width must be divisible by
      2^n.
    channels: the channels of each resolution, from the full one down to the bottom's.
    hidden_dim: width of the head's hidden layer.
    num_classes: number of logits.
    merge: how up layers join their skip: 'concat' or 'add' (see UpBlock).
    seed: seed of the first layer's initialiser.

  Returns:
    (list of layer Params, list of (source, destination) layer names), the skip connections
    innermost first.
  """
  h, w, cin = image_shape
  n = len(channels) - 1
  if n < 1:
    raise ValueError('TinyUNet: channels=%r needs at least 2 entries (the full resolution and the '
                     'bottom)' % (channels,))
  if h % 2**n or w % 2**n:
    raise ValueError('TinyUNet: image_shape %r is not divisible by 2^%d = %d, which %d resolution '
                     'halvings (channels=%r) need; use fewer channels entries or larger images' %
                     (tuple(image_shape), n, 2**n, n, tuple(channels)))
  seeds = iter(range(seed, seed + 2 * (2 * n + 2), 2))
  layers = [pipelined_classifier.ConvBlock.Params().Set(
      name='down0', filter_shape=(3, 3, cin, channels[0]), seed=next(seeds))]
  for i in range(1, n + 1):
    layers.append(pipelined_classifier.ConvBlock.Params().Set(
        name='down%d' % i if i < n else 'bottom', filter_shape=(3, 3, channels[i - 1], channels[i]),
        pool=True, seed=next(seeds)))
  for i in reversed(range(n)):
    layers.append(UpBlock.Params().Set(
        name='up%d' % i, input_dim=channels[i + 1], skip_dim=channels[i], output_dim=channels[i],
        merge=merge, seed=next(seeds)))
  layers.append(pipelined_classifier.MlpHead.Params().Set(
      name='head', input_dim=h * w * channels[0], hidden_dim=hidden_dim, num_classes=num_classes,
      seed=next(seeds)))
  skips = [('down%d' % i, 'up%d' % i) for i in reversed(range(n))]
  return layers, skips
