"""Gradient accumulation: a running sum over micro-batches, not M partial weight gradients at once."""

import collections
import re

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import accumulation
from tests import helpers

DIM, LAYERS, BATCH, M = 1024, 4, 64, 8


class AccumulateTest(test_utils.TestCase):

  def testAccumulate(self):
    with self.session(graph=tf.Graph()):
      a, b = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
      self.assertIs(accumulation.Accumulate(None, b), b)
      self.assertIs(accumulation.Accumulate(a, None), a)
      total = accumulation.Accumulate(a, b)
      self.assertTrue(total.op.get_attr('_grappler_do_not_remove'))
      self.assertAllEqual(self.evaluate(total), [4.0, 6.0])
      own, rest = np.random.RandomState(0).normal(size=[2, 1000]).astype(np.float32) * [[1.0], [1e3]]
      self.assertAllEqual(self.evaluate(accumulation.Accumulate(tf.constant(own), tf.constant(rest))),
                          own + rest)  # bit for bit
      s1 = tf.IndexedSlices(tf.constant([[1.0]]), tf.constant([0]), tf.constant([2, 1]))
      s2 = tf.IndexedSlices(tf.constant([[2.0]]), tf.constant([0]), tf.constant([2, 1]))
      self.assertAllEqual(self.evaluate(tf.convert_to_tensor(accumulation.Accumulate(s1, s2))),
                          [[3.0], [0.0]])

  def testPassOnIsAnIdentityWithAKeptGradient(self):
    with self.session(graph=tf.Graph()):
      theta = py_utils.NestedMap(w=tf.constant([1.0, 2.0]))
      y = tf.constant([5.0])
      (gated_y, ids), passed = accumulation.PassOn(theta, (y, tf.constant([1])), '/device:CPU:0')
      loss = tf.reduce_sum(passed.w * 3.0) + tf.reduce_sum(gated_y * 2.0)
      grad_w, grad_y = tf.gradients(loss, [theta.w, y])
      values = self.evaluate([passed.w, gated_y, ids, grad_w, grad_y])
      for value, expected in zip(values, [[1.0, 2.0], [5.0], [1], [3.0, 3.0], [2.0]]):
        self.assertAllEqual(value, expected)
      kept = [op for op in tf.get_default_graph().get_operations()
              if op.type == 'Identity' and 'accumulate' in op.name]
      self.assertTrue(kept and kept[0].get_attr('_grappler_do_not_remove'))
      # The output's gradient is released only after theta's.
      self.assertIn(kept[0].inputs[0].op, grad_y.op.control_inputs)


class SumBufferTest(test_utils.TestCase):
  """Each weight's running gradient sum stays in one buffer over all micro-batches (no re-allocation)."""

  def testEverySumStaysInOneBuffer(self):
    params = helpers.Pipeline(helpers.DenseLayers(8, dim=256), 2, 4)
    for step_stats in helpers.TracedSgdSteps(params, 1024, 2):
      buffers = collections.defaultdict(set)  # (cell, op name suffix): the sum's buffer addresses
      for dev in step_stats.dev_stats:
        for n in dev.node_stats:
          match = re.search(r'/(cell\d)_mb\d/accumulate(_\d+)?$', n.node_name)
          if match and n.output:
            buffers[match.groups()].add(n.output[0].tensor_description.allocation_description.ptr)
      self.assertLen(buffers, 8)  # one running sum per weight
      for key, pointers in buffers.items():
        self.assertLen(pointers, 1, key)


class AccumulationMemoryTest(test_utils.TestCase):
  """Wide weights, small batch: partial weight gradients dominate memory."""

  def _Peak(self, build):
    with tf.Graph().as_default() as g, helpers.Cluster(1):
      grads = build()
      with helpers.Session(g, 1) as sess:
        sess.run(tf.global_variables_initializer())
        values = sess.run(grads)
        # Above what is allocated before the step: earlier tests in the process may hold memory.
        tf.config.experimental.reset_memory_stats('CPU:0')
        before = tf.config.experimental.get_memory_info('CPU:0')['current']
        sess.run(grads)
        return tf.config.experimental.get_memory_info('CPU:0')['peak'] - before, values

  def _TensorPipe(self):
    net = helpers.Pipeline(helpers.DenseLayers(LAYERS, DIM), 1, M, 'never').Instantiate()
    out = net.FPropDefaultTheta(tf.constant(self._x))
    return tf.gradients(tf.reduce_mean(out), tf.trainable_variables())

  def _Naive(self):
    """The same micro-batches without the pass-on chain: tf.gradients sums them with one AddN each."""
    net = helpers.Plain(helpers.DenseLayers(LAYERS, DIM)).Instantiate()
    outs = [net.FPropDefaultTheta(x) for x in tf.split(tf.constant(self._x), M)]
    return tf.gradients(tf.reduce_mean(tf.concat(outs, 0)), tf.trainable_variables())

  def testRunningSumHoldsFarFewerPartialGradients(self):
    self._x = np.random.RandomState(0).uniform(size=[BATCH, DIM]).astype(np.float32)
    naive, naive_grads = self._Peak(self._Naive)
    tensorpipe, grads = self._Peak(self._TensorPipe)
    for a, b in zip(grads, naive_grads):
      self.assertLess(np.linalg.norm(a - b) / np.linalg.norm(b), 1e-6)
    weight_bytes = DIM * DIM * 4
    # Both produce the fetched gradients (LAYERS weights); the rest is partial sums.
    floor = LAYERS * weight_bytes
    self.assertGreater(naive - floor, M * weight_bytes)  # >= M partial gradients of one weight at once.
    self.assertLess(tensorpipe - floor, 0.5 * (naive - floor),
                    'TensorPipe %d vs naive %d bytes' % (tensorpipe, naive))


if __name__ == '__main__':
  test_utils.main()
