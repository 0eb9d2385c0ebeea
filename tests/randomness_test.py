"""randomness: masks are a function of (step, site, example, position), whatever micro-batches."""

import numpy as np
import tensorflow as tf2
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import randomness


class _Layer(base_layer.BaseLayer):
  pass


_MASK = np.uint64(0xFFFFFFFF)


def _Mix(h):
  """murmur3's 32-bit finaliser on uint64 values in [0, 2^32)."""
  h = h ^ (h >> np.uint64(16))
  h = (h * np.uint64(0x85EBCA6B)) & _MASK
  h = h ^ (h >> np.uint64(13))
  h = (h * np.uint64(0xC2B2AE35)) & _MASK
  return h ^ (h >> np.uint64(16))


def _Reference(shape, site, batch_dim, offset, step):
  """Uniform's values by the documented hash of (step, site, example, position), in numpy."""
  step = np.uint64(step)
  step_key = _Mix(_Mix(step & _MASK) ^ (step >> np.uint64(32)))
  key = _Mix(step_key ^ _Mix(np.uint64((site ^ 0x7F4A7C15) & 0xFFFFFFFF)))
  index = np.indices(shape)
  example = (index[batch_dim] + offset).astype(np.uint64)
  others = [d for a, d in enumerate(shape) if a != batch_dim]
  position = (np.ravel_multi_index([i for a, i in enumerate(index) if a != batch_dim], others)
              if others else np.zeros(shape, np.int64)).astype(np.uint64)
  golden = np.uint64(0x9E3779B1)
  per_example = _Mix((key + example * golden) & _MASK)
  h = _Mix((per_example + position * golden) & _MASK)
  return ((h >> np.uint64(8)).astype(np.float32) * np.float32(2.0**-24)).astype(np.float32)


class DropoutTest(test_utils.TestCase):

  def testMaskIsPerExampleWhateverTheMicroBatchesAndHasTheKeepRate(self):
    with self.session(graph=tf.Graph()) as sess:
      step = py_utils.GetOrCreateGlobalStepVar()
      x = tf.ones([8, 40, 50])
      full = randomness.Dropout(x, 0.8, 3)
      again = randomness.Dropout(x, 0.8, 3)
      split = {}
      for m in (2, 4):
        size = 8 // m
        parts = []
        for t in range(m):
          with randomness.ExampleOffset(t * size):
            parts.append(randomness.Dropout(x[t * size:(t + 1) * size], 0.8, 3))
        split[m] = tf.concat(parts, axis=0)
      with randomness.ExampleOffset(4), randomness.ExampleOffset(tf.constant(2)):
        nested = randomness.Dropout(x[6:], 0.8, 3)  # Offsets of nested contexts add up.
      other_site = randomness.Dropout(x, 0.8, 4)
      time_major = randomness.Dropout(tf.ones([40, 8, 50]), 0.8, 3, batch_dim=1)
      sess.run(tf.global_variables_initializer())
      sess.run(tf.assign(step, 7))
      y, again, split, nested, other_site, time_major = sess.run(
          [full, again, split, nested, other_site, time_major])
      sess.run(tf.assign(step, 8))
      next_step = sess.run(full)
    self.assertAllEqual(y, again)
    for m in (2, 4):
      self.assertAllEqual(y, split[m], msg='M=%d' % m)
    self.assertAllEqual(y[6:], nested)
    self.assertAllEqual(y, np.transpose(time_major, [1, 0, 2]))
    self.assertAllClose(np.mean(y == 0), 0.2, atol=0.01)
    self.assertAllClose(y[y != 0], np.full([np.sum(y != 0)], 1.25))
    for other in (other_site, next_step):
      self.assertAllClose(np.mean((y == 0) != (other == 0)), 2 * 0.2 * 0.8, atol=0.02)
    self.assertGreater(np.mean((y[0] == 0) != (y[1] == 0)), 0.2)  # Examples differ.

  def testDropPathDropsWholeExamplesAndRescales(self):
    with self.session(graph=tf.Graph()) as sess:
      x = tf.ones([64, 3, 3, 2])
      batch_major = randomness.DropPath(x, 0.5, 11)
      with randomness.ExampleOffset(32):
        second_half = randomness.DropPath(x[32:], 0.5, 11)
      time_major = randomness.DropPath(tf.transpose(x, [1, 0, 2, 3]), 0.5, 11, batch_dim=1)
      self.assertEqual(batch_major.shape.as_list(), [64, 3, 3, 2])
      out, second_half, time_major = sess.run([batch_major, second_half, time_major])
    per_example = out.reshape([64, -1])
    self.assertAllEqual(per_example.min(1), per_example.max(1))  # Whole examples kept or dropped.
    self.assertEqual(set(np.unique(per_example).tolist()), {0.0, 2.0})
    self.assertBetween(float((per_example[:, 0] == 0).mean()), 0.25, 0.75)
    self.assertAllEqual(out[32:], second_half)
    self.assertAllEqual(out, np.transpose(time_major, [1, 0, 2, 3]))

  def testDropPathMasksAreDropPathsBitForBit(self):
    sites = [11, 12, 99, 5]
    with self.session(graph=tf.Graph()) as sess:
      step = py_utils.GetOrCreateGlobalStepVar()
      x = tf.constant(np.random.RandomState(0).normal(size=[16, 3, 3, 2]), tf.float32)
      keep = 1.0 - 0.5 * tf.cast(step, tf.float32) / 10.0
      cases = []
      for offset, keep_prob in ((0, 0.6), (5, keep)):
        with randomness.ExampleOffset(offset):
          masks = randomness.DropPathMasks(16, 4, tf.float32, keep_prob, sites)
          cases.append(([randomness.Masked(x, m, keep_prob) for m in masks],
                        [randomness.DropPath(x, keep_prob, site) for site in sites]))
          # Time-major: the batch on axis 1.
          x_t = tf.transpose(x, [1, 0, 2, 3])
          masks = randomness.DropPathMasks(16, 4, tf.float32, keep_prob, sites, batch_dim=1)
          cases.append(([randomness.Masked(x_t, m, keep_prob) for m in masks],
                        [randomness.DropPath(x_t, keep_prob, site, 1) for site in sites]))

      @tf2.function(input_signature=[tf.TensorSpec([], tf.int64)], autograph=False)
      def Body(offset):  # In a function body, where the example terms are shared.
        with randomness.ExampleOffset(offset):
          masks = randomness.DropPathMasks(16, 4, tf.float32, 0.6, sites)
          return ([randomness.Masked(x, m, 0.6) for m in masks] +
                  [randomness.DropPath(x, 0.6, site) for site in sites])

      inside = Body.get_concrete_function()(tf.constant(7, tf.int64))
      cases.append((inside[:len(sites)], inside[len(sites):]))
      self.assertEqual(randomness.DropPathMasks(16, 4, tf.float32, 1.0, sites), [None] * 4)
      self.assertIs(randomness.Masked(x, None, 1.0), x)
      sess.run(tf.global_variables_initializer())
      sess.run(tf.assign(step, 3))
      cases = sess.run(cases)
    for together, alone in cases:
      for a, b in zip(together, alone):
        self.assertAllEqual(a, b)
    self.assertGreater(np.mean(cases[0][0][0] == 0), 0.1)  # Some examples dropped.

  def testSitesNameLayerAndUse(self):
    with tf.Graph().as_default():
      a, b = [_Layer.Params().Set(name=n).Instantiate() for n in ('a', 'b')]
      sites = [randomness.Site(a), randomness.Site(b), randomness.Site(a, 'ffn'),
               randomness.Site(a, 'attention')]
      self.assertLen(set(sites), 4)
      self.assertEqual(randomness.Site(a, 'ffn'), sites[2])

  def testKeepOneIsIdentity(self):
    x = tf.ones([2, 3])
    self.assertIs(randomness.Dropout(x, 1.0, 0), x)
    self.assertIs(randomness.DropPath(x, 1, 0), x)


class HashTest(test_utils.TestCase):
  """Uniform's values are the documented hash bit for bit, in the outer graph and in a function
  body (where the tensors that depend only on the shape and offset are shared)."""

  _CASES = [([4, 3, 5], 0, 29), ([3, 4, 2], 1, 7), ([6, 1, 1, 1], 0, 11), ([5], 0, 3),
            ([2, 6, 1], 1, 5)]  # (shape, batch axis, site)

  def _Uniforms(self):
    return [randomness.Uniform(shape, site, axis) for shape, axis, site in self._CASES]

  def _Check(self, values, offset, step):
    for value, (shape, axis, site) in zip(values, self._CASES):
      self.assertAllEqual(value, _Reference(shape, site, axis, offset, step),
                          msg='shape %s, batch axis %d, offset %d' % (shape, axis, offset))

  def testValuesAreTheHashOfStepSiteExampleAndPosition(self):
    step_value = 2**33 + 12345  # Both 32-bit halves of the step count.
    with self.session(graph=tf.Graph()) as sess:
      step = py_utils.GetOrCreateGlobalStepVar()
      outside = self._Uniforms()
      with randomness.ExampleOffset(3):
        moved = self._Uniforms()

      @tf2.function(input_signature=[tf.TensorSpec([], tf.int64)] * 2, autograph=False)
      def Body(step, offset):
        with py_utils.GlobalStepContext(step), randomness.ExampleOffset(offset):
          return self._Uniforms() + self._Uniforms()  # The second ones share the first's.

      inside = Body.get_concrete_function()(tf.cast(step, tf.int64), tf.constant(7, tf.int64))
      sess.run(tf.global_variables_initializer())
      sess.run(tf.assign(step, step_value))
      outside, moved, inside = sess.run([outside, moved, inside])
    self._Check(outside, 0, step_value)
    self._Check(moved, 3, step_value)
    self._Check(inside[:len(self._CASES)], 7, step_value)
    self._Check(inside[len(self._CASES):], 7, step_value)

  def testWithoutGlobalStepTheStepIsZero(self):
    with self.session(graph=tf.Graph()) as sess:
      self._Check(sess.run(self._Uniforms()), 0, 0)


class ScheduledKeepProbTest(test_utils.TestCase):

  def testGrowsWithDepthAndSteps(self):
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

  def testWithoutExampleAxisTheOffsetKeysTheWholeTensor(self):
    with self.session() as sess:
      shape = [6, 5]
      plain = randomness.Uniform(shape, 11, batch_dim=None)
      with randomness.ExampleOffset(4):
        moved = randomness.Uniform(shape, 11, batch_dim=None)
        dynamic = randomness.Uniform(tf.constant(shape), 11, batch_dim=None)
      plain, moved, dynamic = sess.run([plain, moved, dynamic])
    self.assertEqual(plain.shape, (6, 5))
    self.assertAllEqual(moved, dynamic)  # Static or dynamic shape: the same values.
    self.assertGreater(np.abs(plain - moved).max(), 0.1)  # Another offset, another draw.
    self.assertNear(plain.mean(), 0.5, 0.15)


class BadInputTest(test_utils.TestCase):

  def testBadKeepProb(self):
    x = tf.ones([2, 3])
    with self.assertRaisesRegex(ValueError, 'Dropout: keep_prob must be in \\(0, 1\\], got 1.5'):
      randomness.Dropout(x, 1.5, 0)
    with self.assertRaisesRegex(ValueError, "CellOp 'c': keep_prob must be in \\(0, 1\\], got 0"):
      randomness.DropPath(x, 0, 0, where="CellOp 'c'")
    with self.assertRaisesRegex(ValueError, 'ScheduledKeepProb: keep_prob must be in \\(0, 1\\], '
                                'got -0.5'):
      randomness.ScheduledKeepProb(-0.5, 0, 10, 0)
    with self.assertRaisesRegex(ValueError,
                                'layer_index must be in \\[0, num_layers=10\\), got 10'):
      randomness.ScheduledKeepProb(0.5, 10, 10, 0)

  def testBadOffsetSiteAndAxis(self):
    with self.assertRaisesRegex(ValueError,
                                'example offset must be a non-negative integer, got -1'):
      with randomness.ExampleOffset(-1):
        pass
    with self.assertRaisesRegex(ValueError, 'example offset must be a scalar integer tensor'):
      with randomness.ExampleOffset(tf.constant(1.0)):
        pass
    with self.assertRaisesRegex(ValueError, "site must be a Python int .*, got 'ffn'"):
      randomness.Dropout(tf.ones([2, 3]), 0.5, 'ffn')
    with self.assertRaisesRegex(ValueError, 'batch_dim must be an axis of a rank-2 shape, got 2'):
      randomness.Dropout(tf.ones([2, 3]), 0.5, 0, batch_dim=2)
    with self.assertRaisesRegex(ValueError, 'DropPath: batch_dim must be an axis of x '
                                '\\(rank 2\\), got -1'):
      randomness.DropPath(tf.ones([2, 3]), 0.5, 0, batch_dim=-1)


if __name__ == '__main__':
  tf.test.main()
