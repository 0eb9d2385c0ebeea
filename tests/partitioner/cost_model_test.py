"""Cost model: FPropMeta chaining, variable counts without allocation, memory estimates, timing,
nested input shapes and the facts kept in a disk cache."""

import os
from unittest import mock

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import layers as lingvo_layers
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import disk_cache
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import measured_cost
from tensorpipe.tasks.image import pipelined_classifier
from tests import layer_helpers
from tests import trace_helpers


class _WithState(layer_helpers.Dense):
  """Dense plus a non-trainable counter (like batch-norm moving averages)."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('count', py_utils.WeightParams([3], py_utils.WeightInit.Constant(0.0)),
                        trainable=False)


class _MaskedProjection(base_layer.BaseLayer):
  """x @ w times a constant mask: tf.gradients also builds the mask's gradient, which reads the
  product; a step prunes it, since nobody asks for a constant's gradient."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', py_utils.WeightParams([4, 4]))

  def FProp(self, theta, x):
    return tf.matmul(x, theta.w) * tf.constant(0.5, shape=[2, 4])

  @classmethod
  def FPropMeta(cls, p, x):
    return py_utils.NestedMap(flops=2 * x.num_elements() * 4, out_shapes=(x,))


class _MaskedStep(layer_helpers.Dense):
  """Dense on NestedMap(vec [B, D], paddings [B]): vec transformed, paddings passed on."""

  def FProp(self, theta, inputs):
    out = py_utils.NestedMap(inputs)
    out.vec = tf.tanh(tf.matmul(inputs.vec, theta.w)) * (1.0 - inputs.paddings[:, None])
    return out

  @classmethod
  def FPropMeta(cls, p, inputs):
    return py_utils.NestedMap(flops=2 * inputs.vec.num_elements() * p.dim, out_shapes=(inputs,))


class CostModelTest(test_utils.TestCase):

  def testProfilesChainShapesAndCountVariables(self):
    conv = pipelined_classifier.ConvBlock.Params().Set(name='conv', filter_shape=(3, 3, 1, 4),
                                                       pool=True)
    dense = _WithState.Params().Set(name='dense', dim=4)
    profiles = cost_model.Profiles([conv, dense], [[2, 8, 8, 1]])
    self.assertEqual([p.name for p in profiles], ['conv', 'dense'])
    self.assertEqual((profiles[0].params, profiles[0].state), (3 * 3 * 1 * 4 + 4, 0))
    self.assertEqual(profiles[0].in_elements, 2 * 8 * 8)
    self.assertEqual(profiles[0].out_elements, 2 * 4 * 4 * 4)  # Pooled to 4 x 4, 4 filters.
    self.assertEqual(profiles[1].in_elements, profiles[0].out_elements)
    self.assertEqual(profiles[1].out_elements, profiles[1].in_elements)
    self.assertEqual((profiles[1].params, profiles[1].state), (16, 3))
    self.assertEqual(profiles[0].flops, 2 * 2 * 8 * 8 * 9 * 4 + 2 * 2 * 8 * 8 * 4)
    # What the backward ops read: the relu output at 8 x 8 (for the relu and max-pool gradients) and
    # the pooled output; Dense: its tanh output. Not the conv or matmul outputs, which no gradient
    # reads.
    self.assertEqual(profiles[0].activation_elements, 512 + 128)
    self.assertEqual(profiles[1].activation_elements, 128)

  def testActivationsAreWhatTheNeededGradientsRead(self):
    profile, = cost_model.Profiles([_MaskedProjection.Params().Set(name='masked')], [[2, 4]])
    # The input and weight gradients read the mask and the input and weight, none of which the
    # layer's forward ops made; only the pruned mask gradient reads the product.
    self.assertEqual(profile.activation_elements, 0)
    # The needed backward ops: the summed output's gradient (Fill, Tile), the mask multiplication
    # and the two MatMuls (input and weight); not the mask gradient's multiplication.
    self.assertEqual(profile.backward_ops, 5)

  def testGradientElementsAreTheLargestBackwardOp(self):
    conv = pipelined_classifier.ConvBlock.Params().Set(name='conv', filter_shape=(3, 3, 1, 4),
                                                       pool=True)
    profile, = cost_model.Profiles([conv], [[2, 8, 8, 1]])
    # The max-pool gradient reads the pooled gradient (2 x 4 x 4 x 4) and writes one of the relu
    # output (2 x 8 x 8 x 4); the relu gradient writes into the gradient it reads (counted once);
    # the conv's input gradient reads 512 and writes 128.
    self.assertEqual(profile.gradient_elements, 512 + 128)
    self.assertGreater(profile.gradient_elements, profile.in_elements + profile.out_elements)

  def testBillionParameterLayerIsCountedWithoutAllocating(self):
    huge = layer_helpers.Dense.Params().Set(name='huge', dim=40000)  # 1.6e9 weights, 6.4 GB as float32.
    self.assertEqual(cost_model.ParamCounts([huge]), [(1600000000, 0)])

  def testMemoryCostByRecomputeMode(self):
    profile = cost_model.LayerProfile('l', 1.0, params=10, state=2, in_elements=100,
                                      out_elements=100, activation_elements=400)
    always = cost_model.MemoryCost([profile], 8, 'always', bytes_per_param=12)
    self.assertEqual(always.Of(0, 1), 10 * 12 + 2 * 4 + 400 * 2 / 8 * 4 + 100 * 4)
    never = cost_model.MemoryCost([profile], 8, 'never', bytes_per_param=12)
    self.assertEqual(never.Of(0, 1), 10 * 12 + 2 * 4 + 400 * 4 + 100 * 4)
    last = cost_model.MemoryCost([profile], 8, 'except_last', bytes_per_param=12)
    self.assertEqual(last.Of(0, 1), 10 * 12 + 2 * 4 + 400 * 3 / 8 * 4 + 100 * 4)
    single = cost_model.MemoryCost([profile], 1, 'always', bytes_per_param=12)
    self.assertEqual(single.Of(0, 1), 10 * 12 + 2 * 4 + 400 * 4 + 100 * 4)
    # 'selective': as 'always', plus the matmul outputs of every micro-batch stashed.
    profile.kept_elements = 100
    selective = cost_model.MemoryCost([profile], 8, 'selective', bytes_per_param=12)
    self.assertEqual(selective.Of(0, 1), always.Of(0, 1) + 100 * 4)
    ofob = cost_model.MemoryCost([profile], 8, 'selective', bytes_per_param=12, stashed=2)
    self.assertEqual(ofob.Of(0, 1) - cost_model.MemoryCost(
        [profile], 8, 'always', bytes_per_param=12, stashed=2).Of(0, 1), 100 * 2 / 8 * 4)

  def testProfileCountsWhatSelectiveRecomputationKeeps(self):
    dense = layer_helpers.Dense.Params().Set(name='dense', dim=8)
    conv = lingvo_layers.Conv2DLayerNoPadding.Params().Set(
        name='conv', filter_shape=(3, 3, 2, 4), filter_stride=(1, 1))
    dense_profile, = cost_model.Profiles([dense], [[16, 8]])
    conv_profile, = cost_model.Profiles([conv], [[2, 6, 6, 2]])
    # tanh(x w): one MatMul of 16 x 8 outputs, 8 multiply-adds each: all of FPropMeta's FLOPs.
    self.assertEqual(dense_profile.kept_elements, 16 * 8)
    self.assertEqual(dense_profile.kept_flops, 2 * 16 * 8 * 8)
    self.assertEqual(cost_model.SelectiveShare(dense_profile), 0.0)
    # One Conv2D (its output as wide as its input): 2 x 6 x 6 x 4 outputs, 3 x 3 x 2 multiply-adds
    # each.
    self.assertEqual(conv_profile.kept_elements, 2 * 6 * 6 * 4)
    self.assertEqual(conv_profile.kept_flops, 2 * (2 * 6 * 6 * 4) * 3 * 3 * 2)
    self.assertEqual(cost_model.SelectiveShare(cost_model.LayerProfile('l', 0.0, 0, 0, 1, 1)), 1.0)

  def testWeightGradientTasksKeepInputsAndOutputGradients(self):
    weighted = cost_model.LayerProfile('w', 1.0, params=10, state=0, in_elements=100,
                                       out_elements=50, activation_elements=400)
    plain = cost_model.LayerProfile('p', 1.0, params=0, state=0, in_elements=100,
                                    out_elements=50, activation_elements=400)
    for profile, kept in ((weighted, 2 / 8 * (100 + 50) * 4), (plain, 0.0)):
      base = cost_model.MemoryCost([profile], 8, 'always', stashed=4, running=1)
      waiting = cost_model.MemoryCost([profile], 8, 'always', stashed=4, waiting=2, running=1)
      # Two micro-batches waiting for a weight-gradient task keep a weighted layer's input and
      # output gradient, not its activations; a layer without weights has no such task.
      self.assertAlmostEqual(waiting.Of(0, 1) - base.Of(0, 1), kept)

  def testNestedMapInputs(self):
    layers = [_MaskedStep.Params().Set(name='m%d' % i, dim=8) for i in range(2)]
    shapes = [py_utils.NestedMap(vec=[4, 8], paddings=[4])]
    self.assertEqual(cost_model.BatchOf(shapes, 0), 4)
    doubled = cost_model.WithBatch(shapes, 0, 8)
    self.assertEqual(doubled[0].vec, [8, 8])
    self.assertEqual(doubled[0].paddings, [8])
    profiles = cost_model.Profiles(layers, doubled)
    self.assertEqual([p.in_elements for p in profiles], [8 * 8 + 8] * 2)
    self.assertEqual([p.params for p in profiles], [64, 64])
    self.assertGreater(profiles[0].activation_elements, 0)
    metas, _ = cost_model.ChainMeta(layers, doubled)
    seconds = measured_cost.MeasureLayerSeconds(layers[:1], [metas[0][1]], [8, 2],
                                                timer=trace_helpers.MatMulElementsRun)
    self.assertEqual(seconds, [[3 * 8 * 8 + 0.0, 2 * 2 * 8 + 8 * 8 + 0.0]])

  def testFactsAreBuiltOncePerMachineWithACache(self):
    cache = disk_cache.DiskCache(self.create_tempdir().full_path)
    layers = [layer_helpers.Dense.Params().Set(name='a%d' % i, dim=8) for i in range(3)]
    builds = []
    build = cost_model._Facts  # pylint: disable=protected-access

    def Counted(*args):
      builds.append(args[0].name)
      return build(*args)

    profiles = []
    with mock.patch.object(cost_model, '_Facts', Counted):
      for _ in range(2):  # A fresh process each time: its own facts are gone.
        with mock.patch.object(cost_model, '_FACTS', {}):
          profiles.append(cost_model.Profiles(layers, [[4, 8]], cache=cache))
      self.assertEqual(builds, ['a0'])  # One distinct layer, built by the first run only.
      self.assertEqual(profiles[0], profiles[1])
      with mock.patch.object(cost_model, '_FACTS', {}):  # Without the cache: built again.
        self.assertEqual(profiles[0], cost_model.Profiles(layers, [[4, 8]]))
      self.assertEqual(builds, ['a0', 'a0'])
      for name in os.listdir(os.path.join(cache.directory, 'layer_facts')):
        with open(os.path.join(cache.directory, 'layer_facts', name), 'w') as f:
          f.write('{"format": 1, "key": ')  # Cut short: built again, no error.
      with mock.patch.object(cost_model, '_FACTS', {}):
        self.assertEqual(cost_model.Profiles(layers, [[4, 8]], cache=cache), profiles[0])
      self.assertEqual(builds, ['a0', 'a0', 'a0'])

  def testLayerWithoutFPropMetaIsNamed(self):
    opaque = base_layer.BaseLayer.Params().Set(name='opaque')
    with self.assertRaisesRegex(ValueError, "Layer 'opaque' .* has no FPropMeta"):
      cost_model.Flops([opaque], [[2, 2]])


if __name__ == '__main__':
  test_utils.main()
