"""TensorPipeLayer: gradients equal the plain model's for every K, M and re-computation mode."""

import itertools
import re
from unittest import mock

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import layers as lingvo_layers
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import check_failure
from tensorpipe import layer as layer_lib
from tensorpipe import micro_batching as micro_batching_lib
from tensorpipe import randomness
from tensorpipe import shared_layer
from tests import layer_helpers

BATCH = 16
DIM = 8
NUM_LAYERS = 5  # Every K in 2..4 gives uneven partitions (2/3, 1/2/2, 1/1/1/2).


def _Inputs():
  x = np.random.RandomState(0).uniform(-1, 1, size=[BATCH, DIM]).astype(np.float32)
  return (tf.constant(x),)


def _NestedInputs():
  rng = np.random.RandomState(1)
  paddings = (rng.uniform(size=[BATCH, 1]) > 0.7).astype(np.float32)
  return (py_utils.NestedMap(
      vec=tf.constant(rng.uniform(-1, 1, size=[BATCH, DIM]).astype(np.float32)),
      paddings=tf.constant(paddings),
      ids=tf.constant(np.arange(BATCH, dtype=np.int32)),
      extra=None),)


def _NestedLoss(out):
  return tf.reduce_mean(out.vec) + 0.0 * tf.cast(tf.reduce_sum(out.ids), tf.float32)


class PaperConsistencyTest(test_utils.TestCase):
  """The supplementary's Figure 1 test: 16 (3, 3, 1, 1) convolutions, 8 micro-batches."""

  def _ConvLayers(self):
    return [lingvo_layers.Conv2DLayerNoPadding.Params().Set(
        name='conv%d' % i, filter_shape=(3, 3, 1, 1), filter_stride=(1, 1),
        params_init=py_utils.WeightInit.Gaussian(0.5, seed=i)) for i in range(16)]

  def _Inputs(self):
    x = np.random.RandomState(12345).uniform(size=[16, 8, 8, 1]).astype(np.float32)
    return (tf.constant(x),)

  @pytest.mark.slow
  def testGradientNormIdenticalFor1To4PartitionsAndPlain(self):
    ks = (1, 2, 4)
    results = layer_helpers.GradientsOfVariants(
        [('plain', layer_helpers.Plain(self._ConvLayers(), name='plain'))] +
        [('pipe%d' % k, layer_helpers.Pipeline(self._ConvLayers(), k, 8, name='pipe%d' % k))
         for k in ks], self._Inputs, grappler=True)
    reference, _ = results['plain']
    ref_norm = np.sqrt(sum(np.sum(g**2) for g in reference.values()))
    self.assertGreater(ref_norm, 0.0)
    for k in ks:
      grads, _ = results['pipe%d' % k]
      norm = np.sqrt(sum(np.sum(g**2) for g in grads.values()))
      self.assertAllClose(norm, ref_norm, rtol=1e-6, atol=0, msg='K=%d' % k)
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6, 'K=%d' % k)


class GradientConsistencyTest(test_utils.TestCase):
  """Every variable's gradient equals the plain model's for K x M x recompute x input kind."""

  def _Check(self, inputs_fn, layer_cls, loss_fn, ks, ms):
    variants = [('plain', layer_helpers.Plain(layer_helpers.DenseLayers(NUM_LAYERS, DIM, layer_cls), 'plain'))]
    for k, m, mode in itertools.product(ks, ms, layer_lib.RECOMPUTE_MODES):
      variants.append(('K%d_M%d_%s' % (k, m, mode), layer_helpers.Pipeline(
          layer_helpers.DenseLayers(NUM_LAYERS, DIM, layer_cls), k, m, mode,
          name='K%d_M%d_%s' % (k, m, mode))))
    results = layer_helpers.GradientsOfVariants(variants, inputs_fn, loss_fn)
    reference, ref_loss = results.pop('plain')
    self.assertLen(results, len(ks) * len(ms) * len(layer_lib.RECOMPUTE_MODES))
    for name, (grads, loss) in sorted(results.items()):
      self.assertAllClose(loss, ref_loss, rtol=1e-6, atol=0, msg=name)
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6, name)

  @pytest.mark.slow
  def testTensorInputs(self):
    # Every K of 1-4 over 5 layers (uneven partitions), M from one micro-batch of 16 examples to
    # 16 of one, each recompute mode.
    self._Check(_Inputs, layer_helpers.Dense, None, ks=(1, 2, 3, 4), ms=(1, 4, 16))

  @pytest.mark.slow
  def testNestedMapInputs(self):
    # The structure is what differs from tensor inputs: a smaller grid.
    self._Check(_NestedInputs, layer_helpers.MaskedDense, _NestedLoss, ks=(1, 3), ms=(1, 4))

  def testWithoutForwardOverlap(self):
    variants = [('plain', layer_helpers.Plain(layer_helpers.DenseLayers(NUM_LAYERS, DIM), 'plain'))]
    for k, m in ((2, 4), (3, 8), (4, 16)):
      variants.append(('K%d_M%d' % (k, m), layer_helpers.Pipeline(
          layer_helpers.DenseLayers(NUM_LAYERS, DIM), k, m, forward_overlap=False,
          name='K%d_M%d' % (k, m))))
    results = layer_helpers.GradientsOfVariants(variants, _Inputs)
    reference, _ = results.pop('plain')
    self.assertLen(results, 3)
    for name, (grads, _) in sorted(results.items()):
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6, name)


class UnevenMicroBatchesTest(test_utils.TestCase):
  """M that does not divide the batch: micro-batches differ by one example, gradients stay exact."""

  @pytest.mark.slow
  def testEverySchedulePartitioningAndBatchKind(self):
    x = np.random.RandomState(6).uniform(-1, 1, size=[BATCH - 3, DIM]).astype(np.float32)

    def Inputs(dynamic):
      # A batch of 13 examples: M = 3 gives 5 + 4 + 4, M = 5 gives 3 + 3 + 3 + 2 + 2.
      return lambda: (tf.placeholder_with_default(x, [None, DIM]) if dynamic else tf.constant(x),)

    for dynamic in (False, True):
      variants = [('plain', layer_helpers.Plain(layer_helpers.DenseLayers(NUM_LAYERS, DIM), 'plain'))]
      for k, m, sched in ((1, 5, 'gpipe'), (2, 3, 'gpipe'), (3, 5, 'gpipe'), (2, 5, '1f1b'),
                          (3, 3, '1f1b'), (2, 3, 'zero_bubble'), (3, 5, 'zero_bubble')):
        if dynamic and sched != 'gpipe':
          continue  # Run-time shapes with the other schedules: see executor_test.
        name = 'K%d_M%d_%s' % (k, m, sched)
        variants.append((name, layer_helpers.Pipeline(layer_helpers.DenseLayers(NUM_LAYERS, DIM), k, m,
                                                schedule=sched, name=name)))
      results = layer_helpers.GradientsOfVariants(variants, Inputs(dynamic))
      reference, loss = results.pop('plain')
      for name, (grads, pipe_loss) in sorted(results.items()):
        self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6, (name, dynamic))
        self.assertAllClose(pipe_loss, loss, rtol=1e-6)

  def testMicroBatchSizeThatDoesNotDivide(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 1, micro_batch_size=5).Instantiate()
      self.assertEqual(net.Schedule(BATCH).num_micro_batches, 4)  # 4 + 4 + 4 + 4 examples.


class JoinDense(layer_helpers.Dense):
  """tanh(x w) plus every skip connection it is given (extra FProp arguments)."""

  def FProp(self, theta, x, *skips):
    return tf.tanh(tf.matmul(x, theta.w)) + tf.add_n(list(skips)) if skips else tf.tanh(
        tf.matmul(x, theta.w))


# l0 -> l1 -> l2 -> l3 -> l4 -> l5, with l0's output also into l3, l2's into l3, l1's into l5.
_SKIPS = [('l0', 'l3'), ('l2', 'l3'), ('l1', 'l5')]


def _SkipLayers():
  return [JoinDense.Params().Set(name='l%d' % i, dim=DIM, seed=300 + i) for i in range(6)]


class SkipNet(base_layer.BaseLayer):
  """The same network as a pipeline of _SkipLayers with _SKIPS, written out by hand."""

  def __init__(self, params):
    super().__init__(params)
    for layer_params in _SkipLayers():
      self.CreateChild(layer_params.name, layer_params)

  def FProp(self, theta, x):
    outs = []
    for i in range(6):
      skips = [outs[int(src[1])] for src, dst in _SKIPS if dst == 'l%d' % i]
      x = self.children['l%d' % i].FProp(theta['l%d' % i], x, *skips)
      outs.append(x)
    return x


class SkipConnectionsTest(test_utils.TestCase):
  """Declared skip connections: the gradients of a hand-written network for every K, schedule and
  M (dividing the batch or not), and a clear error for an undeclared shortcut."""

  @pytest.mark.slow
  def testGradientsEqualTheHandWrittenNetwork(self):
    variants = [('plain', SkipNet.Params().Set(name='plain'))]
    for k in (1, 2, 3):
      for sched in ('gpipe', '1f1b', 'zero_bubble'):
        for m in (4, 3):
          name = 'K%d_M%d_%s' % (k, m, sched)
          variants.append((name, layer_lib.TensorPipeLayer.Params().Set(
              name=name, partitions=_Partition(_SkipLayers(), k), num_micro_batches=m,
              schedule=sched, skip_connections=_SKIPS)))
    variants.append(('unpipelined', layer_lib.TensorPipeLayer.Params().Set(
        name='unpipelined', partitions=_Partition(_SkipLayers(), 3), skip_connections=_SKIPS,
        unpipelined=True)))
    results = layer_helpers.GradientsOfVariants(variants, _Inputs)
    plain, plain_loss = results.pop('plain')
    self.assertLen(results, 19)
    for name, (grads, loss) in sorted(results.items()):
      self.assertLess(layer_helpers.MaxRelativeError(grads, plain), 1e-5, name)
      self.assertAllClose(loss, plain_loss, rtol=1e-6)

  def testUndeclaredShortcutIsRefusedNamingTheLayers(self):
    saved = {}

    class Saver(layer_helpers.Dense):

      def FProp(self, theta, x):
        saved['y'] = tf.tanh(tf.matmul(x, theta.w))
        return saved['y']

    class User(layer_helpers.Dense):

      def FProp(self, theta, x):
        return tf.tanh(tf.matmul(x, theta.w)) + saved['y']

    layers = [Saver.Params().Set(name='save', dim=DIM), layer_helpers.Dense.Params().Set(name='mid'),
              User.Params().Set(name='use', dim=DIM)]
    for k, place in ((1, 'this partition'),
                     (3, r"another partition's function \(pipe_partition0_forward\)")):
      with tf.Graph().as_default(), layer_helpers.Cluster(3):
        net = layer_helpers.Pipeline(layers, k, 2).Instantiate()
        with self.assertRaisesRegex(ValueError, r"layer 'use' .* uses tensor .* which layer 'save' "
                                    r"computed in %s, but not through its inputs.*"
                                    r"skip_connections=\[\('save', 'use'\)\]" % place):
          net.FPropDefaultTheta(*_Inputs())


def _Partition(layers, k):
  """`layers` cut into k partitions as evenly as possible (explicitly, so tests know the cut)."""
  sizes = micro_batching_lib.Sizes(len(layers), k)
  starts = micro_batching_lib.Offsets(sizes)
  return [layers[start:start + size] for start, size in zip(starts, sizes)]


class BehaviourTest(test_utils.TestCase):

  def testNestedMapFieldsPassThrough(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(4, DIM, layer_helpers.MaskedDense), 2, 4).Instantiate()
      inputs = _NestedInputs()[0]
      out = net.FPropDefaultTheta(inputs)
      self.assertIsNone(out.extra)
      self.assertEqual(out.vec.shape.as_list(), [BATCH, DIM])
      with layer_helpers.Session(tf.get_default_graph(), 2) as sess:
        sess.run(tf.global_variables_initializer())
        ids, paddings, expected_paddings = sess.run([out.ids, out.paddings, inputs.paddings])
      self.assertAllEqual(ids, np.arange(BATCH))
      self.assertAllEqual(paddings, expected_paddings)

  def testTupleInputsAndOutputs(self):

    class Pair(layer_helpers.Dense):

      def FProp(self, theta, x, y):
        return tf.tanh(tf.matmul(x, theta.w)), y * 2.0

    layers = [Pair.Params().Set(name='p%d' % i, dim=DIM, seed=i) for i in range(3)]
    with tf.Graph().as_default(), layer_helpers.Cluster(3):
      net = layer_helpers.Pipeline(layers, 3, 2).Instantiate()
      x, y = tf.ones([4, DIM]), tf.ones([4, 3])
      out_x, out_y = net.FPropDefaultTheta(x, y)
      with layer_helpers.Session(tf.get_default_graph(), 3) as sess:
        sess.run(tf.global_variables_initializer())
        self.assertAllClose(sess.run(out_y), 8.0 * np.ones([4, 3]))
        self.assertEqual(sess.run(out_x).shape, (4, DIM))

  def testMicroBatchSizeParam(self):
    reference, _ = layer_helpers.Gradients(layer_helpers.Plain(layer_helpers.DenseLayers(4)), _Inputs)
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 1).Set(micro_batch_size=4)
    grads, _ = layer_helpers.Gradients(params, _Inputs)
    self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6)
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      self.assertEqual(params.Instantiate().Schedule(BATCH).num_micro_batches, 4)

  def testBatchDimOne(self):
    x = np.random.RandomState(3).uniform(size=[3, BATCH, DIM]).astype(np.float32)
    def Inputs():
      return (tf.constant(x),)
    reference, _ = layer_helpers.Gradients(layer_helpers.Plain(layer_helpers.DenseLayers(4)), Inputs)
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 4).Set(batch_dim=1)
    grads, _ = layer_helpers.Gradients(params, Inputs)
    self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6)

  def testExplicitPartitionsAndCostBalancedSplit(self):
    layers = layer_helpers.DenseLayers(5)
    explicit = layer_lib.TensorPipeLayer.Params().Set(
        name='pipe', partitions=[layers[:1], layers[1:4], layers[4:]], num_micro_batches=4)
    reference, _ = layer_helpers.Gradients(layer_helpers.Plain(layer_helpers.DenseLayers(5)), _Inputs)
    grads, _ = layer_helpers.Gradients(explicit, _Inputs)
    self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6)
    wide = [layer_helpers.Dense.Params().Set(name='a', dim=DIM),
            layer_helpers.Dense.Params().Set(name='b', dim=DIM)]
    with tf.Graph().as_default(), layer_helpers.Cluster(3):
      net = explicit.Instantiate()
      self.assertEqual(net.partition_layer_names,
                       [['layer0'], ['layer1', 'layer2', 'layer3'], ['layer4']])
      balanced = layer_helpers.Pipeline(wide + layer_helpers.DenseLayers(2), 2, 1,
                                  cost_input_shapes=[[BATCH, DIM]], name='b').Instantiate()
      self.assertEqual(balanced.partition_layer_names, [['a', 'b'], ['layer0', 'layer1']])

  def testVariableNamesDoNotDependOnPartitioning(self):
    names = []
    for k in (1, 2, 4):
      with tf.Graph().as_default(), layer_helpers.Cluster(4):
        layer_helpers.Pipeline(layer_helpers.DenseLayers(4), k, 2).Instantiate()
        names.append(sorted(v.op.name for v in tf.global_variables()))
    self.assertEqual(names[0], names[1])
    self.assertEqual(names[0], names[2])
    self.assertIn('pipe/layer3/w/var', names[0])

  def testCheckpointFromOnePartitioningLoadsIntoAnother(self):
    ckpt = self.create_tempdir().full_path + '/model'
    with tf.Graph().as_default() as g, layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 2).Instantiate()
      out = net.FPropDefaultTheta(*_Inputs())
      with layer_helpers.Session(g, 2) as sess:
        sess.run(tf.global_variables_initializer())
        expected = sess.run(out)
        tf.train.Saver().save(sess, ckpt)
    with tf.Graph().as_default() as g, layer_helpers.Cluster(4):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 4, 4).Instantiate()
      out = net.FPropDefaultTheta(*_Inputs())
      with layer_helpers.Session(g, 4) as sess:
        tf.train.Saver().restore(sess, ckpt)
        self.assertAllClose(sess.run(out), expected, rtol=1e-6, atol=1e-7)

  def testDynamicBatchIsCheckedWhenRun(self):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(2), 2, 4).Instantiate()
      x = tf.placeholder(tf.float32, [None, DIM])
      out = net.FPropDefaultTheta(x)
      with layer_helpers.Session(g, 2) as sess:
        sess.run(tf.global_variables_initializer())
        self.assertEqual(sess.run(out, {x: np.ones([8, DIM])}).shape, (8, DIM))
        self.assertEqual(sess.run(out, {x: np.ones([6, DIM])}).shape, (6, DIM))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    'this batch has 3 examples along batch_dim=0, fewer than its '
                                    'num_micro_batches=4'):
          sess.run(out, {x: np.ones([3, DIM])})
        # Through check_failure.Run the check's line is the whole message.
        with self.assertRaises(check_failure.CheckFailure) as failure:
          check_failure.Run(sess, out, {x: np.ones([3, DIM])})
        self.assertEqual(
            str(failure.exception),
            "TensorPipeLayer 'pipe': this batch has 3 examples along batch_dim=0, fewer than its "
            'num_micro_batches=4 (each micro-batch needs one): feed batches of at least 4 examples '
            'or lower num_micro_batches')

  def testFPropMetaSumsLayers(self):
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(3), 3, 1)
    meta = params.cls.FPropMeta(params, py_utils.tshape.Shape([BATCH, DIM]))
    self.assertEqual(meta.flops, 3 * 2 * BATCH * DIM * DIM)
    self.assertEqual(meta.out_shapes[0].ToTensorShape().as_list(), [BATCH, DIM])


class _DropoutDense(layer_helpers.Dense):
  """tanh(x w), then dropout (keep 0.5) whose examples are along `batch_dim` of x ([..., dim])."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('batch_dim', 0, 'The batch axis of x.')
    return p

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      h = tf.tanh(tf.einsum('...i,ij->...j', x, theta.w))
      return randomness.Dropout(h, 0.5, randomness.Site(self), batch_dim=self.params.batch_dim)


def _DropoutLayers(num_layers, batch_dim=0):
  return [_DropoutDense.Params().Set(name='drop%d' % i, dim=DIM, seed=200 + i,
                                     batch_dim=batch_dim)
          for i in range(num_layers)]


class DropoutTest(test_utils.TestCase):
  """Each partition uses its micro-batch's example offset: dropout masks do not depend on K, M."""

  def testTimeMajorGradientsEqualPlain(self):
    x = np.random.RandomState(4).uniform(-1, 1, size=[3, BATCH, DIM]).astype(np.float32)
    inputs = lambda: (tf.constant(x),)
    reference, _ = layer_helpers.Gradients(layer_helpers.Plain(_DropoutLayers(4, batch_dim=1)), inputs)
    for k, m in ((2, 4), (4, 2)):
      params = layer_helpers.Pipeline(_DropoutLayers(4, batch_dim=1), k, m).Set(batch_dim=1)
      grads, _ = layer_helpers.Gradients(params, inputs)
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6, 'K=%d M=%d' % (k, m))

  def testDynamicBatchSizeGivesThePlainOutputs(self):
    x = np.random.RandomState(5).uniform(-1, 1, size=[BATCH, DIM]).astype(np.float32)

    def Forward(params, batch_dim_size):
      with tf.Graph().as_default() as g, layer_helpers.Cluster(2):
        net = params.Instantiate()
        placeholder = tf.placeholder(tf.float32, [batch_dim_size, DIM])
        out = net.FPropDefaultTheta(placeholder)
        with layer_helpers.Session(g, 2) as sess:
          sess.run(tf.global_variables_initializer())
          return sess.run(out, {placeholder: x})

    expected = Forward(layer_helpers.Plain(_DropoutLayers(3)), BATCH)
    out = Forward(layer_helpers.Pipeline(_DropoutLayers(3), 2, 4), None)
    self.assertGreater(np.mean(out == 0), 0.25)
    self.assertAllClose(out, expected, rtol=1e-6, atol=1e-7)


  def testEvalInTheTrainingGraphDropsNothing(self):
    """Partition functions are traced again for evaluation, where layers compute differently."""

    class EvalAware(_DropoutDense):

      def FProp(self, theta, x):
        if self.do_eval:
          return tf.tanh(tf.matmul(x, theta.w))
        return super().FProp(theta, x)

    layers = [EvalAware.Params().Set(name='drop%d' % i, dim=DIM, seed=200 + i) for i in range(3)]
    x = np.random.RandomState(6).uniform(-1, 1, size=[BATCH, DIM]).astype(np.float32)
    with tf.Graph().as_default() as g, layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layers, 2, 4).Instantiate()
      train_out = net.FPropDefaultTheta(tf.constant(x))
      with cluster_factory.SetEval(True):
        eval_out = net.FPropDefaultTheta(tf.constant(x))
      w = [net.theta['drop%d' % i].w for i in range(3)]
      with layer_helpers.Session(g, 2) as sess:
        sess.run(tf.global_variables_initializer())
        train_value, eval_value, weights = sess.run([train_out, eval_out, w])
    expected = x
    for weight in weights:
      expected = np.tanh(expected @ weight)
    self.assertAllClose(eval_value, expected, rtol=1e-5, atol=1e-6)
    self.assertGreater(np.mean(train_value == 0), 0.25)


class _Xent(base_layer.BaseLayer):
  """Per-example softmax cross-entropy of x [B, D] against labels [B] (Lingvo's softmax): a loss
  layer for the schedules that run a micro-batch's backward pass before later forward passes."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', DIM, 'Input and class count.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('softmax', lingvo_layers.SimpleFullSoftmax.Params().Set(
        input_dim=p.dim, num_classes=p.dim, params_init=py_utils.WeightInit.Gaussian(0.5, 400)))

  def FProp(self, theta, x, labels):
    return self.softmax.FProp(theta.softmax, x, class_weights=tf.ones_like(labels, tf.float32),
                              class_ids=labels).per_example_xent


def _StockLayers():
  """Nine stock Lingvo layers: at least one for each of 4 x 2 partitions."""
  out = []
  for i in range(9):
    init = py_utils.WeightInit.Gaussian(0.5, seed=500 + i)
    if i in (2, 6):
      out.append(lingvo_layers.LayerNorm.Params().Set(name='l%d' % i, input_dim=DIM))
    else:
      out.append(lingvo_layers.FCLayer.Params().Set(
          name='l%d' % i, input_dim=DIM, output_dim=DIM, params_init=init,
          activation='TANH' if i % 2 else 'NONE'))
  return out


class _StockNet(base_layer.BaseLayer):
  """_StockLayers then _Xent, written out by hand: the plain model."""

  def __init__(self, params):
    super().__init__(params)
    for layer_params in _StockLayers() + [_Xent.Params().Set(name='loss')]:
      self.CreateChild(layer_params.name, layer_params)

  def FProp(self, theta, x, labels):
    for i in range(9):
      x = self.children['l%d' % i].FProp(theta['l%d' % i], x)
    return self.loss.FProp(theta.loss, x, labels)


def _LabelledInputs():
  rng = np.random.RandomState(9)
  return (tf.constant(rng.uniform(-1, 1, size=[BATCH, DIM]).astype(np.float32)),
          tf.constant(rng.randint(0, DIM, size=[BATCH]).astype(np.int32)))


class VirtualStagesTest(test_utils.TestCase):
  """K devices holding v partitions each ('interleaved_1f1b', 'zbv'): the gradients of 'gpipe' and
  of the plain model, the same variables whatever K and v, each partition on its device, and clear
  errors for what cannot run."""

  def _CheckGradients(self, k):
    variants = [('plain', _StockNet.Params().Set(name='plain'))]
    for m in (4, 8):
      for sched, v in (('gpipe', 1), ('1f1b', 1), ('interleaved_1f1b', 2), ('zbv', 2)):
        name = '%s_v%d_M%d' % (sched, v, m)
        variants.append((name, layer_lib.TensorPipeLayer.Params().Set(
            name=name, layers=_StockLayers(), loss_layer=_Xent.Params().Set(name='loss'),
            num_devices=k, virtual_stages=v, num_micro_batches=m, schedule=sched)))
    results = layer_helpers.GradientsOfVariants(variants, _LabelledInputs, num_devices=k)
    plain, plain_loss = results.pop('plain')
    self.assertLen(results, 8)
    for name, (grads, loss) in sorted(results.items()):
      # The same variable names (MaxRelativeError asserts it): checkpoints load across K and v.
      self.assertLess(layer_helpers.MaxRelativeError(grads, plain), 1e-5, (k, name))
      self.assertAllClose(loss, plain_loss, rtol=1e-6)

  @pytest.mark.slow
  def testGradientsEqualGPipeAndThePlainModelOnTwoDevices(self):
    self._CheckGradients(2)

  @pytest.mark.slow
  def testGradientsEqualGPipeAndThePlainModelOnFourDevices(self):
    self._CheckGradients(4)

  def testDropoutMasksDoNotDependOnThePartitions(self):
    x = np.random.RandomState(4).uniform(-1, 1, size=[BATCH, DIM]).astype(np.float32)
    inputs = lambda: (tf.constant(x),)
    reference, _ = layer_helpers.Gradients(layer_helpers.Plain(_DropoutLayers(4)), inputs, num_devices=2)
    for sched, v in (('interleaved_1f1b', 2), ('zbv', 2)):
      params = layer_helpers.Pipeline(_DropoutLayers(4), 2, 4, schedule=sched, virtual_stages=v)
      grads, _ = layer_helpers.Gradients(params, inputs, num_devices=2)
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-6, sched)

  def testEachPartitionRunsOnItsDevice(self):
    for sched, expected in (('interleaved_1f1b', [0, 1, 0, 1, 0, 1]), ('zbv', [0, 1, 1, 0])):
      v = 3 if sched == 'interleaved_1f1b' else 2
      with tf.Graph().as_default(), layer_helpers.Cluster(2):
        net = layer_lib.TensorPipeLayer.Params().Set(
            name='pipe', layers=layer_helpers.DenseLayers(2 * v), num_devices=2, virtual_stages=v,
            num_micro_batches=2, schedule=sched).Instantiate()
        self.assertEqual(net.num_partitions, 2 * v)
        self.assertEqual(net.num_devices, 2)
        devices = ['/job:localhost/replica:0/task:0/device:CPU:%d' % d for d in expected]
        self.assertEqual(net.devices, devices)
        loss = tf.reduce_sum(net.FPropDefaultTheta(*_Inputs()))
        tf.gradients(loss, tf.trainable_variables())
        calls = [op for op in tf.get_default_graph().get_operations()
                 if op.type in ('PartitionedCall', 'StatefulPartitionedCall')]
        for c, device in enumerate(devices):
          mine = [op for op in calls if re.search(r'partition%d_mb' % c, op.name)]
          self.assertNotEmpty(mine, (sched, c))
          self.assertEqual({op.device for op in mine}, {device}, (sched, c))

  def testCombinationsThatCannotRunFailEarly(self):
    def Build(**kwargs):
      params = layer_lib.TensorPipeLayer.Params().Set(
          name='pipe', layers=layer_helpers.DenseLayers(8), num_devices=2, num_micro_batches=4)
      with tf.Graph().as_default(), layer_helpers.Cluster(2):
        params.Set(**kwargs).Instantiate()

    with self.assertRaisesRegex(ValueError, r"schedule='1f1b' runs one partition per device, but "
                                r"virtual_stages=2: use schedule='interleaved_1f1b'"):
      Build(schedule='1f1b', virtual_stages=2)
    with self.assertRaisesRegex(ValueError, r"'interleaved_1f1b' needs virtual_stages >= 2 .*use "
                                r"schedule='1f1b'"):
      Build(schedule='interleaved_1f1b')
    with self.assertRaisesRegex(ValueError, r"'zbv' places two partitions per device in a V: set "
                                r"virtual_stages=2, got 3"):
      Build(schedule='zbv', virtual_stages=3)
    with self.assertRaisesRegex(ValueError, r'M a multiple of num_devices K, got M=3, K=2: use M=2 '
                                r'or M=4'):
      Build(schedule='interleaved_1f1b', virtual_stages=2, num_micro_batches=3)
    with self.assertRaisesRegex(ValueError, r"'zbv'.* recompute='always'"):
      Build(schedule='zbv', virtual_stages=2, recompute='never')
    with self.assertRaisesRegex(ValueError, r'`partitions` lists 3 partitions, not a multiple of '
                                r'virtual_stages=2'):
      Build(layers=None, partitions=[[l] for l in layer_helpers.DenseLayers(3)],
            schedule='interleaved_1f1b', virtual_stages=2, num_devices=None)
    with self.assertRaisesRegex(ValueError, r'8 layers cannot fill 10 partitions'):
      Build(num_devices=5, schedule='interleaved_1f1b', virtual_stages=2, num_micro_batches=5)
    # M known only from the batch (16 examples, at most 6 a micro-batch: M = 3): in FProp.
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      net = layer_lib.TensorPipeLayer.Params().Set(
          name='pipe', layers=layer_helpers.DenseLayers(8), num_devices=2, micro_batch_size=6,
          schedule='interleaved_1f1b', virtual_stages=2).Instantiate()
      with self.assertRaisesRegex(ValueError, r"TensorPipeLayer 'pipe': interleaved 1F1B needs "
                                  r'num_micro_batches M a multiple of num_devices K, got M=3, K=2'):
        net.FPropDefaultTheta(*_Inputs())


class PipeliningTest(test_utils.TestCase):
  """Devices can overlap on different micro-batches: partition 0's F(0, t + 1) and partition 1's
  F(1, t) are on different devices and neither depends on the other, so the executor is free to run
  them at once. Checked on the graph's dependency structure, not on observed timestamps."""

  def testDevicesOverlap(self):
    k, m = 2, 4
    with tf.Graph().as_default() as g, layer_helpers.Cluster(k):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(8, dim=16), k, m).Instantiate()
      out = net.FPropDefaultTheta(tf.random.uniform([8 * m, 16]))
      loss = tf.reduce_mean(out * out)
      tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
    forward = {}
    for op in g.get_operations():
      match = re.search(r'partition(\d+)_mb(\d+)/forward$', op.name)
      if match:
        forward[(int(match.group(1)), int(match.group(2)))] = op
    self.assertLen(forward, k * m)
    for t in range(m - 1):
      a, b = forward[(0, t + 1)], forward[(1, t)]
      self.assertNotEqual(a.device, b.device)
      self.assertNotIn(a, _Ancestors(b), 'F(1, %d) waits for F(0, %d)' % (t, t + 1))
      self.assertNotIn(b, _Ancestors(a), 'F(0, %d) waits for F(1, %d)' % (t + 1, t))
      # The pipeline does order what it must: F(1, t) needs F(0, t).
      self.assertIn(forward[(0, t)], _Ancestors(b))


def _Ancestors(op):
  """Every op `op` waits for, through data and control inputs."""
  seen, todo = set(), [op]
  while todo:
    current = todo.pop()
    for before in list(current.control_inputs) + [x.op for x in current.inputs]:
      if before not in seen:
        seen.add(before)
        todo.append(before)
  return seen


class BadInputTest(test_utils.TestCase):
  """Each bad input raises a ValueError naming the offending values while the graph is built."""

  def _Build(self, params, inputs, num_devices=4):
    with tf.Graph().as_default(), layer_helpers.Cluster(num_devices):
      return params.Instantiate().FPropDefaultTheta(*inputs())

  def testMicroBatchesOutOfRange(self):
    with self.assertRaisesRegex(ValueError, 'num_micro_batches must be an integer >= 1, got 0'):
      self._Build(layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 0), _Inputs)
    with self.assertRaisesRegex(ValueError, 'num_micro_batches 32 is larger than the batch 16'):
      self._Build(layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 32), _Inputs)

  def testMorePartitionsThanLayers(self):
    with self.assertRaisesRegex(ValueError, '3 layers cannot fill 4 partitions'):
      self._Build(layer_helpers.Pipeline(layer_helpers.DenseLayers(3), 4, 1), _Inputs)
    with self.assertRaisesRegex(ValueError, '3 layers cannot fill 4 partitions'):
      self._Build(layer_helpers.Pipeline(layer_helpers.DenseLayers(3), 4, 1, cost_input_shapes=[[BATCH, DIM]]),
                  _Inputs)

  def testEmptyPartition(self):
    layers = layer_helpers.DenseLayers(3)
    params = layer_lib.TensorPipeLayer.Params().Set(
        name='pipe', partitions=[layers[:2], [], layers[2:]])
    with self.assertRaisesRegex(ValueError, 'partition 1 of 3 is empty'):
      self._Build(params, _Inputs)

  def testDeviceListOfWrongLength(self):
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 1, devices=['/device:CPU:0'])
    with self.assertRaisesRegex(ValueError, '`devices` has 1 entries for num_devices=2 devices'):
      self._Build(params, _Inputs)

  def testUnknownDevice(self):
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 1,
                              devices=['/device:CPU:0', '/device:XPU:1'])
    with self.assertRaisesRegex(ValueError, "unknown device '/device:XPU:1'"):
      self._Build(params, _Inputs)
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 1,
                              devices=['/device:CPU:0', '/device:CPU:7'])
    with self.assertRaisesRegex(ValueError, "unknown device '/device:CPU:7': the cluster has only"):
      self._Build(params, _Inputs, num_devices=2)

  def testFewerDevicesThanPartitions(self):
    with self.assertRaisesRegex(ValueError, 'num_devices=4 needs 4 devices per model split, but '
                                'the cluster .* has 2'):
      self._Build(layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 4, 1), _Inputs, num_devices=2)

  def testTheOldNameOfNumDevicesStillWorksWithAOneLineWarning(self):
    made = {}
    for name in ('num_devices', 'num_partitions'):
      params = layer_lib.TensorPipeLayer.Params().Set(
          name='pipe', layers=layer_helpers.DenseLayers(4), num_micro_batches=2, virtual_stages=2,
          schedule='interleaved_1f1b', **{name: 2})
      with mock.patch.object(tf.logging, 'warning') as warning, tf.Graph().as_default(), \
          layer_helpers.Cluster(2):
        net = params.Instantiate()
      made[name] = (net.num_devices, net.num_partitions, net.partition_layer_names)
      warnings = [call.args[0] % call.args[1:] for call in warning.call_args_list]
      if name == 'num_devices':
        self.assertEqual(warnings, [])
      else:
        self.assertEqual(warnings, ["TensorPipeLayer 'pipe': the Param num_partitions is "
                                    'deprecated; it is K, the number of devices: set '
                                    'num_devices=2 instead'])
    self.assertEqual(made['num_partitions'], made['num_devices'])
    self.assertEqual(made['num_devices'][:2], (2, 4))
    with self.assertRaisesRegex(ValueError, "^TensorPipeLayer 'pipe': num_devices=2 and "
                                r'num_partitions=4 \(its deprecated old name\) disagree; set only '
                                'num_devices$'):
      self._Build(layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 1, num_partitions=4), _Inputs)

  def testInputsDisagreeOnBatch(self):
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(4, cls=layer_helpers.MaskedDense), 2, 2)
    def Inputs():
      return (py_utils.NestedMap(vec=tf.ones([16, DIM]), paddings=tf.ones([12, 1]),
                                 ids=tf.ones([16], tf.int32), extra=None),)
    with self.assertRaisesRegex(ValueError, r'inputs disagree on the batch size along batch_dim 0: '
                                r'args\[0\]\.ids=16, args\[0\]\.paddings=12, args\[0\]\.vec=16'):
      self._Build(params, Inputs)

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, "recompute='sometimes' is not one of"):
      self._Build(layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 1, recompute='sometimes'), _Inputs)
    with self.assertRaisesRegex(ValueError, 'set exactly one of `partitions`'):
      self._Build(layer_lib.TensorPipeLayer.Params().Set(name='pipe'), _Inputs)

  def testErrorInsideALayerNamesTheLayerAndPartition(self):

    class Mismatch(layer_helpers.Dense):

      def FProp(self, theta, x):
        return tf.matmul(x, tf.ones([DIM + 1, DIM]))  # Shapes that cannot be multiplied.

    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(2) + [Mismatch.Params().Set(name='bad')], 2, 2)
    with self.assertRaises(ValueError) as caught:
      self._Build(params, _Inputs)
    self.assertIn("(raised by layer 'bad' while TensorPipeLayer 'pipe', partition function "
                  "pipe_partition1 was traced)", caught.exception.__notes__)

  def testOutputWithoutBatchDimension(self):

    class Scalar(layer_helpers.Dense):

      def FProp(self, theta, x):
        return tf.reduce_sum(tf.matmul(x, theta.w))

    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(1) + [Scalar.Params().Set(name='s', dim=DIM)],
                              2, 2)
    with self.assertRaisesRegex(ValueError, r': outputs has rank 0, so it has no batch dimension'):
      self._Build(params, _Inputs)


# ------------------------------------------------------------------------------------------------
# Incremental decoding: InitStates and ExtendStep.

DECODE_BATCH, DECODE_LEN = 5, 4  # M in {2, 3} does not divide the batch.


class _CausalMix(layer_helpers.Dense):
  """y_t = tanh(x_t w + mean(x_0 .. x_t)) over [B, T, D]: each position sees the ones before it.

  Decoding keeps the inputs so far in a float64 cache [B, max_length, D] (no other tensor of the
  tests' graphs is float64, so a transfer of a state between devices is visible by its type).
  """

  def FProp(self, theta, x, *skips):
    count = tf.cast(tf.range(1, py_utils.GetShape(x)[1] + 1), x.dtype)[None, :, None]
    y = tf.tanh(tf.einsum('btd,de->bte', x, theta.w) + tf.cumsum(x, axis=1) / count)
    return y + tf.add_n(list(skips)) if skips else y

  def InitStates(self, theta, batch_size, max_length):
    return py_utils.NestedMap(inputs=tf.zeros([batch_size, max_length, self.params.dim],
                                              tf.float64))

  def ExtendStep(self, theta, x, *skips_states_t):
    *skips, states, t = skips_states_t
    inputs = states.inputs + tf.cast(x, tf.float64) * tf.one_hot(
        t, py_utils.GetShape(states.inputs)[1], dtype=tf.float64)[None, :, None]
    mean = tf.cast(tf.reduce_sum(inputs, axis=1, keepdims=True), x.dtype) / tf.cast(t + 1, x.dtype)
    y = tf.tanh(tf.einsum('btd,de->bte', x, theta.w) + mean)
    return (y + tf.add_n(skips) if skips else y), py_utils.NestedMap(inputs=inputs)


class _TiedProjection(layer_helpers.Dense):
  """One weight used twice: In (x w) at the start of a pipeline, Out (x w^T) at its end."""

  def In(self, theta, x):
    return tf.einsum('btd,de->bte', x, theta.w)

  def Out(self, theta, x):
    return tf.einsum('bte,de->btd', x, theta.w)


class _Positionwise(layer_helpers.Dense):
  """tanh(x w) at each position of [B, T, D] (no state); adds the skip connections it gets."""

  def FProp(self, theta, x, *skips):
    y = tf.tanh(tf.einsum('btd,de->bte', x, theta.w))
    return y + tf.add_n(list(skips)) if skips else y


class _HidesItsState(layer_helpers.Dense):
  """A layer whose sublayer keeps decoding state, without an ExtendStep of its own."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('mix', _CausalMix.Params().Set(dim=self.params.dim))

  def FProp(self, theta, x):
    return self.mix.FProp(theta.mix, x)


def _DecodeLayers(tied):
  """Five entries alternating state and no state; with `tied`, a SharedLayer first and last."""
  def Dense(cls, i):
    return cls.Params().Set(name='d%d' % i, dim=DIM, seed=700 + i)
  layers = [Dense(_Positionwise, 0), Dense(_CausalMix, 1), Dense(_Positionwise, 2),
            Dense(_CausalMix, 3), Dense(_Positionwise, 4)]
  if tied:
    tie = _TiedProjection.Params().Set(name='tie', dim=DIM, seed=799)
    layers = ([shared_layer.SharedLayer.Params().Set(name='into', layer=tie, method='In')] +
              layers + [shared_layer.SharedLayer.Params().Set(name='out', layer=tie.Copy(),
                                                             method='Out')])
  return layers


def _DecodeInputs():
  rng = np.random.RandomState(11)
  return rng.uniform(-1, 1, size=[DECODE_BATCH, DECODE_LEN, DIM]).astype(np.float32)


def _Decode(net, x, reorder=None):
  """Every position of x [B, T, D] through net.ExtendStep in a while loop: [B, T, D]; with
  `reorder` (step, rows), the states are reordered by rows after that step."""
  b, length = py_utils.GetShape(x)[0], py_utils.GetShape(x)[1]
  states = net.InitStates(net.theta, b, length)

  def Body(i, states, out):
    y, states = net.ExtendStep(net.theta, tf.gather(x, [i], axis=1), states, i)
    if reorder is not None:
      states = tf.cond(tf.equal(i, reorder[0]), lambda: net.ReorderStates(states, reorder[1]),
                       lambda: states)
    return i + 1, states, out.write(i, y[:, 0])

  _, _, out = tf.while_loop(lambda i, *_: i < length, Body,
                            [tf.constant(0), states, tf.TensorArray(tf.float32, length)])
  return tf.transpose(out.stack(), [1, 0, 2])


def _DecodeVariants(tied, skips):
  """(name, TensorPipeLayer Params) of K in {1, 2, 3} x M in {1, 2, 3} and the unpipelined one."""
  variants = []
  for k, m in itertools.product((1, 2, 3), (1, 2, 3)):
    variants.append(('K%dM%d' % (k, m), layer_lib.TensorPipeLayer.Params().Set(
        name='K%dM%d' % (k, m), partitions=_Partition(_DecodeLayers(tied), k),
        num_micro_batches=m, skip_connections=skips)))
  variants.append(('unpipelined', layer_lib.TensorPipeLayer.Params().Set(
      name='unpipelined', partitions=_Partition(_DecodeLayers(tied), 3), skip_connections=skips,
      unpipelined=True)))
  return variants


class DecodingTest(test_utils.TestCase):
  """ExtendStep position by position gives FProp's outputs on the whole sequence, for every K and
  M (dividing the batch or not), pipelined or not, with tied weights and skip connections; the
  states stay on their partition's device; beam search's reorder is a gather of rows; a layer that
  keeps state without ExtendStep is refused by name."""

  def _Check(self, tied, skips):
    x = _DecodeInputs()
    with tf.Graph().as_default() as g, cluster_factory.ForTestingWorker(
        cpus=3, split_size=3, do_eval=True):
      fetches = {}
      for name, params in _DecodeVariants(tied, skips):
        net = params.Instantiate()
        fetches[name] = (net.FPropDefaultTheta(tf.constant(x)), _Decode(net, tf.constant(x)))
      with tf.Session(graph=g, config=layer_helpers.ValuesOnlyConfig(3)) as sess:
        sess.run(tf.global_variables_initializer())
        values = sess.run(fetches)
    reference = values['unpipelined'][0]
    self.assertEqual(reference.shape, (DECODE_BATCH, DECODE_LEN, DIM))
    for name, (full, incremental) in sorted(values.items()):
      self.assertAllClose(full, reference, rtol=1e-5, atol=1e-6, msg=name)
      self.assertAllClose(incremental, reference, rtol=1e-5, atol=1e-6, msg=name)

  def testEveryKAndMLikeFProp(self):
    self._Check(tied=False, skips=None)

  def testTiedWeightsAndSkipConnections(self):
    self._Check(tied=True, skips=[('d1', 'd4'), ('into', 'd3')])

  def testSeveralPartitionsPerDevice(self):
    x = _DecodeInputs()
    with tf.Graph().as_default() as g, cluster_factory.ForTestingWorker(
        cpus=2, split_size=2, do_eval=True):
      fetches = {}
      for sched, v in (('interleaved_1f1b', 2), ('zbv', 2)):
        net = layer_lib.TensorPipeLayer.Params().Set(
            name=sched, layers=_DecodeLayers(True), num_devices=2, virtual_stages=v,
            num_micro_batches=2, schedule=sched).Instantiate()
        self.assertEqual(net.DecodeSchedule(DECODE_BATCH).partition_devices,
                         [0, 1, 0, 1] if sched == 'interleaved_1f1b' else [0, 1, 1, 0])
        fetches[sched] = (net.FPropDefaultTheta(tf.constant(x)), _Decode(net, tf.constant(x)))
      with tf.Session(graph=g, config=layer_helpers.ValuesOnlyConfig(2)) as sess:
        sess.run(tf.global_variables_initializer())
        values = sess.run(fetches)
    for sched, (full, incremental) in values.items():
      self.assertAllClose(incremental, full, rtol=1e-5, atol=1e-6, msg=sched)

  def testStatesStayOnTheirPartitionsDevice(self):
    with tf.Graph().as_default() as g, cluster_factory.ForTestingWorker(
        cpus=3, split_size=3, do_eval=True):
      net = layer_lib.TensorPipeLayer.Params().Set(
          name='pipe', partitions=_Partition(_DecodeLayers(True), 3), num_micro_batches=2,
          skip_connections=[('d1', 'd4')]).Instantiate()
      out = _Decode(net, tf.constant(_DecodeInputs()))
      with layer_helpers.Session(g, 3) as sess:
        sess.run(tf.global_variables_initializer())
        metadata = tf.RunMetadata()
        sess.run(out, options=tf.RunOptions(output_partition_graphs=True), run_metadata=metadata)
    sent = [node.attr['T'].type for graph in metadata.partition_graphs for node in graph.node
            if node.op == '_Send']
    # Activations go from partition to partition; no state (the only float64 tensors) ever does.
    self.assertIn(tf.float32.as_datatype_enum, sent)
    self.assertNotIn(tf.float64.as_datatype_enum, sent)

  def testReorderedStatesAreTheParentRowsStates(self):
    x = _DecodeInputs()
    rows = np.array([4, 0, 4, 2, 1], np.int32)  # Rows from other micro-batches, one twice.
    # After step 1 row r continues row rows[r]'s prefix: FProp on that spliced sequence.
    spliced = np.concatenate([x[rows, :2], x[:, 2:]], axis=1)
    with tf.Graph().as_default() as g, cluster_factory.ForTestingWorker(
        cpus=2, split_size=2, do_eval=True):
      fetches = {}
      for m in (1, 3):
        net = layer_lib.TensorPipeLayer.Params().Set(
            name='M%d' % m, partitions=_Partition(_DecodeLayers(False), 2),
            num_micro_batches=m).Instantiate()
        fetches[m] = (_Decode(net, tf.constant(x), (1, tf.constant(rows))),
                      net.FPropDefaultTheta(tf.constant(spliced)))
      with tf.Session(graph=g, config=layer_helpers.ValuesOnlyConfig(2)) as sess:
        sess.run(tf.global_variables_initializer())
        values = sess.run(fetches)
    for m, (incremental, full) in values.items():
      self.assertAllClose(incremental[:, 2:], full[:, 2:], rtol=1e-5, atol=1e-6, msg=m)

  def testStatesOfAnotherBatchAreRefused(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      net = layer_lib.TensorPipeLayer.Params().Set(
          name='pipe', partitions=_Partition(_DecodeLayers(False), 2), num_micro_batches=4,
          decode_micro_batches=3).Instantiate()
      states = net.InitStates(net.theta, 4, DECODE_LEN)
      self.assertEqual([len(s) for s in states], [3, 3])  # decode_micro_batches, not 4.
      with self.assertRaisesRegex(ValueError, r"TensorPipeLayer 'pipe': ExtendStep got states for "
                                  r'\[1, 1\] micro-batches of 2 partitions, but a step of 4 '
                                  r'examples has 3 micro-batches'):
        net.ExtendStep(net.theta, tf.zeros([4, 1, DIM]), [s[:1] for s in states], 0)

  def testAStateWithoutExtendStepIsRefusedByName(self):
    layers = _DecodeLayers(False)
    layers[3] = _HidesItsState.Params().Set(name='hides', dim=DIM)
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      net = layer_lib.TensorPipeLayer.Params().Set(
          name='pipe', partitions=_Partition(layers, 2), num_micro_batches=2).Instantiate()
      with self.assertRaisesRegex(
          ValueError, r"TensorPipeLayer 'pipe': layer 'hides' \(a _HidesItsState, in partition 1\) "
          r"keeps state between positions \(its sublayer 'hides/mix', a _CausalMix, has "
          r"InitStates\) but has no ExtendStep, so a decode step cannot run it.*Give "
          r"_HidesItsState both InitStates\(theta, batch_size, max_length\[, context\]\) -> "
          r"states and ExtendStep\(theta, \*inputs, states, t\)"):
        net.InitStates(net.theta, DECODE_BATCH, DECODE_LEN)


if __name__ == '__main__':
  test_utils.main()
