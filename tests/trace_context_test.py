"""trace_context: one context per thread, entered and restored as a whole."""

import threading
import types

from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import partition_spec
from tensorpipe import trace_context

_SPEC = partition_spec.PartitionSpec()  # A partition whose settings the test does not look at.


def _Settings():
  """What Partition sets that Lingvo and TensorFlow keep themselves, to compare before and after."""
  params = cluster_factory.Current().params
  return (params.enable_asserts, params.add_summary, params.enable_check_numerics,
          py_utils.GetGlobalStep())


def _GradientOverride(op):
  """The gradient an op was built to use (the override map's), or None."""
  try:
    return op.get_attr('_gradient_op_type')
  except ValueError:
    return None


def _StepSeed():
  return int(tf.get_static_value(py_utils.GetStepSeed()))


class OffsetTest(test_utils.TestCase):

  def testNoContextOutsideAndNestedOffsetsAddUp(self):
    self.assertIsNone(trace_context.Current())
    with tf.Graph().as_default():
      with trace_context.Offset(4) as outer:
        self.assertEqual(trace_context.Current().offset, 4)
        with trace_context.Offset(3):
          self.assertEqual(trace_context.Current().offset, 7)
        with trace_context.Offset(tf.constant(2)) as inner:
          offset = inner.offset
        self.assertIs(trace_context.Current(), outer)
      self.assertIsNone(trace_context.Current())
      with self.session() as sess:
        self.assertEqual(sess.run(offset), 6)

  def testBadOffsetsAreRefusedBeforeAnythingIsEntered(self):
    with self.assertRaisesRegex(ValueError, 'example offset must be a non-negative integer, got -1'):
      with trace_context.Offset(-1):
        pass
    with self.assertRaisesRegex(ValueError, 'must be a non-negative integer, got True'):
      with trace_context.Offset(True):
        pass
    with tf.Graph().as_default():
      before = _Settings()
      with self.assertRaisesRegex(ValueError, 'example offset must be a scalar integer tensor'):
        with trace_context.Partition(_SPEC, None, tf.constant([1, 2]), None):
          pass
      self.assertEqual(_Settings(), before)
    self.assertIsNone(trace_context.Current())

  def testCollectingKeepsTheOffsetAndOffsetKeepsTheCollector(self):
    collector = object()
    with trace_context.Offset(5), trace_context.Collecting(collector):
      self.assertEqual(trace_context.Current().offset, 5)
      with trace_context.Offset(1):
        self.assertIs(trace_context.Current().collector, collector)
        self.assertEqual(trace_context.Current().offset, 6)
    self.assertIsNone(trace_context.Current())

  def testThreadsDoNotSeeEachOthersContexts(self):
    seen = {}

    def Other():
      seen['before'] = trace_context.Current()
      with trace_context.Offset(7):
        seen['inside'] = trace_context.Current().offset

    with trace_context.Offset(3):
      thread = threading.Thread(target=Other)
      thread.start()
      thread.join()
      self.assertEqual(trace_context.Current().offset, 3)
    self.assertIsNone(seen['before'])
    self.assertEqual(seen['inside'], 7)  # Not 10: the main thread's offset is not its outer one.


class PartitionTest(test_utils.TestCase):

  def testEntersEverythingAndRestoresItOnExitAndAfterAnError(self):
    home = types.SimpleNamespace(entry='original')
    calls = []

    def Routes():
      calls.append(1)
      return [(home, 'entry', 'routed')]

    with tf.Graph().as_default():
      step = tf.constant(3, tf.int64)
      before = _Settings()
      for fails in (False, True):
        try:
          with trace_context.Offset(2), trace_context.Partition(
              partition_spec.PartitionSpec(batch_dim=1, example_count=4), step, tf.constant(5),
              'collector', check_numerics=False, routes=Routes) as context:
            self.assertIs(trace_context.Current(), context)
            self.assertEqual(_Settings(), (False, False, False, step))
            self.assertEqual(home.entry, 'routed')
            self.assertEqual((context.collector, context.step, context.check_numerics,
                              context.two_d_weight_gradients), ('collector', step, False, True))
            self.assertEqual((context.routing.batch_dim, context.routing.example_count), (1, 4))
            offset = context.offset
            matmul = tf.matmul(tf.ones([2, 3, 4]), tf.ones([4, 5]))
            if fails:
              raise RuntimeError('a layer failed')
        except RuntimeError:
          self.assertTrue(fails)
        self.assertIsNone(trace_context.Current())
        self.assertEqual(_Settings(), before)
        self.assertEqual(home.entry, 'original')
      self.assertEqual(_GradientOverride(matmul.op), b'TensorPipeBroadcastMatMul')
      self.assertIsNone(_GradientOverride(tf.matmul(tf.ones([2, 3, 4]), tf.ones([4, 5])).op))
      self.assertEqual(len(calls), 2)
      with self.session() as sess:
        self.assertEqual(sess.run(offset), 7)

  def testANestedPartitionFindsTheRoutesInPlaceAndHasItsOwnRouting(self):
    home = types.SimpleNamespace(entry='original')

    def Routes():
      return [(home, 'entry', object() if home.entry != 'original' else 'routed')]

    with tf.Graph().as_default():
      check_numerics = cluster_factory.Current().params.enable_check_numerics
      with trace_context.Partition(_SPEC, None, 4, 'outer', routes=Routes) as outer:
        with trace_context.Partition(_SPEC, None, 1, 'inner', check_numerics=False,
                                     routes=Routes) as inner:
          self.assertEqual(home.entry, 'routed')
          self.assertEqual(inner.offset, 5)
          self.assertIsNot(inner.routing, outer.routing)
          self.assertFalse(cluster_factory.Current().params.enable_check_numerics)
        self.assertIs(trace_context.Current(), outer)
        self.assertEqual(home.entry, 'routed')
        self.assertEqual(cluster_factory.Current().params.enable_check_numerics, check_numerics)
      self.assertEqual(home.entry, 'original')


class LayerScopeTest(test_utils.TestCase):

  def testNamesTheLayerRestartsTheStepSeedAndSharesRoutingWithDerivedContexts(self):
    with tf.Graph().as_default():
      with trace_context.Partition(_SPEC, None, 0, None) as context:
        routing = context.routing
        seeds = []
        for key in ('pipe/a', 'pipe/b', 'pipe/a'):
          py_utils.ResetStepSeed(len(seeds) + 100)  # Whatever the step seed was before.
          with trace_context.LayerScope(key):
            seeds.append(_StepSeed())
            routing.uses += 1
            with trace_context.Offset(2):  # A derived context: the same routing state.
              self.assertIs(trace_context.Current().routing, routing)
              self.assertEqual((routing.layer, routing.uses), (key, 1))
          self.assertIsNone(routing.layer)
        self.assertEqual(seeds[0], seeds[2])
        self.assertNotEqual(seeds[0], seeds[1])

  def testOutsideAnyPartitionIsAnError(self):
    with self.assertRaisesRegex(AssertionError, "layer 'a' traced outside any partition"):
      with trace_context.LayerScope('a'):
        pass
    with trace_context.Offset(1):
      with self.assertRaisesRegex(AssertionError, 'outside any partition'):
        with trace_context.LayerScope('a'):
          pass


if __name__ == '__main__':
  tf.test.main()
