"""Stateless dropout and drop-path: masks depend only on (step, layer, micro-batch), and really drop."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import randomness


class _Layer(base_layer.BaseLayer):
  pass


class RandomnessTest(test_utils.TestCase):

  def _Masks(self, keep_prob=0.5):
    """Drop-path masks of [64, 3, 3, 2] ones for two layers x two micro-batches, drawn twice."""
    graph = tf.Graph()
    with graph.as_default():
      step = py_utils.GetOrCreateGlobalStepVar()
      layers = [_Layer.Params().Set(name=n).Instantiate() for n in ('a', 'b')]
      x = tf.ones([64, 3, 3, 2])
      outs = {}
      for draw in range(2):
        for layer in layers:
          for t in range(2):
            with randomness.MicroBatch(t):
              outs[(draw, layer.params.name, t)] = randomness.DropPath(
                  x, keep_prob, randomness.Seed(layer))
      with self.session(graph=graph) as sess:
        sess.run(tf.global_variables_initializer())
        first = sess.run(outs)
        sess.run(tf.assign_add(step, 1))
        second = sess.run(outs)
    return first, second

  def testSameMaskForSameLayerAndMicroBatchOnly(self):
    first, second = self._Masks()
    for key in [('a', 0), ('a', 1), ('b', 0), ('b', 1)]:
      self.assertAllEqual(first[(0,) + key], first[(1,) + key])  # Re-drawn: the same mask.
      self.assertNotAllEqual(first[(0,) + key], second[(0,) + key])  # Next step: a new mask.
    self.assertNotAllEqual(first[(0, 'a', 0)], first[(0, 'a', 1)])
    self.assertNotAllEqual(first[(0, 'a', 0)], first[(0, 'b', 0)])

  def testDropPathDropsWholeExamplesAndRescales(self):
    first, _ = self._Masks(keep_prob=0.5)
    out = first[(0, 'a', 0)]
    per_example = out.reshape([64, -1])
    self.assertAllEqual(per_example.min(1), per_example.max(1))  # Whole examples kept or dropped.
    self.assertEqual(set(np.unique(per_example).tolist()), {0.0, 2.0})
    self.assertBetween(float((per_example[:, 0] == 0).mean()), 0.25, 0.75)

  def testScheduledKeepProbGrowsWithDepthAndSteps(self):
    self.assertAllClose(randomness.ScheduledKeepProb(0.7, 9, 10, 0), 0.7)
    self.assertAllClose(randomness.ScheduledKeepProb(0.7, 4, 10, 0), 0.85)
    self.assertEqual(randomness.ScheduledKeepProb(1.0, 4, 10, 100), 1.0)
    with tf.Graph().as_default():
      step = py_utils.GetOrCreateGlobalStepVar()
      keep = randomness.ScheduledKeepProb(0.7, 9, 10, 100)
      with self.session() as sess:
        sess.run(tf.global_variables_initializer())
        self.assertAllClose(sess.run(keep), 1.0)
        sess.run(tf.assign(step, 50))
        self.assertAllClose(sess.run(keep), 0.85)
        sess.run(tf.assign(step, 500))
        self.assertAllClose(sess.run(keep), 0.7)

  def testBadKeepProb(self):
    with self.assertRaisesRegex(ValueError, 'Dropout: keep_prob must be in \\(0, 1\\], got 1.5'):
      randomness.Dropout(tf.ones([2]), 1.5, [0, 0])
    with self.assertRaisesRegex(ValueError, 'micro-batch index must be a non-negative integer'):
      with randomness.MicroBatch(-1):
        pass


if __name__ == '__main__':
  tf.test.main()
