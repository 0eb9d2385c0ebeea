"""The 'measured' cost source: layers timed alone, with an injected deterministic timer."""

from lingvo import compat as tf
from lingvo.core import layers as lingvo_layers
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.measure import workloads
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import measured_cost
from tests import layer_helpers
from tests import trace_helpers


class _StaticBatch(layer_helpers.Dense):
  """Dense that needs its batch size when its graph is built."""

  def FProp(self, theta, x):
    return tf.reshape(super().FProp(theta, x), [int(x.shape[0]), self.params.dim])


class MeasuredCostTest(test_utils.TestCase):

  def testMeasureSecondsTakesIntegerInputs(self):
    emb = lingvo_layers.SimpleEmbeddingLayer.Params().Set(name='emb', vocab_size=50,
                                                          embedding_dim=16)
    dense = layer_helpers.Dense.Params().Set(name='dense', dim=16)

    def Ids():
      return (tf.zeros([32], tf.int32),)

    # Wall-clock seconds are checked for shape only (one per layer, positive, finite): which layer
    # is slower is the measured-cost tests' business, with an injected deterministic cost.
    seconds = measured_cost.MeasureSeconds([emb, dense], None, repeats=2, input_fn=Ids)
    self.assertEqual(len(seconds), 2)
    self.assertTrue(all(0 < s < float('inf') for s in seconds), seconds)

  def testInjectedTimerSeesEachLayerAlone(self):
    layers = [workloads.RepeatedDense.Params().Set(name='r%d' % i, dim=8, repeats=n)
              for i, n in enumerate([2, 5])]
    calls = []

    def Timer(sess, step, repeats):
      calls.append(repeats)
      return trace_helpers.MatMulsRun(sess, step)
    costs = measured_cost.MeasureSeconds(layers, [[4, 8]], repeats=3, timer=Timer)
    self.assertEqual(costs, [3 * 2, 3 * 5])  # n forward + 2n backward MatMuls, each layer alone.
    self.assertEqual(calls, [3, 3])

  def testSkipConnectionsFeedTheirDestinations(self):
    """A destination layer's costs are taken with its source's output as an extra input."""

    class Join(layer_helpers.Dense):

      def FProp(self, theta, x, skip):
        return tf.tanh(tf.matmul(x, theta.w)) + skip

      @classmethod
      def FPropMeta(cls, p, x, skip):
        py_utils.CheckShapes((x, skip))
        return super().FPropMeta(p, x)

    layers = [layer_helpers.Dense.Params().Set(name='a', dim=8), layer_helpers.Dense.Params().Set(name='b',
                                                                                        dim=8),
              Join.Params().Set(name='c', dim=8)]
    metas, _ = cost_model.ChainMeta(layers, [[4, 8]], skips=[(0, 2)])
    self.assertEqual([len(shapes) for _, shapes in metas], [1, 1, 2])
    profiles = cost_model.Profiles(layers, [[4, 8]], skips=[(0, 2)])
    self.assertEqual(profiles[2].in_elements, 2 * 4 * 8)  # Its input and the skip.
    costs = measured_cost.MeasureSeconds(layers, [[4, 8]], repeats=1, skips=[(0, 2)],
                                         timer=lambda sess, step, repeats: trace_helpers.MatMulsRun(
                                             sess, step))
    self.assertEqual(costs, [3, 3, 3])  # Each layer ran: 1 forward and 2 backward MatMuls.

  def testEachLayerIsBuiltOnceForEveryBatchSize(self):
    dense = layer_helpers.Dense.Params().Set(name='d', dim=8)
    static = _StaticBatch.Params().Set(name='s', dim=8)
    built, timed = [], []
    seconds = measured_cost.MeasureLayerSeconds(
        [dense, static], [[[16, 8]], [[16, 8]]], [16, 2], repeats=2,
        timer=trace_helpers.MatMulElementsRun, built=lambda: built.append(1),
        timed=lambda i, s: timed.append((i, s)))
    # B x D forward, B x D and D x D backward; the static layer in a graph of its own per batch.
    expected = [2 * 16 * 8 + 64.0, 2 * 2 * 8 + 64.0]
    self.assertEqual(seconds, [expected, expected])
    self.assertEqual((len(built), timed), (2, [(0, expected), (1, expected)]))
    with self.assertRaisesRegex(ValueError, r'examples must be in decreasing order, got \[2, 16\]'):
      measured_cost.MeasureLayerSeconds([dense], [[[16, 8]]], [2, 16])


if __name__ == '__main__':
  test_utils.main()
