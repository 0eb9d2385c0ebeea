"""GPipe batch norm: moving averages identical whatever K and M; no updates from re-computation."""

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import batch_norm
from tests import layer_helpers

BATCH = 16
DIM = 6


class DenseBn(base_layer.BaseLayer):
  """y = relu(BatchNorm(x w)): a dense layer followed by GPipe batch norm."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', DIM, 'Input and output width.')
    p.Define('seed', 0, 'Seed of the weight initialiser.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('bn', batch_norm.BatchNorm.Params().Set(name='bn', dim=p.dim, decay=0.9))

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.dim, p.dim], py_utils.WeightInit.Gaussian(1.0, seed=p.seed)))

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      return tf.nn.relu(self.bn.FProp(theta.bn, tf.matmul(x, theta.w)))


def _Layers(num=4):
  return [DenseBn.Params().Set(name='layer%d' % i, seed=10 + i) for i in range(num)]


def _Inputs():
  x = np.random.RandomState(3).normal(2.0, 3.0, size=[BATCH, DIM]).astype(np.float32)
  return (tf.constant(x),)


def _Step(params):
  return layer_helpers.StepWithBatchNormUpdates(params, _Inputs)


def _UnpipelinedStats(name, num_micro_batches):
  """Builds the plain model `name` on each of the M slices of the batch in turn.

  Returns {moving variable name below name/: [the statistic of each slice's update]} (ordinary
  per-slice updates, which are registered, not run).
  """
  net = layer_helpers.Plain(_Layers(), name=name).Instantiate()
  (x,) = _Inputs()
  for piece in tf.split(x, num_micro_batches):
    net.FPropDefaultTheta(piece)
  stats = {}
  # pylint: disable=protected-access
  for var, stat in py_utils._get_batch_norm_updates_dict().values():
    if var.op.name.startswith(name + '/'):
      stats.setdefault(var.op.name[len(name) + 1:], []).append(stat)
  # pylint: enable=protected-access
  return stats


def _ExpectedMovingAverages(values, decay=0.9):
  """Moving averages after one step of the plain model, each layer normalised per micro-batch.

  Computed in numpy from the per-slice statistics `values` (see _UnpipelinedStats): the whole
  mini-batch's mean and variance, one decay step from (0, 1).
  """
  expected = {}
  for name in values:
    if 'moving_mean' not in name:
      continue
    var_name = name.replace('moving_mean', 'moving_variance')
    mean_t, var_t = np.array(values[name]), np.array(values[var_name])
    mean = mean_t.mean(0)
    variance = (var_t + mean_t**2).mean(0) - mean**2
    expected[name] = 0.0 - (0.0 - mean) * (1 - decay)
    expected[var_name] = 1.0 - (1.0 - variance) * (1 - decay)
  return expected


def _StepVariants(variants, references):
  """As layer_helpers.StepWithBatchNormUpdates for each (name, params) of `variants`, in one graph.

  Also builds _UnpipelinedStats(name, M) for each (name, M) of `references` there. Building all
  in one graph saves a session per variant. Each params is named `name`, so the variables are
  distinct; all are seeded as in layer_helpers.StepWithBatchNormUpdates, so they start out
  identical.
  One session.run (grappler off: values only) runs every variant's gradients and batch-norm
  updates; a second reads the moving averages.

  Returns:
    ({name: (moving-average values as in layer_helpers.StepWithBatchNormUpdates,
             the number of updates the
    variant registered, the number of those relevant to its loss)},
    {name: _UnpipelinedStats values}).
  """
  graph = tf.Graph()
  with graph.as_default(), layer_helpers.Cluster(4):
    tf.random.set_seed(1234)  # Lingvo then seeds unseeded variables from their names.
    stats = {name: _UnpipelinedStats(name, m) for name, m in references}
    grads, updates, counts, moving = [], [], {}, {}
    for name, params in variants:
      assert params.name == name, (params.name, name)
      before = len(tf.get_collection(py_utils.BATCH_NORM_UPDATES))
      out = params.Instantiate().FPropDefaultTheta(*_Inputs())
      loss = tf.reduce_mean(tf.square(out - 0.5))
      variables = [v for v in tf.trainable_variables() if v.op.name.startswith(name + '/')]
      grads.append(tf.gradients(loss, variables, colocate_gradients_with_ops=True))
      # Registered while building the forward and backward passes (where re-computation happens).
      own = tf.get_collection(py_utils.BATCH_NORM_UPDATES)[before:]
      relevant, _ = py_utils.FindRelevantBatchNormUpdates(loss, own)
      updates += own
      counts[name] = (len(own), len(relevant))
      moving[name] = {v.op.name[len(name) + 1:]: v for v in tf.global_variables()
                      if v.op.name.startswith(name + '/') and 'moving_' in v.op.name}
    config = layer_helpers.ValuesOnlyConfig(4)
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      _, stat_values, _ = sess.run([grads, stats, updates])
      moving_values = sess.run(moving)
  return ({name: (moving_values[name],) + counts[name] for name, _ in variants}, stat_values)


class CombineMomentsTest(test_utils.TestCase):

  def testEqualsWholeBatchMoments(self):
    x = np.random.RandomState(0).normal(1.0, 2.0, size=[12, 5]).astype(np.float32)
    with self.session():
      parts = [tf.nn.moments(tf.constant(c), [0]) for c in np.split(x, 4)]
      mean, var = batch_norm.CombineMoments([m for m, _ in parts], [v for _, v in parts])
      mean, var = self.evaluate([mean, var])
    self.assertAllClose(mean, x.mean(0), rtol=1e-5, atol=1e-6)
    self.assertAllClose(var, x.var(0), rtol=1e-5, atol=1e-6)

  def testEqualWeightsAreOnesDividedByTheGroups(self):
    """Bit for bit the combination with equal weights made as ones_like(means) / M."""
    rng = np.random.RandomState(1)
    for dtype in (tf.float32, tf.float64):
      for m in (3, 7, 32):
        with self.session(graph=tf.Graph()):
          means = [tf.constant(rng.normal(size=[5]), dtype) for _ in range(m)]
          variances = [tf.constant(rng.uniform(size=[5]), dtype) for _ in range(m)]
          stacked = tf.stack(means)
          weights = tf.ones_like(stacked) / float(m)
          mean = tf.reduce_sum(weights * stacked, axis=0)
          second = tf.reduce_sum(weights * (tf.stack(variances) + tf.square(stacked)), axis=0)
          expected = [mean, tf.maximum(second - tf.square(mean), 0.0)]
          got = batch_norm.CombineMoments(means, variances)
          expected, got = self.evaluate([expected, got])
        for e, g in zip(expected, got):
          self.assertAllEqual(e, g, msg='%s M=%d' % (dtype.name, m))


class PipelinedBatchNormTest(test_utils.TestCase):

  @pytest.mark.slow
  def testMovingAveragesIdenticalWhateverKAndM(self):
    cases = [(k, m, mode) for m in (1, 4) for k, mode in (
        (1, 'always'), (2, 'never'), (2, 'always'), (2, 'selective'), (4, 'except_last'),
        (4, 'always'))]
    steps, stats = _StepVariants(
        [('K%d_M%d_%s' % c,
          layer_helpers.Pipeline(_Layers(), c[0], c[1], c[2], name='K%d_M%d_%s' % c))
         for c in cases], [('ref_M1', 1), ('ref_M4', 4)])
    for k, m, mode in cases:
      reference = _ExpectedMovingAverages(stats['ref_M%d' % m])
      self.assertEqual(len(reference), 8)
      self.assertGreater(np.abs(reference['layer0/bn/moving_mean/var']).max(), 0.1)
      moving, num_updates, num_relevant = steps['K%d_M%d_%s' % (k, m, mode)]
      # One update per moving variable: none per micro-batch, none from the re-computation.
      self.assertEqual(num_updates, 8, 'K=%d M=%d' % (k, m))
      self.assertEqual(num_relevant, 8, 'K=%d M=%d' % (k, m))
      self.assertEqual(sorted(moving), sorted(reference))
      for name in reference:
        self.assertAllClose(moving[name], reference[name], rtol=1e-5, atol=1e-6,
                            msg='K=%d M=%d %s %s' % (k, m, mode, name))

  def testFirstLayerMovingAveragesIdenticalWhateverM(self):
    """The first layer's input does not depend on M, so neither do its moving averages."""
    _, plain, _, _ = _Step(layer_helpers.Plain(_Layers(1)))
    for k, m in ((1, 2), (1, 16), (2, 8)):
      _, moving, _, _ = _Step(layer_helpers.Pipeline(_Layers(1) + _Layers(2)[1:], k, m))
      for name in plain:
        self.assertAllClose(moving[name], plain[name], rtol=1e-5, atol=1e-6,
                            msg='K=%d M=%d %s' % (k, m, name))

  def testGradientsEqualPlainModelForOneMicroBatch(self):
    reference, _, _, _ = _Step(layer_helpers.Plain(_Layers()))
    for k in (1, 2, 4):
      grads, _, _, _ = _Step(layer_helpers.Pipeline(_Layers(), k, 1))
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-5, 'K=%d' % k)

  def testMicroBatchStatisticsIndependentOfK(self):
    """With M > 1 each micro-batch is normalised on its own, whatever the number of partitions."""
    reference, _, _, _ = _Step(layer_helpers.Pipeline(_Layers(), 1, 4, 'never'))
    plain, _, _, _ = _Step(layer_helpers.Plain(_Layers()))
    # Per-micro-batch statistics really change the function (so the comparison below means
    # something).
    self.assertGreater(layer_helpers.MaxRelativeError(plain, reference), 1e-3)
    for k in (2, 4):
      grads, _, _, _ = _Step(layer_helpers.Pipeline(_Layers(), k, 4, 'always'))
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-5, 'K=%d' % k)

  def testEvalUsesMovingAverages(self):
    x = np.random.RandomState(5).normal(size=[4, 3]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.SetEval(True):
      bn = batch_norm.BatchNorm.Params().Set(name='bn', dim=3, epsilon=0.0).Instantiate()
      y = bn.FPropDefaultTheta(tf.constant(x))
      self.assertEmpty(tf.get_collection(py_utils.BATCH_NORM_UPDATES))
      with self.session(graph=graph) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run([tf.assign(bn.vars.moving_mean, [1.0, 2.0, 3.0]),
                  tf.assign(bn.vars.moving_variance, [4.0, 1.0, 0.25]),
                  tf.assign(bn.vars.gamma, [2.0, 2.0, 2.0])])
        value = sess.run(y)
    expected = (x - np.array([1.0, 2.0, 3.0])) / np.sqrt([4.0, 1.0, 0.25]) * 2.0
    self.assertAllClose(value, expected, rtol=1e-5, atol=1e-5)

  def testBadDim(self):
    with self.assertRaisesRegex(ValueError,
                                "BatchNorm 'bn': dim must be a positive integer, got 0"):
      batch_norm.BatchNorm.Params().Set(name='bn').Instantiate()


if __name__ == '__main__':
  tf.test.main()
