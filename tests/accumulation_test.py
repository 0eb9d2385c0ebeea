"""Gradient accumulation: running sum in one buffer per weight, not M partial gradients at once."""

import collections
import re

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import accumulation
from tests import layer_helpers
from tests import trace_helpers

DIM, LAYERS, BATCH, M = 1024, 4, 64, 8


class AddInPlaceTest(test_utils.TestCase):

  def testSumIsExactAndWrittenIntoTheRunningSum(self):
    own, rest = np.random.RandomState(0).normal(size=[2, 30, 40]).astype(np.float32) * [[[1.0]],
                                                                                         [[1e3]]]
    with self.session(graph=tf.Graph()) as sess:
      total = tf.raw_ops.DeepCopy(x=tf.constant(rest))  # A buffer of its own.
      summed = accumulation.AddInPlace(total, tf.constant(own))
      with tf.control_dependencies([summed]):
        total_after = tf.identity(total)
      value, after = sess.run([summed, total_after])
    self.assertAllEqual(value, rest + own)  # bit for bit
    self.assertAllEqual(after, rest + own)  # the running sum's own buffer holds the sum

  def testZerosAreANewBufferEveryStep(self):
    # Grappler would fold a constant zeros tensor into one buffer that every step adds into.
    with self.session(graph=tf.Graph()) as sess:
      x = tf.constant([[1.0, 2.0]])
      total = accumulation.AddInPlace(accumulation.Zeros(tf.TensorShape([1, 2]), tf.float32), x)
      for _ in range(3):
        self.assertAllEqual(sess.run(total), [[1.0, 2.0]])

  def testDense(self):
    with self.session(graph=tf.Graph()):
      self.assertIsNone(accumulation.Dense(None))
      s = tf.IndexedSlices(tf.constant([[2.0]]), tf.constant([1]), tf.constant([2, 1]))
      self.assertAllEqual(self.evaluate(accumulation.Dense(s)), [[0.0], [2.0]])


class SumBufferTest(test_utils.TestCase):
  """Each weight's gradient sum stays in one buffer over all micro-batches (no re-allocation)."""

  def testEverySumStaysInOneBuffer(self):
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(8, dim=256), 2, 4)
    for step_stats in trace_helpers.TracedSgdSteps(params, 1024, 2):
      buffers = collections.defaultdict(set)  # (device, InplaceAdd node) -> output buffer addresses
      for dev in step_stats.dev_stats:
        for n in dev.node_stats:
          if re.fullmatch(r'InplaceAdd(_\d+)?', n.node_name) and n.output:
            buffers[(dev.device, n.node_name)].add(
                n.output[0].tensor_description.allocation_description.ptr)
      self.assertLen(buffers, 8)  # one running sum per weight: 4 per partition
      for key, pointers in buffers.items():
        self.assertLen(pointers, 1, key)


class AccumulationMemoryTest(test_utils.TestCase):
  """Wide weights, small batch: partial weight gradients dominate memory."""

  def _Peak(self, build):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(1):
      grads = build()
      with layer_helpers.Session(g, 1) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(grads)
        return layer_helpers.StepPeakBytes(lambda: sess.run(grads))

  def _TensorPipe(self):
    net = layer_helpers.Pipeline(layer_helpers.DenseLayers(LAYERS, DIM), 1, M,
                                 self._mode).Instantiate()
    out = net.FPropDefaultTheta(tf.constant(self._x))
    return tf.gradients(tf.reduce_mean(out), tf.trainable_variables())

  def _Naive(self):
    """Same micro-batches without the pass-on chain: tf.gradients sums them with one AddN each."""
    net = layer_helpers.Plain(layer_helpers.DenseLayers(LAYERS, DIM)).Instantiate()
    outs = [net.FPropDefaultTheta(x) for x in tf.split(tf.constant(self._x), M)]
    return tf.gradients(tf.reduce_mean(tf.concat(outs, 0)), tf.trainable_variables())

  def testRunningSumHoldsFarFewerPartialGradients(self):
    for mode in ('always', 'never'):
      self._Check(mode)

  def _Check(self, mode):
    self._mode = mode
    self._x = np.random.RandomState(0).uniform(size=[BATCH, DIM]).astype(np.float32)
    naive, naive_grads = self._Peak(self._Naive)
    tensorpipe, grads = self._Peak(self._TensorPipe)
    for a, b in zip(grads, naive_grads):
      self.assertLess(np.linalg.norm(a - b) / np.linalg.norm(b), 1e-6)
    weight_bytes = DIM * DIM * 4
    # Both produce the fetched gradients (LAYERS weights); the rest is partial sums.
    floor = LAYERS * weight_bytes
    # >= M partial gradients of one weight at once.
    self.assertGreater(naive - floor, M * weight_bytes)
    self.assertLess(tensorpipe - floor, 0.5 * (naive - floor),
                    '%s: TensorPipe %d vs naive %d bytes' % (mode, tensorpipe, naive))


if __name__ == '__main__':
  test_utils.main()
