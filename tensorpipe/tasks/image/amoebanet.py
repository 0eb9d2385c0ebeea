"""AmoebaNet-B and -D as a flat sequence of Lingvo layers that a TensorPipeLayer partitions.

The network (Real et al., as trained in the GPipe paper): a stem (3x3 stride-2 convolution, then two
reduction cells at 1/4 and 1/2 of the filters), three stacks of L/3 normal cells with a reduction
cell (filters doubled) before stacks 2 and 3, an auxiliary head after the last cell of stack 2, and
the classifier (relu, global average pool, dropout, fully connected). (L, F) = (`num_cells`,
`filters`) as in Table 1 of the paper.

A cell reads the previous two cell outputs (h0 = x, h1 = prev), so every layer of the sequence maps
the tuple (x, prev, aux_logits) to the next such tuple; the classifier maps it to (logits,
aux_logits). aux_logits is None until the auxiliary head and in evaluation. Each cell runs 5 steps:
two operations on two hidden states (chosen by index), added, appended as a new state; the output
concatenates the states no step consumed (reshaped to a common size by a factorized reduction where
they differ). Operations other than 'none' get NASNet's scheduled drop-path, with per-example masks
that neither re-computation nor K or M change (see `randomness`). Every layer has FPropMeta from its
Params alone, so a TensorPipeLayer can balance its partitions by flops.

Layer shapes and channel counts are computed statically by `AmoebaNetLayers`, so building the layers
(without running FProp) creates all variables; parameter counts come from them without a forward
pass.
"""

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import tshape

from tensorpipe import batch_norm
from tensorpipe import randomness
from tensorpipe.partitioner import cost_model
from tensorpipe.tasks.image import conv_layers

# (operations, hidden-state indices, used hidden states) of each cell, from the public AmoebaNet
# reference (tensorflow/tpu models/official/amoeba_net): step i applies operations[2i],
# operations[2i+1] to states indices[2i], indices[2i+1]; the output concatenates the states whose
# `used` flag is 0.
GENOTYPES = {
    'B': {
        'normal': (['1x1', 'max_pool_3x3', 'none', 'separable_3x3_2', '1x1', 'separable_3x3_2',
                    '1x1', 'none', 'avg_pool_3x3', '1x1'],
                   [1, 1, 1, 0, 1, 0, 2, 2, 1, 5],
                   [0, 1, 1, 0, 0, 1, 0]),
        'reduction': (['max_pool_2x2', 'max_pool_3x3', 'none', '3x3', 'dil_2_separable_5x5_2',
                       'max_pool_3x3', 'none', 'separable_3x3_2', 'avg_pool_3x3', '1x1'],
                      [0, 0, 2, 1, 2, 2, 3, 1, 4, 3],
                      [1, 1, 1, 1, 1, 0, 0]),
    },
    'D': {
        'normal': (['1x1', 'max_pool_3x3', 'none', '1x7_7x1', '1x1', '1x7_7x1', 'max_pool_3x3',
                    'none', 'avg_pool_3x3', '1x1'],
                   [1, 1, 1, 0, 0, 0, 2, 2, 1, 5],
                   [0, 1, 1, 0, 0, 1, 0]),
        'reduction': (['max_pool_2x2', 'max_pool_3x3', 'none', '3x3', '1x7_7x1', 'max_pool_3x3',
                       'none', 'max_pool_2x2', 'avg_pool_3x3', '1x1'],
                      [0, 0, 2, 1, 2, 2, 3, 1, 2, 3],
                      [1, 1, 1, 1, 0, 0, 0]),
    },
}


def _Shape(b, hw, c):
  return tshape.Shape([b, hw[0], hw[1], c])


def _Strided(hw, stride):
  return (-(-hw[0] // stride), -(-hw[1] // stride))


def _Conv(name, kh, kw, cin, cout, stride=(1, 1), relu_first=True, **kwargs):
  """A ConvBn (relu first by default, as in AmoebaNet's cells)."""
  return conv_layers.ConvBn.Params().Set(name=name, filter_shape=(kh, kw, cin, cout), stride=stride,
                                         relu_first=relu_first, **kwargs)


class CellOp(base_layer.BaseLayer):
  """One operation of a cell (a pooling, a stack of convolutions, or identity), then drop-path."""

  SHAPE_NEUTRAL_PARAMS = ('cell_index', 'num_cells', 'drop_path_keep_prob', 'drop_path_steps')

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('operation', 'none', "Operation name, e.g. '1x1', 'separable_3x3_2', '1x7_7x1', "
             "'max_pool_3x3', 'dil_2_separable_5x5_2', 'none'.")
    p.Define('input_dim', 0, 'Channels of the input state.')
    p.Define('filters', 0, 'Channels of the output state.')
    p.Define('stride', 1, 'Spatial stride (2 on the original inputs of a reduction cell).')
    p.Define('drop_path_keep_prob', 1.0, 'Final keep probability of drop-path (1: no drop-path).')
    p.Define('cell_index', 0, 'Index of the cell in the network (deeper cells drop more).')
    p.Define('num_cells', 1, 'Number of cells in the network, for the drop-path schedule.')
    p.Define('drop_path_steps', 0,
             'Steps over which drop-path ramps up to its final rate (0: from the start).')
    p.Define('bn_decay', 0.9997, 'Batch-norm moving-average decay per mini-batch.')
    return p

  @classmethod
  def Plan(cls, p):
    """(pool (type, size) or None, list of ConvBn Params) that implement `p.operation`."""
    op, cin, f, s = p.operation, p.input_dim, p.filters, p.stride
    if 'pool' in op:
      kind, size = op.split('_')[0], int(op.split('_')[-1].split('x')[0])
      if kind not in ('max', 'avg'):
        raise ValueError('CellOp %r: unknown pooling %r' % (p.name, op))
      convs = [] if cin == f else [
          _Conv('conv', 1, 1, cin, f, relu_first=False, bn_decay=p.bn_decay)]
      return (kind, size), convs
    if op in ('none', '1x1'):
      if s > 1 or op == '1x1' or cin != f:
        return None, [_Conv('conv', 1, 1, cin, f, (s, s), bn_decay=p.bn_decay)]
      return None, []
    if 'separable' in op:
      parts = op.split('_')
      kernel, repeats = int(parts[-2].split('x')[0]), int(parts[-1])
      dilation = int(parts[1]) if parts[0] == 'dil' else 1
      convs = []
      for i in range(repeats):
        stride = s if i == 0 else 1
        convs.append(_Conv('sep%d' % i, kernel, kernel, cin if i == 0 else f, f, (stride, stride),
                           separable=True, dilation=dilation if stride == 1 else 1,
                           bn_decay=p.bn_decay))
      return None, convs
    if op in ('3x3', '1x7_7x1'):
      reduced = f // 4
      inner = reduced if reduced >= 1 else f
      convs = [] if reduced < 1 else [_Conv('pre', 1, 1, cin, inner, bn_decay=p.bn_decay)]
      first_in = inner if reduced >= 1 else cin
      if op == '3x3':
        convs.append(_Conv('conv3x3', 3, 3, first_in, inner, (s, s), bn_decay=p.bn_decay))
      else:
        convs.append(_Conv('conv1x7', 1, 7, first_in, inner, (1, s), bn_decay=p.bn_decay))
        convs.append(_Conv('conv7x1', 7, 1, inner, inner, (s, 1), bn_decay=p.bn_decay))
      if reduced >= 1:
        convs.append(_Conv('post', 1, 1, inner, f, bn_decay=p.bn_decay))
      return None, convs
    raise ValueError('CellOp %r: unknown operation %r' % (p.name, op))

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._pool, convs = self.Plan(p)
    self.CreateChildren('convs', convs)

  @property
  def drops_path(self) -> bool:
    """Whether FProp applies drop-path: in training, with a keep probability below 1."""
    p = self.params
    return p.operation != 'none' and p.drop_path_keep_prob < 1.0 and not self.do_eval

  def FProp(self, theta, x, drop_path=None):
    """The operation on x, then drop-path if `drops_path`.

    Args:
      theta: the layer's weights.
      x: [B, H, W, C] input state.
      drop_path: (mask, keep probability) of this op's drop-path drawn by its cell (see
        `Cell.DropPaths`), or None: the op draws its own (the same values).
    """
    p = self.params
    with tf.name_scope(p.name):
      if self._pool:
        kind, size = self._pool
        pool = tf.nn.max_pool2d if kind == 'max' else tf.nn.avg_pool2d
        x = pool(x, size, p.stride, 'SAME')
      for conv, conv_theta in zip(self.convs, theta.convs):
        x = conv.FProp(conv_theta, x)
      if self.drops_path:
        if drop_path is not None:
          return randomness.Masked(x, *drop_path)
        keep = randomness.ScheduledKeepProb(p.drop_path_keep_prob, p.cell_index, p.num_cells,
                                            p.drop_path_steps)
        x = randomness.DropPath(x, keep, randomness.Site(self), where='CellOp %r' % p.name)
      return x

  @classmethod
  def FPropMeta(cls, p, x):
    pool, convs = cls.Plan(p)
    flops = 0
    if pool:
      x = _Shape(x[0], _Strided((x[1], x[2]), p.stride), x[3])
      flops += x.num_elements() * pool[1] * pool[1]
    conv_flops, (x,) = cost_model.ChainFlops(convs, [x])
    return py_utils.NestedMap(flops=flops + conv_flops, out_shapes=(x,))


class FactorizedReduction(base_layer.BaseLayer):
  """Reshapes a state to `output_dim` channels and, with stride 2, half the size losing no pixels.

  Stride 2: two 1x1 convolutions on the even and the odd pixel grids, concatenated, batch-normed.
  Stride 1: a 1x1 convolution and batch norm.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Input channels.')
    p.Define('output_dim', 0, 'Output channels (even for stride 2).')
    p.Define('stride', 2, '1 or 2.')
    p.Define('relu_first', False, 'Apply relu to the input first.')
    p.Define('bn_decay', 0.9997, 'Batch-norm moving-average decay per mini-batch.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.stride == 1:
      self.CreateChild('conv', _Conv('conv', 1, 1, p.input_dim, p.output_dim,
                                     relu_first=p.relu_first, bn_decay=p.bn_decay))
    else:
      if p.output_dim % 2:
        raise ValueError('FactorizedReduction %r: output_dim must be even, got %d' %
                         (p.name, p.output_dim))
      half = p.output_dim // 2
      for name in ('path1', 'path2'):
        self.CreateChild(name, _Conv(name, 1, 1, p.input_dim, half, (2, 2),
                                     relu_first=p.relu_first, batch_norm=False, padding='VALID',
                                     bn_decay=p.bn_decay))
      self.CreateChild('bn', batch_norm.BatchNorm.Params().Set(name='bn', dim=p.output_dim,
                                                               decay=p.bn_decay))

  def FProp(self, theta, x):
    p = self.params
    with tf.name_scope(p.name):
      if p.stride == 1:
        return self.conv.FProp(theta.conv, x)
      path1 = self.path1.FProp(theta.path1, x)
      shifted = tf.pad(x, [[0, 0], [0, 1], [0, 1], [0, 0]])[:, 1:, 1:, :]
      path2 = self.path2.FProp(theta.path2, shifted)
      return self.bn.FProp(theta.bn, tf.concat([path1, path2], axis=3))

  @classmethod
  def FPropMeta(cls, p, x):
    hw = _Strided((x[1], x[2]), p.stride)
    flops = 2 * x[0] * hw[0] * hw[1] * p.input_dim * p.output_dim
    return py_utils.NestedMap(flops=flops, out_shapes=(_Shape(x[0], hw, p.output_dim),))


class Cell(base_layer.BaseLayer):
  """An AmoebaNet normal or reduction cell: (x, prev, aux) -> (cell output, x, aux)."""

  SHAPE_NEUTRAL_PARAMS = ('cell_index', 'num_cells', 'drop_path_keep_prob', 'drop_path_steps')

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('genotype', 'D', "'B' or 'D'.")
    p.Define('reduction', False,
             'A reduction cell (stride 2 on its inputs) instead of a normal one.')
    p.Define('filters', 0, 'Channels of every hidden state of the cell.')
    p.Define('input_dim', 0, 'Channels of x, the previous cell output.')
    p.Define('input_size', (0, 0), '(height, width) of x.')
    p.Define('prev_dim', None, 'Channels of prev, the output before x (None: there is none).')
    p.Define('prev_reduce', False, 'prev is twice the size of x (it precedes a reduction).')
    p.Define('drop_path_keep_prob', 1.0, 'Final keep probability of drop-path.')
    p.Define('cell_index', 0, 'Index of this cell in the network, for the drop-path schedule.')
    p.Define('num_cells', 1, 'Number of cells in the network, for the drop-path schedule.')
    p.Define('drop_path_steps', 0, 'Steps over which drop-path ramps up (0: from the start).')
    p.Define('bn_decay', 0.9997, 'Batch-norm moving-average decay per mini-batch.')
    return p

  @classmethod
  def Plan(cls, p):
    """The cell's structure from its Params: child Params, output channels and size."""
    if p.genotype not in GENOTYPES:
      raise ValueError('Cell %r: genotype must be one of %s, got %r' %
                       (p.name, sorted(GENOTYPES), p.genotype))
    ops, indices, used = GENOTYPES[p.genotype]['reduction' if p.reduction else 'normal']
    f, stride = p.filters, 2 if p.reduction else 1
    size = tuple(p.input_size)
    plan = py_utils.NestedMap(prev=None, ops=[], reductions=[])
    plan.base = _Conv('base', 1, 1, p.input_dim, f, bn_decay=p.bn_decay)
    if p.prev_dim is None:
      dims = [f, p.input_dim]
    else:
      if p.prev_reduce:
        plan.prev = FactorizedReduction.Params().Set(name='prev', input_dim=p.prev_dim,
                                                     output_dim=f, stride=2, relu_first=True,
                                                     bn_decay=p.bn_decay)
      elif p.prev_dim != f:
        plan.prev = _Conv('prev', 1, 1, p.prev_dim, f, bn_decay=p.bn_decay)
      dims = [f, f]
    sizes = [size, size]
    for i, (op, index) in enumerate(zip(ops, indices)):
      op_stride = stride if index < 2 else 1
      plan.ops.append(CellOp.Params().Set(
          name='op%d_%s' % (i // 2, 'left' if i % 2 == 0 else 'right'), operation=op,
          input_dim=dims[index], filters=f, stride=op_stride,
          drop_path_keep_prob=p.drop_path_keep_prob, cell_index=p.cell_index,
          num_cells=p.num_cells, drop_path_steps=p.drop_path_steps, bn_decay=p.bn_decay))
      out_size = _Strided(sizes[index], op_stride)
      if i % 2 == 1:
        dims.append(f)
        sizes.append(out_size)
    plan.concat = [i for i, u in enumerate(used) if not u]
    for i in plan.concat:
      if dims[i] != dims[-1] or sizes[i] != sizes[-1]:
        plan.reductions.append((i, FactorizedReduction.Params().Set(
            name='reduce%d' % i, input_dim=dims[i], output_dim=dims[-1],
            stride=2 if sizes[i] != sizes[-1] else 1, bn_decay=p.bn_decay)))
    plan.output_dim = f * len(plan.concat)
    plan.output_size = sizes[-1]
    plan.state_sizes = sizes
    return plan

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    plan = self.Plan(p)
    self._plan = plan
    self.CreateChild('base', plan.base)
    if plan.prev is not None:
      self.CreateChild('prev', plan.prev)
    self.CreateChildren('ops', plan.ops)
    self.CreateChildren('reductions', [r for _, r in plan.reductions])

  def DropPaths(self, x):
    """{op index: (mask, keep probability)} for the ops that apply drop-path, given the cell's input
    x: the masks each op's own DropPath would draw, drawn together (randomness.DropPathMasks: fewer
    ops). Empty if x's batch size is not static: each op then draws its own."""
    p = self.params
    users = [i for i, op in enumerate(self.ops) if op.drops_path]
    batch = tf.compat.dimension_value(x.shape[0])
    if not users or batch is None:
      return {}
    keep = randomness.ScheduledKeepProb(p.drop_path_keep_prob, p.cell_index, p.num_cells,
                                        p.drop_path_steps)
    masks = randomness.DropPathMasks(batch, x.shape.rank, x.dtype, keep,
                                     [randomness.Site(self.ops[i]) for i in users],
                                     where='Cell %r' % p.name)
    return {i: (mask, keep) for i, mask in zip(users, masks)}

  def FProp(self, theta, x, prev=None, aux=None):
    p = self.params
    plan = self._plan
    _, indices, _ = GENOTYPES[p.genotype]['reduction' if p.reduction else 'normal']
    with tf.name_scope(p.name):
      if prev is None:
        if p.prev_dim is not None:
          raise ValueError('Cell %r expects a previous state of %d channels, got None' %
                           (p.name, p.prev_dim))
        prev = x
      elif plan.prev is not None:
        prev = self.prev.FProp(theta.prev, prev)
      drop_paths = self.DropPaths(x)
      states = [self.base.FProp(theta.base, x), prev]
      for step in range(5):
        left, right = 2 * step, 2 * step + 1
        h_left = self.ops[left].FProp(theta.ops[left], states[indices[left]],
                                      drop_paths.get(left))
        h_right = self.ops[right].FProp(theta.ops[right], states[indices[right]],
                                        drop_paths.get(right))
        states.append(h_left + h_right)
      for j, (i, _) in enumerate(plan.reductions):
        states[i] = self.reductions[j].FProp(theta.reductions[j], states[i])
      out = tf.concat([states[i] for i in plan.concat], axis=3)
      return out, x, aux

  @classmethod
  def FPropMeta(cls, p, x, prev=None, aux=None):
    plan = cls.Plan(p)
    b = x[0]
    _, indices, _ = GENOTYPES[p.genotype]['reduction' if p.reduction else 'normal']
    flops, _ = cost_model.ChainFlops([plan.base], [x])
    if plan.prev is not None:
      flops += plan.prev.cls.FPropMeta(plan.prev, prev).flops
    for op_p, index in zip(plan.ops, indices):
      flops += CellOp.FPropMeta(op_p, _Shape(b, plan.state_sizes[index], op_p.input_dim)).flops
    for i, r in plan.reductions:
      flops += FactorizedReduction.FPropMeta(r, _Shape(b, plan.state_sizes[i], r.input_dim)).flops
    out = _Shape(b, plan.output_size, plan.output_dim)
    return py_utils.NestedMap(flops=flops, out_shapes=(out, x, aux))


class AmoebaNetStem(base_layer.BaseLayer):
  """images [B, H, W, 3] -> (3x3 VALID convolution + batch norm, None, None)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 3, 'Image channels.')
    p.Define('filters', 32, 'Output channels.')
    p.Define('stride', 2, 'Stride of the convolution (1 for small images).')
    p.Define('bn_decay', 0.9997, 'Batch-norm moving-average decay per mini-batch.')
    return p

  @classmethod
  def _ConvParams(cls, p):
    return _Conv('conv', 3, 3, p.input_dim, p.filters, (p.stride, p.stride), relu_first=False,
                 padding='VALID', bn_decay=p.bn_decay)

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('conv', self._ConvParams(self.params))

  def FProp(self, theta, images):
    with tf.name_scope(self.params.name):
      return self.conv.FProp(theta.conv, images), None, None

  @classmethod
  def FPropMeta(cls, p, images):
    conv = cls._ConvParams(p)
    meta = conv.cls.FPropMeta(conv, images)
    return py_utils.NestedMap(flops=meta.flops, out_shapes=(meta.out_shapes[0], None, None))


def AuxPool(size):
  """(window, stride) of the auxiliary head's average pooling: 5x5 / 3, smaller for tiny maps."""
  return min(5, size), 3


class AuxHead(base_layer.BaseLayer):
  """(x, prev, aux) -> (x, prev, auxiliary logits); identity in evaluation.

  relu, 5x5/3 average pooling, 1x1 convolution, a convolution spanning the pooled map, relu, linear.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Channels of x.')
    p.Define('input_size', (0, 0), '(height, width) of x.')
    p.Define('num_classes', 1000, 'Number of classes.')
    p.Define('proj_dim', 128, 'Channels of the 1x1 projection.')
    p.Define('hidden_dim', 768, 'Channels of the full-map convolution.')
    p.Define('bn_decay', 0.9997, 'Batch-norm moving-average decay per mini-batch.')
    return p

  @classmethod
  def _Plan(cls, p):
    (wh, sh), (ww, sw) = AuxPool(p.input_size[0]), AuxPool(p.input_size[1])
    ph, pw = (p.input_size[0] - wh) // sh + 1, (p.input_size[1] - ww) // sw + 1
    return [_Conv('proj', 1, 1, p.input_dim, p.proj_dim, relu_first=False, relu_last=True,
                  bn_decay=p.bn_decay),
            _Conv('conv', ph, pw, p.proj_dim, p.hidden_dim, relu_first=False, relu_last=True,
                  padding='VALID', bn_decay=p.bn_decay)], (wh, ww), (sh, sw)

  def __init__(self, params):
    super().__init__(params)
    convs, self._window, self._stride = self._Plan(self.params)
    self.CreateChildren('convs', convs)

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.hidden_dim, p.num_classes],
        py_utils.WeightInit.Gaussian(float(np.sqrt(1.0 / p.hidden_dim)))))
    self.CreateVariable('b', py_utils.WeightParams([p.num_classes],
                                                   py_utils.WeightInit.Constant(0.0)))

  def FProp(self, theta, x, prev=None, aux=None):
    if self.do_eval:
      return x, prev, aux
    with tf.name_scope(self.params.name):
      h = tf.nn.avg_pool2d(tf.nn.relu(x), self._window, self._stride, 'VALID')
      for conv, conv_theta in zip(self.convs, theta.convs):
        h = conv.FProp(conv_theta, h)
      h = tf.reshape(h, [-1, self.params.hidden_dim])
      return x, prev, tf.matmul(h, tf.cast(theta.w, h.dtype)) + tf.cast(theta.b, h.dtype)

  @classmethod
  def FPropMeta(cls, p, x, prev=None, aux=None):
    convs, window, stride = cls._Plan(p)
    b = x[0]
    pooled = _Shape(b, ((x[1] - window[0]) // stride[0] + 1, (x[2] - window[1]) // stride[1] + 1),
                    x[3])
    flops, _ = cost_model.ChainFlops(convs, [pooled])
    flops += 2 * b * p.hidden_dim * p.num_classes
    return py_utils.NestedMap(flops=flops, out_shapes=(x, prev, tshape.Shape([b, p.num_classes])))


class Classifier(conv_layers.PooledClassifier):
  """(x, prev, aux) -> (logits, aux): relu, global average pool, dropout, fully connected."""

  @classmethod
  def Params(cls):
    return super().Params().Set(relu_first=True)

  def FProp(self, theta, x, prev=None, aux=None):
    return self.Logits(theta, x), aux

  @classmethod
  def FPropMeta(cls, p, x, prev=None, aux=None):
    meta = super().FPropMeta(p, x)
    return py_utils.NestedMap(flops=meta.flops, out_shapes=(meta.out_shapes[0], aux))


def ReductionIndices(num_cells, num_reductions=2):
  """Normal-cell indices before which a reduction cell goes (as in the AmoebaNet reference)."""
  return [int(float(i) / (num_reductions + 1) * num_cells) for i in range(1, num_reductions + 1)]


def AmoebaNetLayers(genotype='D', num_cells=18, filters=256, num_classes=1000, image_size=224,
                    image_channels=3, stem_filters=32, stem_stride=2, num_stem_cells=2,
                    aux_head=True, aux_scaling=1.0, drop_path_keep_prob=1.0, drop_path_steps=0,
                    dropout_keep_prob=1.0, bn_decay=0.9997):
  """The flat layer sequence of AmoebaNet-`genotype` (L = num_cells, F = filters).

  Returns a list of layer Params: 'stem', 'stem_cell_<i>', 'cell_<i>' / 'reduction_cell_<i>',
  'aux_head' (if aux_head), 'classifier'. Small images: stem_stride=1 and num_stem_cells=0.
  bn_decay: batch-norm moving-average decay per mini-batch (0.9997 for ImageNet; lower for short
    runs).
  """
  if genotype not in GENOTYPES:
    raise ValueError('AmoebaNet genotype must be one of %s, got %r' % (sorted(GENOTYPES), genotype))
  if num_cells < 3 or num_cells % 3:
    raise ValueError('AmoebaNet num_cells (L) must be a positive multiple of 3, got %r' % num_cells)
  if filters < 4 or filters % 4:
    raise ValueError('AmoebaNet filters (F) must be a positive multiple of 4, got %r' % filters)
  reductions = ReductionIndices(num_cells)
  total_cells = num_cells + len(reductions) + num_stem_cells
  size = conv_layers.OutSize(image_size, 3, stem_stride, 'VALID')
  if size < 1:
    raise ValueError('AmoebaNet: image_size %d is too small for the stem' % image_size)
  layers = [AmoebaNetStem.Params().Set(name='stem', input_dim=image_channels,
                                       filters=stem_filters, stride=stem_stride,
                                       bn_decay=bn_decay)]
  state = dict(dim=stem_filters, size=(size, size), prev_dim=None, prev_size=None)
  cell_index = [0]

  def AddCell(name, reduction, cell_filters):
    p = Cell.Params().Set(
        name=name, genotype=genotype, reduction=reduction, filters=cell_filters,
        input_dim=state['dim'], input_size=state['size'], prev_dim=state['prev_dim'],
        prev_reduce=state['prev_size'] is not None and state['prev_size'] != state['size'],
        drop_path_keep_prob=drop_path_keep_prob, cell_index=cell_index[0],
        num_cells=total_cells, drop_path_steps=drop_path_steps, bn_decay=bn_decay)
    plan = Cell.Plan(p)
    state.update(prev_dim=state['dim'], prev_size=state['size'], dim=plan.output_dim,
                 size=plan.output_size)
    cell_index[0] += 1
    layers.append(p)

  scaling = 1.0 / 2**num_stem_cells
  for i in range(num_stem_cells):
    AddCell('stem_cell_%d' % i, True, int(filters * scaling))
    scaling *= 2
  scaling = 1.0
  for i in range(num_cells):
    if i in reductions:
      scaling *= 2
      AddCell('reduction_cell_%d' % reductions.index(i), True, int(filters * scaling))
    AddCell('cell_%d' % i, False, int(filters * scaling))
    if aux_head and len(reductions) >= 2 and i == reductions[1] - 1:
      layers.append(AuxHead.Params().Set(
          name='aux_head', input_dim=state['dim'], input_size=state['size'],
          num_classes=num_classes, proj_dim=int(128 * aux_scaling),
          hidden_dim=int(768 * aux_scaling), bn_decay=bn_decay))
  layers.append(Classifier.Params().Set(name='classifier', input_dim=state['dim'],
                                        num_classes=num_classes,
                                        dropout_keep_prob=dropout_keep_prob))
  return layers
