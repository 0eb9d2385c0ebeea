"""ResNet (bottleneck blocks, as ResNet-101) as a flat list of Lingvo layers for a TensorPipeLayer.

The GPipe paper analyses its overheads on ResNet-101. The sequence is: 'stem' (7x7/2 convolution,
batch norm, relu, 3x3/2 max pooling), one layer per bottleneck block ('block<stage>_<i>': 1x1, 3x3
(strided in the first block of stages 2-4), 1x1 to 4x the width, plus an identity or projection
shortcut, relu), and 'classifier' (global average pooling, fully connected). Every layer maps a [B,
H, W, C] tensor to the next and has FPropMeta from its Params, so the pipeline balances partitions
by flops.
"""

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import tshape

from tensorpipe.partitioner import cost_model
from tensorpipe.tasks.image import conv_layers

# Blocks per stage: ResNet-50 / 101 / 152.
DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def _Conv(name, k, cin, cout, stride=1, relu_last=True, **kwargs):
  return conv_layers.ConvBn.Params().Set(name=name, filter_shape=(k, k, cin, cout),
                                         stride=(stride, stride), relu_last=relu_last,
                                         bn_decay=0.9, bn_epsilon=1e-5, **kwargs)


class ResNetStem(base_layer.BaseLayer):
  """7x7/2 convolution to `filters` channels, batch norm, relu, 3x3/2 max pooling."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 3, 'Image channels.')
    p.Define('filters', 64, 'Output channels.')
    p.Define('kernel', 7, 'Convolution size (7 for ImageNet, 3 for tiny images).')
    p.Define('stride', 2, 'Convolution stride.')
    p.Define('max_pool', True, 'Follow with 3x3/2 max pooling.')
    return p

  @classmethod
  def _ConvParams(cls, p):
    return _Conv('conv', p.kernel, p.input_dim, p.filters, p.stride)

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('conv', self._ConvParams(self.params))

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      x = self.conv.FProp(theta.conv, x)
      if self.params.max_pool:
        x = tf.nn.max_pool2d(x, 3, 2, 'SAME')
      return x

  @classmethod
  def FPropMeta(cls, p, x):
    flops, (y,) = cost_model.ChainFlops([cls._ConvParams(p)], [x])
    if p.max_pool:
      y = tshape.Shape([y[0], -(-y[1] // 2), -(-y[2] // 2), y[3]])
      flops += 9 * y.num_elements()
    return py_utils.NestedMap(flops=flops, out_shapes=(y,))


class Bottleneck(base_layer.BaseLayer):
  """relu(x' + F(x)): F = 1x1 -> 3x3 (stride) -> 1x1 (4 x width); x' = x or a 1x1 projection."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Input channels.')
    p.Define('width', 64, 'Channels of the 1x1 and 3x3 convolutions; the output has 4x.')
    p.Define('stride', 1, 'Stride of the 3x3 convolution and of the projection.')
    return p

  @classmethod
  def Plan(cls, p):
    out = 4 * p.width
    branch = [_Conv('conv1', 1, p.input_dim, p.width),
              _Conv('conv2', 3, p.width, p.width, p.stride),
              _Conv('conv3', 1, p.width, out, relu_last=False)]
    shortcut = None
    if p.stride != 1 or p.input_dim != out:
      shortcut = _Conv('shortcut', 1, p.input_dim, out, p.stride, relu_last=False)
    return branch, shortcut

  def __init__(self, params):
    super().__init__(params)
    branch, shortcut = self.Plan(self.params)
    self.CreateChildren('branch', branch)
    if shortcut is not None:
      self.CreateChild('shortcut', shortcut)

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      y = x
      for layer, layer_theta in zip(self.branch, theta.branch):
        y = layer.FProp(layer_theta, y)
      if 'shortcut' in self.children:
        x = self.shortcut.FProp(theta.shortcut, x)
      return tf.nn.relu(x + y)

  @classmethod
  def FPropMeta(cls, p, x):
    branch, shortcut = cls.Plan(p)
    flops, (y,) = cost_model.ChainFlops(branch, [x])
    if shortcut is not None:
      flops += cost_model.ChainFlops([shortcut], [x])[0]
    return py_utils.NestedMap(flops=flops + 2 * y.num_elements(), out_shapes=(y,))


def ResNetLayers(depth=101, num_classes=1000, image_channels=3, base_width=64, stem_kernel=7,
                 stem_stride=2, stem_max_pool=True, blocks=None):
  """The flat layer sequence of a bottleneck ResNet: 'stem', 'block<s>_<i>'..., 'classifier'.

  Args:
    depth: 50, 101 or 152 (ignored when `blocks` is given).
    num_classes: number of classes.
    image_channels: input channels.
    base_width: width of the first stage (64 in ResNet; smaller for tiny variants).
    stem_kernel, stem_stride, stem_max_pool: the stem (7, 2, True on ImageNet; 3, 1, False tiny).
    blocks: optional blocks per stage, overriding `depth`.
  """
  if blocks is None:
    if depth not in DEPTHS:
      raise ValueError('ResNet depth must be one of %s, got %r' % (sorted(DEPTHS), depth))
    blocks = DEPTHS[depth]
  layers = [ResNetStem.Params().Set(name='stem', input_dim=image_channels, filters=base_width,
                                    kernel=stem_kernel, stride=stem_stride,
                                    max_pool=stem_max_pool)]
  dim = base_width
  for stage, num in enumerate(blocks):
    width = base_width * 2**stage
    for i in range(num):
      stride = 2 if stage > 0 and i == 0 else 1
      layers.append(Bottleneck.Params().Set(name='block%d_%d' % (stage + 1, i), input_dim=dim,
                                            width=width, stride=stride))
      dim = 4 * width
  layers.append(conv_layers.PooledClassifier.Params().Set(name='classifier', input_dim=dim,
                                                          num_classes=num_classes))
  return layers
